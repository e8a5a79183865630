import math

import numpy as np
import pytest

from rstitch.engines import ModelPair
from rstitch.latency.model import (
    Forward,
    ForwardTrace,
    LatencyModel,
    estimate_latency,
    fit_profile,
    latency_file,
    load_pair_latency,
    profile_runners,
    r_squared,
)

TRUE = dict(a=2e-7, b=5e-6, c=3e-4, d=4e-3)


def synthetic_points(noise: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    n_inf, n_kv = np.meshgrid([1, 2, 4, 8, 16, 64, 128], [0, 32, 128, 512, 1024])
    n_inf, n_kv = n_inf.ravel(), n_kv.ravel()
    seconds = LatencyModel(**TRUE).predict(n_inf, n_kv) * (1 + noise * rng.standard_normal(n_inf.shape))
    return n_inf, n_kv, seconds


@pytest.mark.parametrize("relative", [True, False])
def test_fit_recovers_known_coefficients(relative):
    n_inf, n_kv, seconds = synthetic_points()
    fitted = LatencyModel.fit(n_inf, n_kv, seconds, relative=relative)
    np.testing.assert_allclose(fitted.coefficients, [TRUE[k] for k in "abcd"], rtol=1e-6)
    assert fitted.r2 == pytest.approx(1.0)


def test_noisy_fit_has_r2_below_one_and_predicts_scalars_and_arrays():
    n_inf, n_kv, seconds = synthetic_points(noise=0.05)
    fitted = LatencyModel.fit(n_inf, n_kv, seconds)
    assert 0.9 < fitted.r2 < 1.0
    one = fitted.predict(1, 300)
    assert isinstance(one, float)
    assert one == pytest.approx(fitted.a * 300 + fitted.b + fitted.c + fitted.d)
    assert fitted.predict([1, 8], [300, 40]).shape == (2,)
    # A constant model explains nothing of the variance.
    mean_only = LatencyModel(0, 0, 0, float(np.mean(seconds))).predict(n_inf, n_kv)
    assert r_squared(np.asarray(mean_only), np.asarray(seconds, dtype=np.float64)) == pytest.approx(0.0, abs=1e-9)


def kinked_points():
    """The formula times a per-n_inf factor, as CPU kernels give at small n_inf (real pair: a 2-token
    forward costs twice a decode step, a 4-token one less than a 3-token one)."""
    n_inf, n_kv, seconds = synthetic_points()
    kink = {1: 0.6, 2: 1.3, 4: 0.9}
    return n_inf, n_kv, seconds * np.array([kink.get(int(k), 1.0) for k in n_inf])


def test_scale_by_inf_follows_what_the_formula_cannot():
    n_inf, n_kv, seconds = kinked_points()
    plain = LatencyModel.fit(n_inf, n_kv, seconds)
    scaled = LatencyModel.fit(n_inf, n_kv, seconds, scale_by_inf=True)
    decode = n_inf == 1
    plain_err = np.abs(plain.predict(n_inf, n_kv) - seconds) / seconds
    scaled_err = np.abs(scaled.predict(n_inf, n_kv) - seconds) / seconds
    assert plain_err[decode].mean() > 0.1  # the smooth formula misses the decode steps
    assert scaled_err.max() < 0.05 and scaled_err.mean() < plain_err.mean() / 3 and scaled.r2 > plain.r2
    assert scaled.coefficients.tolist() == plain.coefficients.tolist()  # the formula's fit is unchanged
    assert sorted(scaled.scale_by_inf) == [1, 2, 4, 8, 16, 64, 128]
    # Between profiled n_inf the scale is interpolated; beyond them it is the end value.
    s = scaled.scale_by_inf
    assert scaled.predict(3, 32) == pytest.approx(scaled.formula(3, 32) * (s[2] + s[4]) / 2)
    assert scaled.predict(500, 32) == pytest.approx(scaled.formula(500, 32) * s[128])
    assert scaled.predict([1, 3], [0, 0]).shape == (2,)


def test_scaled_model_round_trips_with_integer_keys(tmp_path):
    n_inf, n_kv, seconds = kinked_points()
    model = LatencyModel.fit(n_inf, n_kv, seconds, scale_by_inf=True, model="m")
    loaded = LatencyModel.load(model.save(latency_file(tmp_path, "m")))
    assert loaded == model and all(isinstance(k, int) for k in loaded.scale_by_inf)
    assert loaded.predict(2, 100) == model.predict(2, 100)


def test_save_load_round_trip(tmp_path):
    model = LatencyModel(**TRUE, model="m", device="cpu", dtype="float32", r2=0.97, info={"n_points": 3})
    path = model.save(latency_file(tmp_path, "m"))
    assert path.name == "m.cpu.float32.json"
    assert LatencyModel.load(path) == model


def test_trajectory_estimate_sums_forwards_per_model():
    models = {"slm": LatencyModel(0, 0, 1e-3, 1e-2), "llm": LatencyModel(1e-6, 0, 5e-3, 2e-2)}
    forwards = [Forward("slm", 20, 0, 0.0), Forward("slm", 1, 20, 0.0), Forward("llm", 21, 0, 0.0)]
    expected = (20e-3 + 1e-2) + (1e-3 + 1e-2) + (21 * 5e-3 + 2e-2)
    assert estimate_latency(forwards, models) == pytest.approx(expected)


def test_trace_logs_tokens_processed_and_cache_size(tiny_runners):
    trace = ForwardTrace()
    pair = trace.wrap(tiny_runners)
    seq = pair.llm.new_sequence(list(range(5, 15)))
    seq.next_distribution()
    seq.append([20, 21, 22])
    seq.next_distribution()
    seq.append(23)
    seq.next_distribution()
    seq.next_distribution()  # nothing new: no forward
    seq.rollback(3)  # outside the kept window: the last kept token is run again
    seq.next_distribution()
    small = pair.slm.new_sequence([5, 6])
    small.score([7, 8])
    got = [(f.model, f.n_inf, f.n_kv) for f in trace.forwards]
    assert got == [("llm", 10, 0), ("llm", 3, 10), ("llm", 1, 13), ("llm", 1, 10), ("slm", 4, 0)]
    assert all(f.seconds > 0 for f in trace.forwards)
    assert pair.llm.hidden_size == tiny_runners.llm.hidden_size  # everything else is the runner's


def test_profile_and_fit_on_a_real_model(tiny_runners, tmp_path):
    llm = tiny_runners.llm
    calls = llm.cost.forward_calls
    points = profile_runners({"llm": llm}, [1, 4, 16], [0, 8, 64], repeats=2)["llm"]
    assert [(p.n_inf, p.n_kv) for p in points] == [(i, k) for i in (1, 4, 16) for k in (0, 8, 64)]
    # 2 repeats x (9 timed forwards + 2 untimed cache fills for n_kv > 0)
    assert llm.cost.forward_calls - calls == 2 * (9 + 2)
    fitted = fit_profile(points, llm)
    assert (fitted.model, fitted.device, fitted.dtype) == ("llm", "cpu", "float32")
    assert math.isfinite(fitted.r2) and fitted.predict(16, 64) > 0
    fitted.save(latency_file(tmp_path, *("llm", "cpu", "float32")))
    assert load_pair_latency(tmp_path, tiny_runners) is None  # the SLM was not profiled
    fit_profile(profile_runners({"slm": tiny_runners.slm}, [1, 4], [0, 8], repeats=1)["slm"], tiny_runners.slm).save(latency_file(tmp_path, "slm"))
    # checked for positive times over the profiled range (a 4-point fit extrapolates far beyond it)
    assert set(load_pair_latency(tmp_path, ModelPair(tiny_runners.slm, llm), max_inf=4, max_kv=8)) == {"slm", "llm"}


def test_profile_script_refits_saved_points_with_the_scale(tmp_path):
    from conftest import run_script

    n_inf, n_kv, seconds = kinked_points()
    formula_only = LatencyModel.fit(n_inf, n_kv, seconds, model="m")
    formula_only.info["points"] = [[int(i), int(k), float(s)] for i, k, s in zip(n_inf, n_kv, seconds)]
    path = formula_only.save(latency_file(tmp_path, "m"))
    out = run_script("profile_latency", "--refit", "--out", str(tmp_path)).stdout
    refit = LatencyModel.load(path)
    assert "refit (m)" in out and refit.scale_by_inf == LatencyModel.fit(n_inf, n_kv, seconds, scale_by_inf=True).scale_by_inf
    assert refit.info["mean_abs_rel_error_decode"] < refit.info["formula_mean_abs_rel_error_decode"] / 3
    assert refit.info["points"] == formula_only.info["points"]  # kept for the next refit


def test_each_engine_stores_and_finds_its_profiles_under_its_own_identity(tmp_path):
    """A vLLM runner's profiles are its own: saved under its identity, found by a vLLM pair, never
    the HF engine's file of the same model, device and dtype (nor the other way round)."""
    from types import SimpleNamespace

    from rstitch.engines import EngineIdentity, ModelPair
    from rstitch.engines.vllm import vllm_identity  # vLLM itself is imported only when a model loads
    from rstitch.latency.model import ProfilePoint, load_pair_latency, runner_identity

    def pair(engine: str):
        def stand_in(name):
            return SimpleNamespace(name=name, identity=EngineIdentity(engine, name, "cuda", "bfloat16"))
        return ModelPair(stand_in("slm"), stand_in("llm"))

    vllm_config = SimpleNamespace(device_config=SimpleNamespace(device_type="cuda"))
    assert vllm_identity("llm", vllm_config, "bfloat16") == pair("vllm").llm.identity
    points = [ProfilePoint(n, kv, 1e-3 * n + 1e-6 * n * kv + 2e-4) for n in (1, 4, 16) for kv in (0, 64, 256)]
    for runner in pair("vllm").models().values():
        fitted = fit_profile(points, runner, scale_by_inf=False)
        assert fitted.engine == "vllm" and fitted.path_in(tmp_path).name == f"{runner.name}.vllm.cuda.bfloat16.json"
        fitted.save(fitted.path_in(tmp_path))
    assert load_pair_latency(tmp_path, pair("hf")) is None  # the HF engine's files are not there
    found = load_pair_latency(tmp_path, pair("vllm"))
    assert found is not None and {m.engine for m in found.values()} == {"vllm"}
    hf = fit_profile(points, pair("hf").llm, scale_by_inf=False)
    assert hf.path_in(tmp_path).name == "llm.cuda.bfloat16.json"  # the names HF profiles always had
    assert latency_file(tmp_path, *runner_identity(pair("hf").slm)).name == "slm.cuda.bfloat16.json"
    # A refit keeps the engine (identity given as saved: model, device, dtype, engine).
    assert fit_profile(points, identity=("llm", "cuda", "bfloat16", "vllm")).engine == "vllm"
    assert LatencyModel.load(found["llm"].path_in(tmp_path)).engine == "vllm"


def test_the_fit_keeps_every_cost_nonnegative_as_scipy_nnls_does():
    """A grid too small to pin the n_inf^2 term fitted it below zero (a min-of-repeats profile of the
    testbed's LLM: a negative time for a 2183-token prefill, refused by `check_positive`); each term is a
    cost, so the fit is nonnegative least squares, exactly scipy's."""
    from scipy.optimize import nnls

    from rstitch.latency.model import check_positive, features, nonnegative_least_squares

    n_inf, n_kv, seconds = synthetic_points()
    bent = seconds - 6e-6 * n_inf**2 + 4e-4 * n_inf  # b = -1e-6: an unconstrained fit follows it below 0
    unconstrained, *_ = np.linalg.lstsq(features(n_inf, n_kv) / bent[:, None], np.ones_like(bent), rcond=None)
    assert unconstrained[1] < 0
    fitted = LatencyModel.fit(n_inf, n_kv, bent)
    assert (fitted.coefficients >= 0).all() and fitted.b == 0.0
    check_positive(fitted, "fit")  # positive over every forward it serves
    rng = np.random.default_rng(1)
    for _ in range(20):
        design, target = rng.standard_normal((30, 4)), rng.standard_normal(30)
        np.testing.assert_allclose(nonnegative_least_squares(design, target), nnls(design, target)[0], atol=1e-10)


class SlowingClock:
    """A clock whose every timed interval is longer than the one before: a machine that slows down
    during the profile (another job starting)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return float(self.calls**2)


def test_models_are_profiled_interleaved_by_the_given_clock_with_the_minimum_kept(tiny_runners):
    from rstitch.latency.model import profile_runners

    runners = {"slm": tiny_runners.slm, "llm": tiny_runners.llm}
    grid = ([1, 4], [0, 8])
    profiled = profile_runners(runners, *grid, repeats=3, statistic="min", clock=SlowingClock())
    # Interleaved forward by forward: the slowdown falls on both models alike (timed one model after the
    # other, the second would read about twice the first's times).
    slm, llm = (np.array([p.seconds for p in profiled[k]]) for k in ("slm", "llm"))
    assert 0.8 < llm.sum() / slm.sum() < 1.25
    # The k-th forward of the profile reads 4k + 3: every minimum is one of the first repeat's 8 forwards.
    assert max(p.seconds for k in runners for p in profiled[k]) <= 4 * 7 + 3
    median = profile_runners(runners, *grid, repeats=3, statistic="median", clock=SlowingClock())
    assert all(m.seconds < d.seconds for m, d in zip(profiled["slm"], median["slm"]))
    with pytest.raises(ValueError, match="statistic must be one of min, median, mean"):
        profile_runners(runners, *grid, statistic="mode")
