"""R-Stitch's per-forward latency model (eq. 5), T(n_inf, n_kv) = a*n_inf*n_kv + b*n_inf^2 + c*n_inf + d
(attention over the cache, among the new tokens, per-token work, fixed overhead), fitted per runner
identity (`ModelRunner.identity`), optionally times `scale_by_inf` (measured / formula per profiled
n_inf, interpolated: CPU kernels are not smooth at small n_inf); trajectory estimates sum it over
the forwards `ForwardTrace` records. docs/rstitch-plus.md, "Latency model"."""
from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, cast

import numpy as np

from rstitch.engines import ModelPair, ModelRunner, Sequence, unnamed_profiles_engine
from rstitch.errors import ConfigError


def features(n_inf: Any, n_kv: Any) -> np.ndarray:
    """Design matrix [N, 4] (or [4] for scalars) of the latency formula."""
    n_inf = np.asarray(n_inf, dtype=np.float64)
    n_kv = np.asarray(n_kv, dtype=np.float64)
    return np.stack([n_inf * n_kv, n_inf**2, n_inf, np.ones_like(n_inf)], axis=-1)


def nonnegative_least_squares(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """argmin ||design @ x - target|| over x >= 0, exactly: the optimum is the plain least-squares
    solution on its own support (KKT), so every support of the 4 columns is tried (no scipy at run time)."""
    columns = design.shape[1]
    best, best_residual = np.zeros(columns), float(np.sum(target**2))
    for support in itertools.chain.from_iterable(itertools.combinations(range(columns), k) for k in range(1, columns + 1)):
        keep = list(support)
        solution, *_ = np.linalg.lstsq(design[:, keep], target, rcond=None)
        if np.any(solution < 0):
            continue
        coef = np.zeros(columns)
        coef[keep] = solution
        residual = float(np.sum((design @ coef - target) ** 2))
        if residual < best_residual:
            best, best_residual = coef, residual
    return best


def r_squared(predicted: np.ndarray, measured: np.ndarray) -> float:
    residual = float(np.sum((measured - predicted) ** 2))
    total = float(np.sum((measured - measured.mean()) ** 2))
    return 1.0 - residual / total if total > 0 else math.nan


@dataclass
class LatencyModel:
    """T = a*n_inf*n_kv + b*n_inf^2 + c*n_inf + d, in seconds, for one (engine, model, device, dtype)."""

    a: float
    b: float
    c: float
    d: float
    model: str = ""
    device: str = "cpu"
    dtype: str = "float32"
    r2: float = math.nan  # on the profiling points (plain, unweighted R^2)
    info: dict[str, Any] = field(default_factory=dict)  # fit diagnostics, profiling grid, ...
    scale_by_inf: dict[int, float] = field(default_factory=dict)  # measured / formula per n_inf; {} = formula
    engine: str = field(default_factory=unnamed_profiles_engine)  # files saved before engines were named

    def path_in(self, directory: str | Path) -> Path:
        """Where this model is stored under `directory` (see `latency_file`)."""
        return latency_file(directory, self.model, self.device, self.dtype, self.engine)

    @property
    def coefficients(self) -> np.ndarray:
        return np.array([self.a, self.b, self.c, self.d])

    @classmethod
    def fit(cls, n_inf: Iterable[int], n_kv: Iterable[int], seconds: Iterable[float],
            relative: bool = True, scale_by_inf: bool = False, **identity: Any) -> LatencyModel:
        """Nonnegative least squares (a negative cost extrapolates to negative times); `relative=True`
        weights each point by 1/T, so the millisecond decode steps count as much as long prefills."""
        n_inf, n_kv = np.asarray(list(n_inf)), np.asarray(list(n_kv))
        y = np.asarray(list(seconds), dtype=np.float64)
        weights = 1.0 / y if relative else np.ones_like(y)
        coef = nonnegative_least_squares(features(n_inf, n_kv) * weights[:, None], y * weights)
        a, b, c, d = map(float, coef)
        fitted = cls(a, b, c, d, **identity)
        if scale_by_inf:
            ratio = y / fitted.formula(n_inf, n_kv)
            # A new instance, not an assignment: the sorted scale table is cached on first predict.
            fitted = replace(fitted, scale_by_inf={int(k): float(np.median(ratio[n_inf == k])) for k in np.unique(n_inf)})
        fitted.r2 = r_squared(np.asarray(fitted.predict(n_inf, n_kv)), y)
        return fitted

    def formula(self, n_inf: Any, n_kv: Any) -> Any:
        """The paper's formula alone (no per-n_inf scale)."""
        return features(n_inf, n_kv) @ self.coefficients

    def predict(self, n_inf: Any, n_kv: Any) -> Any:
        """Seconds for forwards of `n_inf` new tokens over `n_kv` cached ones (scalars or arrays)."""
        out = self.formula(n_inf, n_kv)
        if self.scale_by_inf:
            out = out * np.interp(np.asarray(n_inf, dtype=np.float64), *self._scale_table)
        return float(out) if np.ndim(out) == 0 else out

    @cached_property
    def _scale_table(self) -> tuple[list[int], list[float]]:
        """`scale_by_inf` sorted once: the runner predicts every forward of every sample."""
        known = sorted(self.scale_by_inf)
        return known, [self.scale_by_inf[k] for k in known]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        formula = "T = (a*n_inf*n_kv + b*n_inf^2 + c*n_inf + d) * scale_by_inf[n_inf] (seconds; scale 1 when empty)"
        path.write_text(json.dumps({**asdict(self), "formula": formula}, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> LatencyModel:
        data = json.loads(Path(path).read_text())
        data.pop("formula", None)
        data["scale_by_inf"] = {int(k): float(v) for k, v in data.get("scale_by_inf", {}).items()}  # JSON keys are text
        return cls(**data)


def latency_file(directory: str | Path, model: str, device: str = "cpu", dtype: str = "float32",
                 engine: str | None = None) -> Path:
    """`<model>.<engine>.<device>.<dtype>.json`, so no engine reads another's profile; without the
    engine for the one whose profiles predate engine names (`unnamed_profiles_engine`, also None)."""
    parts = [model, device, dtype] if not engine or engine == unnamed_profiles_engine() else [model, engine, device, dtype]
    return Path(directory) / (".".join(parts) + ".json")


def runner_identity(runner: ModelRunner) -> tuple[str, str, str, str]:
    """`latency_file`'s arguments from `ModelRunner.identity`."""
    identity = runner.identity
    return identity.model, identity.device, identity.precision, identity.engine


# The forwards a run's estimates cover: a prompt's prefill over a long reasoning trace's cache.
USE_MAX_INF, USE_MAX_KV = 4096, 32768


def load_pair_latency(directory: str | Path, pair: ModelPair, max_inf: int = USE_MAX_INF,
                      max_kv: int = USE_MAX_KV) -> dict[str, LatencyModel] | None:
    """{"slm": ..., "llm": ...} of `pair`, each `check_positive`, or None if either was not profiled."""
    found = {}
    for key, runner in pair.models().items():
        path = latency_file(directory, *runner_identity(runner))
        if not path.is_file():
            return None
        found[key] = LatencyModel.load(path)
        check_positive(found[key], path, max_inf, max_kv)
    return found


def check_positive(model: LatencyModel, source: str | Path, max_inf: int = USE_MAX_INF, max_kv: int = USE_MAX_KV) -> None:
    """One error line unless `model` predicts a positive, finite time for every forward of 1..max_inf
    new tokens over 0..max_kv cached ones (a 4-point GPU fit gave -4.07 s). Linear in n_kv: both ends suffice."""
    n_inf = np.arange(1, max_inf + 1)
    for n_kv in (np.zeros_like(n_inf), np.full_like(n_inf, max_kv)):
        predicted = np.asarray(model.predict(n_inf, n_kv), dtype=np.float64)
        bad = np.flatnonzero(~(predicted > 0) | ~np.isfinite(predicted))
        if bad.size:
            i = int(bad[0])
            raise ConfigError(
                f"latency model {source} predicts {predicted[i]:.3g} s for a forward of {int(n_inf[i])} tokens over "
                f"{int(n_kv[i])} cached ones: not a positive time within the range it serves (up to {max_inf} new "
                f"over {max_kv} cached tokens); profile '{model.model}' ({model.device}, {model.dtype}) again over that "
                f"range: python scripts/profile_latency.py --max-inf {max_inf} --max-kv {max_kv} --out <latency_dir> "
                "(with the run's --pair/--device/--dtype), or set latency_dir=null")


@dataclass(frozen=True)
class ProfilePoint:
    n_inf: int
    n_kv: int
    seconds: float  # over repeats of the engine-measured forward time (min, median or mean)


PROFILE_STATISTICS: dict[str, Callable[..., Any]] = {"min": np.min, "median": np.median, "mean": np.mean}


def profile_runners(runners: Mapping[str, ModelRunner], n_inf_grid: Iterable[int], n_kv_grid: Iterable[int],
                    repeats: int = 3, seed: int = 0, statistic: str = "median",
                    clock: Callable[[], float] | None = None) -> dict[str, list[ProfilePoint]]:
    """Profile points of each runner, interleaved (each shape timed on every runner in turn), so a
    drift of the machine's speed falls on the pair alike and their ratio stays. Timed by the engine,
    or by `clock` (on a CPU `time.thread_time`, which leaves out the time other jobs hold the core);
    repeats reduced by `statistic` (docs/analysis.md, "Timings on a shared machine")."""
    if statistic not in PROFILE_STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(PROFILE_STATISTICS)}, not {statistic!r}")
    reduce = PROFILE_STATISTICS[statistic]
    rng = np.random.default_rng(seed)
    n_inf_grid, n_kv_grid = sorted(set(n_inf_grid)), sorted(set(n_kv_grid))
    times: dict[str, dict[tuple[int, int], list[float]]] = {key: {} for key in runners}
    for _ in range(repeats):
        for n_kv in rng.permutation(n_kv_grid):
            time_forwards(runners, int(n_kv), rng.permutation(n_inf_grid).tolist(), rng, times, clock)
    return {key: [ProfilePoint(n_inf, n_kv, float(reduce(t))) for (n_inf, n_kv), t in sorted(timed.items())]
            for key, timed in times.items()}


def time_forwards(runners: Mapping[str, ModelRunner], n_kv: int, n_inf_order: list[int], rng: np.random.Generator,
                  times: dict[str, dict[tuple[int, int], list[float]]], clock: Callable[[], float] | None = None) -> None:
    """One pass over an `n_kv`-token cache per runner: each `n_inf` appended, timed and rolled back."""
    sequences = {}
    for key, runner in runners.items():
        sequences[key] = runner.new_sequence(rng.integers(0, runner.vocab_size, n_kv).tolist())
        if n_kv:
            sequences[key].next_distribution()  # fill the cache; not timed
    for n_inf in n_inf_order:
        for key in rng.permutation(list(runners)):
            runner, seq = runners[key], sequences[key]
            seq.append(rng.integers(0, runner.vocab_size, n_inf).tolist())
            before, started = runner.cost.forward_time_s, clock() if clock else 0.0
            seq.next_distribution()
            took = clock() - started if clock else runner.cost.forward_time_s - before
            times[key].setdefault((n_inf, n_kv), []).append(took)
            seq.rollback(n_inf)


def fit_profile(points: list[ProfilePoint], runner: ModelRunner | None = None, relative: bool = True,
                scale_by_inf: bool = True, identity: tuple[str, ...] | None = None) -> LatencyModel:
    """Fit on profiled points, identified by the runner or by `identity` (model, device, dtype[, engine])."""
    if identity is None:
        if runner is None:
            raise ValueError("fit_profile needs a runner or an identity (model, device, dtype[, engine])")
        identity = runner_identity(runner)
    fitted = LatencyModel.fit([p.n_inf for p in points], [p.n_kv for p in points], [p.seconds for p in points], relative=relative,
                              scale_by_inf=scale_by_inf, **dict(zip(("model", "device", "dtype", "engine"), identity)))
    fitted.info["n_points"] = len(points)
    return fitted


@dataclass(frozen=True)
class Forward:
    model: str  # "slm" | "llm"
    n_inf: int  # tokens processed
    n_kv: int  # cache size before the forward
    seconds: float  # measured by the engine


def estimate_latency(forwards: Iterable[Forward], models: Mapping[str, LatencyModel]) -> float:
    """A trajectory's latency in seconds: the sum of the per-forward estimates."""
    by_model: dict[str, list[Forward]] = {}
    for f in forwards:
        by_model.setdefault(f.model, []).append(f)
    return sum((float(np.sum(models[key].predict([f.n_inf for f in group], [f.n_kv for f in group])))
                for key, group in by_model.items()), 0.0)


@dataclass
class ForwardTrace:
    """Logs (model, n_inf, n_kv, seconds) of every forward of the sequences opened through `wrap(pair)`."""

    forwards: list[Forward] = field(default_factory=list)

    def wrap(self, pair: ModelPair) -> ModelPair:
        # A _TracedRunner stands in for a ModelRunner: what it does not define is the wrapped runner's.
        return ModelPair(cast(ModelRunner, _TracedRunner(pair.slm, "slm", self)), cast(ModelRunner, _TracedRunner(pair.llm, "llm", self)))

    def watch(self, seq: Sequence, key: str) -> Sequence:
        process = seq._ensure_processed

        def traced(keep: int) -> None:
            cost = seq.runner.cost
            calls, tokens, seconds = cost.forward_calls, cost.tokens_processed, cost.forward_time_s
            process(keep)
            if cost.forward_calls > calls:
                n_inf = cost.tokens_processed - tokens
                self.forwards.append(Forward(key, n_inf, seq.n_cached - n_inf, cost.forward_time_s - seconds))

        seq._ensure_processed = traced  # type: ignore[method-assign]  # this one sequence's step, wrapped on purpose
        return seq


class _TracedRunner:
    """The wrapped runner, except that the sequences it opens are watched by the trace."""

    def __init__(self, runner: ModelRunner, key: str, trace: ForwardTrace):
        self._runner, self._key, self._trace = runner, key, trace

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def new_sequence(self, prompt_ids, want_hidden: bool = False) -> Sequence:
        return self._trace.watch(self._runner.new_sequence(prompt_ids, want_hidden), self._key)
