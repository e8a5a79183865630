"""The narrow engine interface every decoding method is written against (docs/architecture.md,
docs/adding-an-engine.md): a `ModelRunner` per model, a `Sequence` per model and sample whose tokens
are appended lazily and processed by the next call that needs a distribution (partial prefill);
backends implement only `ModelRunner.new_sequence`, `Sequence._forward` and `Sequence._crop`.
"""
from __future__ import annotations

import importlib.util
import math
import os
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import torch

from rstitch.engines.sampling import Sampler
from rstitch.errors import ConfigError

# The one table of floating-point weight types every engine, PRM and router accepts.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def torch_dtype(dtype: str, owner: str = "") -> torch.dtype:
    """The torch dtype of a config's `dtype` name; one error line for any other name."""
    if dtype not in DTYPES:
        what = f"{owner} dtype" if owner else "dtype"
        raise ConfigError(f"unknown {what} '{dtype}'; valid: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def default_torch_threads(device: str, largest_model_parameters: int, cpus: int, torch_default: int) -> int:
    """Threads for `num_threads: null`: one on a GPU (the CPU only launches kernels) and when the larger
    model is under 100M parameters (at batch 1 its matmuls are too small to share, and every extra thread
    contends with the rest of the machine: the testbed, 1.8M, measured fastest on one); else torch's
    default, capped at the CPUs this process may use."""
    if not device.startswith("cpu") or largest_model_parameters < 100_000_000:
        return 1
    return max(1, min(torch_default, cpus))


@dataclass(frozen=True)
class EngineIdentity:
    """What a runner is, for everything keyed by it (latency profiles); `precision` is a dtype or a
    weight format (`gguf-Q4_K_Medium`)."""

    engine: str
    model: str
    device: str
    precision: str


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do beyond the interface every engine has."""

    hidden_states: bool = True  # `want_hidden` sequences return the last hidden state
    batched_forward: bool = False  # `forward_batch` runs many sequences in one call (else one by one)
    exact_distributions: bool = True  # logits over the full vocabulary: exact entropy and any token's probability

    DESCRIPTIONS: ClassVar[dict[str, str]] = {
        "hidden_states": "give hidden states",
        "batched_forward": "run several sequences in one forward",
        "exact_distributions": "give exact full-vocabulary distributions",
    }


@dataclass(frozen=True)
class ConformanceEntry:
    """How the engine contract (tests/engines/test_engine_conformance.py) loads this engine on the testbed."""

    id: str
    options: Mapping[str, Any] = field(default_factory=dict)
    path: str | None = None  # None: the testbed's LLM checkpoint
    needs: tuple[str, ...] = ()  # packages it skips without (an optional backend: the slow tier)
    reference: bool = True  # entropies against transformers on the testbed LLM (same weights); else its own logits
    atol: float = 1e-4  # logits: incremental forwards against a fresh one, batched against alone
    max_kl: float | None = None  # instead of `atol`: KL(fresh || other) of the two distributions, in nats


def require(runner: ModelRunner, capability: str, user: str) -> None:
    """The one check of a capability: a one-line `ConfigError` when `runner` lacks it."""
    if not getattr(runner.capabilities, capability):
        what = Capabilities.DESCRIPTIONS[capability]
        raise ConfigError(f"engine '{runner.identity.engine}' cannot {what} (model '{runner.name}'), which {user} needs")


# The batched sample the scheduler runs now (engines/batching.py sets it): kept here, below
# batching, so that the interface never imports the scheduler.
_CURRENT_TASK: list[Any] = [None]


def current_task() -> Any:
    """The batched sample being decoded (a `batching.Task`), or None (batch size 1, or outside a run)."""
    return _CURRENT_TASK[0]


@dataclass
class CostCounter:
    """What one model spent: a prefill token is one processed in a multi-token forward."""

    prefill_tokens: int = 0
    decode_steps: int = 0
    forward_calls: int = 0
    forward_time_s: float = 0.0
    # (tokens processed, cache size before) of each forward since the last clear: the inputs of
    # the fitted latency model (rstitch/latency/model.py). The runner clears it per sample.
    forward_shapes: list[tuple[int, int]] = field(default_factory=list, repr=False)
    SCALARS: ClassVar[tuple[str, ...]] = ("prefill_tokens", "decode_steps", "forward_calls", "forward_time_s")

    def __post_init__(self) -> None:
        _LIVE_COUNTERS[id(self)] = self  # batched runs give each sample its own view (engines/batching.py)

    def add_forward(self, n_tokens: int, seconds: float, n_kv: int = 0) -> None:
        self.forward_calls += 1
        self.forward_time_s += seconds
        self.forward_shapes.append((n_tokens, n_kv))
        if n_tokens == 1:
            self.decode_steps += 1
        else:
            self.prefill_tokens += n_tokens

    @property
    def tokens_processed(self) -> int:
        return self.prefill_tokens + self.decode_steps

    def copy(self) -> CostCounter:
        return _snapshot(CostCounter(*(getattr(self, k) for k in self.SCALARS)))

    def since(self, earlier: CostCounter) -> CostCounter:
        return _snapshot(CostCounter(*(getattr(self, k) - getattr(earlier, k) for k in self.SCALARS)))

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.SCALARS}


# The counters that book work (a model's, a PRM's, a router's); snapshots (`copy`, `since`) are not.
_LIVE_COUNTERS: weakref.WeakValueDictionary[int, CostCounter] = weakref.WeakValueDictionary()


def _snapshot(counter: CostCounter) -> CostCounter:
    _LIVE_COUNTERS.pop(id(counter), None)
    return counter


def live_counters() -> list[CostCounter]:
    return list(_LIVE_COUNTERS.values())


@dataclass
class TokenDistribution:
    """The next-token distribution at one position (logits over the shared tokenizer vocabulary)."""

    logits: torch.Tensor  # [V] float32, up to an additive constant (an engine may give log-probabilities)
    hidden: torch.Tensor | None = None  # last hidden state [H], when the sequence asked for it

    @cached_property
    def log_probs(self) -> torch.Tensor:
        return torch.log_softmax(self.logits, dim=-1)

    @cached_property
    def probs(self) -> torch.Tensor:
        return self.log_probs.exp()

    @cached_property
    def entropy(self) -> float:
        """Shannon entropy in nats."""
        lp = self.log_probs
        return float(-(lp.exp() * lp).nan_to_num().sum())

    @property
    def normalized_entropy(self) -> float:
        """H / log V, in [0, 1] (R-Stitch's uncertainty score)."""
        return self.entropy / math.log(self.logits.shape[-1])

    @cached_property
    def argmax(self) -> int:
        return int(self.logits.argmax())

    def topk(self, k: int) -> tuple[list[int], list[float]]:
        values, ids = self.probs.topk(k)
        return ids.tolist(), values.tolist()


@dataclass
class Generation:
    token_ids: list[int]
    finish_reason: str  # "eos" | "stop" | "length" | "switch" (a `SwitchRule` ended the run)
    dropped: bool = False  # "switch" without keeping the crossing token: its position is left to the caller


@dataclass(frozen=True)
class SwitchRule:
    """How long one model keeps writing in a token-level hybrid: while each token's normalized entropy
    stays on one side of `tau`; the first on the other side is kept as the run's last (`keep_last`) or
    dropped, its position left to the other model. Declarative, so an engine can evaluate it in its
    own decode loop (vLLM: a logits processor). tau = inf with `stop_above` never ends."""

    tau: float
    stop_above: bool  # True: end at the first H > tau (R-Stitch's SLM); False: at the first H <= tau (its LLM)
    keep_last: bool

    @classmethod
    def never(cls) -> SwitchRule:
        return cls(math.inf, stop_above=True, keep_last=True)

    @property
    def ends(self) -> bool:
        """Whether any token can end the run."""
        return not (self.stop_above and self.tau == math.inf)

    def crosses(self, normalized_entropy: float) -> bool:
        return normalized_entropy > self.tau if self.stop_above else normalized_entropy <= self.tau


class Sequence(ABC):
    """One model's view of one sample: tokens, KV cache, and the logits of the last forward."""

    def __init__(self, runner: ModelRunner, prompt_ids: Seq[int], want_hidden: bool = False):
        if want_hidden:
            require(runner, "hidden_states", "a sequence with want_hidden (R-Stitch+'s router, a PRM's own head)")
        self.runner = runner
        self.tokens: list[int] = list(prompt_ids)
        self.want_hidden = want_hidden
        self.n_cached = 0  # tokens whose K/V are in the cache
        # The last forward's logits (and hidden states) of [window_start, n_cached): rollback inside is free.
        self._window_start = 0
        self._window_logits: torch.Tensor | None = None
        self._window_hidden: torch.Tensor | None = None

    @abstractmethod
    def _forward(self, new_ids: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run `new_ids` after the cached tokens; logits [keep, V] (and hidden [keep, H]) of the last `keep`."""

    @abstractmethod
    def _crop(self, n_keep: int) -> None:
        """Keep only the first `n_keep` cached positions."""

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_pending(self) -> int:
        return len(self.tokens) - self.n_cached

    def append(self, token_ids: Seq[int] | int) -> None:
        """Add tokens; they are processed by the next call that needs a distribution."""
        self.tokens.extend([token_ids] if isinstance(token_ids, int) else token_ids)

    def rollback(self, n: int) -> None:
        """Drop the last `n` tokens (cached or pending)."""
        if n < 0 or n > len(self.tokens):
            raise ValueError(f"cannot roll back {n} of {len(self.tokens)} tokens")
        del self.tokens[len(self.tokens) - n:]
        if self.n_cached > len(self.tokens):
            self._crop(len(self.tokens))
            self.n_cached = len(self.tokens)

    def next_distribution(self) -> TokenDistribution:
        """The distribution of the token after the current last token."""
        return self.score([])[0]

    def score(self, continuation: Seq[int]) -> list[TokenDistribution]:
        """Append `continuation`; the distributions predicting each of its tokens and the next, in one forward."""
        self.append(list(continuation))
        keep = len(continuation) + 1
        self._ensure_processed(keep)
        return [self._dist_at(len(self.tokens) - keep + i) for i in range(keep)]

    def generate(
        self,
        max_new_tokens: int,
        sampler: Sampler,
        stop: Seq[str] = (),
        eos_ids: Collection[int] | None = None,
    ) -> Generation:
        """Sample until EOS, a stop string in the generated text, or `max_new_tokens`."""
        return self.decode_until(max_new_tokens, sampler, SwitchRule.never(), stop, eos_ids)

    def decode_until(
        self,
        max_new_tokens: int,
        sampler: Sampler,
        rule: SwitchRule,
        stop: Seq[str] = (),
        eos_ids: Collection[int] | None = None,
    ) -> Generation:
        """Sample (and append) until EOS, a stop string, `max_new_tokens`, or a token crossing `rule`;
        the reference every backend's override reproduces (tokens and cost books)."""
        eos = set(self.runner.eos_token_ids if eos_ids is None else eos_ids)
        watcher = StopWatcher(self.runner.tokenizer, stop)
        out: list[int] = []
        while len(out) < max_new_tokens:
            dist = self.next_distribution()
            crossed = rule.ends and rule.crosses(dist.normalized_entropy)
            if crossed and not rule.keep_last:
                return Generation(out, "switch", dropped=True)
            token = sampler.sample(dist)
            self.append(token)
            out.append(token)
            if token in eos:
                return Generation(out, "eos")
            if watcher.hit(token):
                return Generation(out, "stop")
            if crossed:
                return Generation(out, "switch")
        return Generation(out, "length")

    def _ensure_processed(self, keep: int) -> None:
        """Make logits available for the last `keep` positions."""
        if self.n_pending == 0 and self._window_covers(len(self.tokens) - keep):
            return
        if self.n_pending < keep:
            # Re-run the positions whose logits were not kept (a rollback outside the window).
            back = min(keep, len(self.tokens)) - self.n_pending
            self._crop(self.n_cached - back)
            self.n_cached -= back
        new_ids = self.tokens[self.n_cached:]
        logits, hidden, seconds = self.runner.run_forward(self, new_ids, keep)
        self.runner.cost.add_forward(len(new_ids), seconds, self.n_cached)
        self.n_cached = len(self.tokens)
        self._window_start = self.n_cached - keep
        self._window_logits, self._window_hidden = logits, hidden

    def _window_covers(self, position: int) -> bool:
        return (self._window_logits is not None
                and self._window_start <= position < min(self._window_start + self._window_logits.shape[0], self.n_cached))

    def _dist_at(self, position: int) -> TokenDistribution:
        """The distribution computed at token index `position`: it predicts token position+1."""
        assert self._window_logits is not None, "_ensure_processed fills the window before distributions are read"
        row = position - self._window_start
        hidden = None if self._window_hidden is None else self._window_hidden[row]
        return TokenDistribution(self._window_logits[row], hidden)


@dataclass
class ForwardRequest:
    """One sequence's forward, waiting to run in a batch with other sequences' of one model."""

    runner: ModelRunner
    seq: Sequence
    new_ids: list[int]
    keep: int


class StopWatcher:
    """Detects a stop string in generated text by decoding only a short tail of tokens."""

    def __init__(self, tokenizer: Any, stop: Seq[str]):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.tail_ids: list[int] = []
        self.horizon = max((len(s) for s in self.stop), default=0) + 4

    def hit(self, token: int) -> bool:
        """Whether the text generated since this watcher started contains a stop string (the first ends it)."""
        if not self.stop:
            return False
        self.tail_ids.append(token)
        del self.tail_ids[: -self.horizon]
        tail = self.tokenizer.decode(self.tail_ids)
        return any(s in tail for s in self.stop)


def looks_like_path(path: str) -> bool:
    """Not a hub id ("name" or "owner/name"): absolute, relative with ./ ../ ~, or nested deeper."""
    return (os.path.isabs(path) or path.startswith(("./", "../", "~", ".")) or path.endswith("/")
            or path.count("/") > 1 or "\\" in path)


def resolve_model_path(path: str, kind: str = "hf") -> str:
    """What to load: an existing directory, a packaged model's checkpoint (`kind` "hf") or GGUF file, or
    a hub id; a path-like string that does not exist is one error line, not minutes of hub retries."""
    from rstitch.engines import packaged

    if packaged.is_packaged(path):
        packaged.check(path)
        return packaged.resolve(path, kind)
    expanded = os.path.expanduser(path)
    if os.path.isdir(expanded) or (kind == "gguf" and os.path.isfile(expanded)):
        return expanded
    if looks_like_path(path):
        raise ConfigError(f"model path not found: {path}")
    return path


class ModelRunner(ABC):
    """One loaded model: its tokenizer, size, cost counters and a factory of sequences. The class-level
    declarations and hooks are docs/adding-an-engine.md's table."""

    name: str
    tokenizer: Any
    vocab_size: int  # size of the shared tokenizer vocabulary (logits are cut to it)
    num_parameters: int
    hidden_size: int
    eos_token_ids: list[int]
    identity: EngineIdentity
    capabilities: Capabilities = Capabilities()
    # False: forwards run at once, in the sample's own time, even in a batched run (a scorer's: engines.load_scoring_model).
    joins_batches: bool = True
    # What the engine is before any model loads, asked of the registered class (engines.engine_class).
    backend: ClassVar[tuple[str, str] | None] = None  # an optional backend: (package to import, how to install it)
    checkpoint_heads: ClassVar[bool] = False  # loads a checkpoint's own head (`auto_class`, remote code): PRMs, routers
    unnamed_profiles: ClassVar[bool] = False  # latency profiles saved before engines were named are this engine's
    conformance: ClassVar[tuple[ConformanceEntry, ...]] = ()  # the engine contract's entries: every engine declares one

    def __init__(self) -> None:
        self.cost = CostCounter()

    @classmethod
    def check_installed(cls, engine: str) -> None:
        """One line before any model loads, instead of an ImportError halfway through."""
        if cls.backend is not None and importlib.util.find_spec(cls.backend[0]) is None:
            package, install = cls.backend
            raise ConfigError(f"engine '{engine}' needs the '{package}' package, which is not installed: {install}")

    @classmethod  # noqa: B027 (an optional hook)
    def check_device(cls, pair_cfg: Mapping[str, Any]) -> None:
        """One line, before any model loads, when the pair's device cannot run here."""

    @staticmethod  # noqa: B027 (an optional hook)
    def check_memory(pair_cfg: dict[str, Any], engine_cfg: dict[str, Any], batch_size: int,
                     longest_prompt: Callable[[Any], int], max_new_tokens: int) -> None:
        """One line, before the pair loads, when it and `batch_size` of the run's longest samples cannot fit."""

    @classmethod
    def default_threads(cls, options: Mapping[str, Any], device: str, largest_model_parameters: int,
                        cpus: int) -> int | None:
        """The torch threads a run sets once its pair is loaded, or None to leave them."""
        return None

    @classmethod
    def scoring_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The options a model outside the pair (a PRM, a judge, a router) loads with (default: as given)."""
        return options

    @classmethod
    def decode_path_key(cls, options: Mapping[str, Any], device: str) -> str | None:
        """The decode path a run key records when `options` select another than the eager one, or None."""
        return None

    @abstractmethod
    def new_sequence(self, prompt_ids: Seq[int], want_hidden: bool = False) -> Sequence:
        """Open a sequence; nothing runs until a distribution is asked for."""

    def run_forward(self, seq: Sequence, new_ids: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """`seq._forward` and its wall time; in a batched run it waits for this model's next batched forward."""
        (logits, hidden), seconds = self.run_request(ForwardRequest(self, seq, new_ids, keep))
        return logits, hidden, seconds

    def run_request(self, request: Any) -> tuple[Any, float]:
        """A forward (run alone as `seq._forward`) or a backend's own kind of request (vLLM's run of tokens)
        and its wall time; in a batched run it waits for this model's next batched round."""
        task = current_task() if self.joins_batches else None
        if task is not None:
            return task.submit(request)
        start = time.perf_counter()
        if isinstance(request, ForwardRequest):
            output = request.seq._forward(request.new_ids, request.keep)
        else:
            [output] = self.forward_batch([request])
        return output, self.elapsed_since(start)

    def forward_batch(self, requests: list[ForwardRequest]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Several sequences' forwards (or a backend's own requests), one by one (an override batches them, rows equal up to rounding)."""
        return [r.seq._forward(r.new_ids, r.keep) for r in requests]

    def prepare_shapes(self, batch_size: int, shortest: int, longest: int) -> None:  # noqa: B027 (optional hook)
        """Before a run's first timed sample: prepare a step per shape (CUDA graphs), if the backend has them."""

    def elapsed_since(self, start: float) -> float:
        """Wall time since `start`; GPU backends synchronize first."""
        return time.perf_counter() - start

    def synchronize(self) -> None:  # noqa: B027 (an optional hook: only GPU backends override it)
        """Wait for queued device work (no-op on CPU)."""
