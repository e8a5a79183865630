"""Cost accounting shared by every method: a sample's FLOPs include the models outside the pair
(PRM, routers), the run's FLOPs are the mean of its samples', and a method's summary cannot
overwrite the common keys."""
import pytest

from rstitch import runner
from rstitch.cli.run import compose_config
from rstitch.engines import Sampler
from rstitch.methods import DecodeContext, build_method
from rstitch.methods.base import Method
from rstitch.results import summarize_samples
from rstitch.results.summary import summarize_run
from rstitch.scorers.prm import ProcessRewardModel
from rstitch.scorers.rstitch_router import RouterConfig, RStitchRouter
from rstitch.testbed import ASSETS_DIR

PROMPT = [5, 6, 7, 8]


class CountingPRM(ProcessRewardModel):
    """Scores every step 0.5 (RSD's coin decides) and books one token per step it reads."""

    name = "counting"
    num_parameters = 10_000

    def score(self, problem, steps):
        self.cost.add_forward(max(1, len(steps)), 0.0)
        return [0.5] * len(steps)


class Record:
    id, problem, answer, metadata = "p1", "1 + 1", "2", {}


def record_of(method: Method, pair, budget: int = 24) -> dict:
    ctx = DecodeContext(pair, Sampler(), budget)
    result, latency, cost = runner.timed_decode(method, list(PROMPT), ctx)
    return runner.sample_record(Record(), 0, result, latency, cost, pair, method)


def pair_flops(row: dict, pair) -> float:
    models = pair.models()
    return sum(2.0 * models[k].num_parameters * (c["prefill_tokens"] + c["decode_steps"]) for k, c in row["cost"].items())


def test_step_level_sample_flops_include_the_prm(tiny_runners):
    method = build_method("rsd", weighting="constant", p=0.5, prm=CountingPRM(), max_step_tokens=4, max_repeats=0)
    row = record_of(method, tiny_runners)
    stats = row["stats"]
    assert stats["flops_prm"] > 0 and stats["prm_calls"] > 0
    assert row["flops"] == pytest.approx(pair_flops(row, tiny_runners) + stats["flops_prm"])
    assert row["flops"] == pytest.approx(stats["flops"])  # the meter and the runner count the same forwards


def test_rstitch_plus_sample_flops_include_the_router(tiny_runners):
    router = RStitchRouter(RouterConfig(tiny_runners.slm.hidden_size, tiny_runners.llm.hidden_size)).eval()
    row = record_of(build_method("rstitch_plus", tau=0.35, router=router), tiny_runners)
    calls = row["stats"]["router_calls"]
    assert calls > 0
    assert row["flops"] == pytest.approx(pair_flops(row, tiny_runners) + 2.0 * router.num_parameters() * calls)


def test_run_flops_are_the_mean_of_the_samples(tiny_runners):
    method = build_method("rsd", weighting="constant", p=0.5, prm=CountingPRM(), max_step_tokens=4, max_repeats=0)
    rows = [record_of(method, tiny_runners, budget) for budget in (12, 24)]
    cfg = compose_config(["logger=none", "method=rsd"])
    summary = summarize_run(cfg, method, rows, "/nonexistent")
    assert summary["flops"] == pytest.approx(sum(r["flops"] for r in rows) / 2)
    assert summary["flops"] == pytest.approx(summarize_samples(rows)["flops"])


class Clashing(Method):
    name = "clashing"

    def decode(self, prompt_ids, ctx):
        raise NotImplementedError

    def summarize(self, samples):
        return {"flops": 0.0, "own_metric": 1}


def test_a_method_summary_may_not_overwrite_common_keys(tiny_runners):
    row = record_of(build_method("llm_only"), tiny_runners)
    cfg = compose_config(["logger=none"])
    with pytest.raises(ValueError, match="clashing.*flops"):
        summarize_run(cfg, Clashing(), [row], "/nonexistent")


@pytest.mark.parametrize("name", ["rsd", "specreason", "arbitrage_oracle", "process_bon", "easd", "rstitch_plus"])
def test_registered_summaries_keep_to_their_own_keys(name):
    common = set(summarize_samples([{"id": "a", "correct": 1, "latency_s": 1.0, "tokens": 4, "tokens_slm": 2,
                                     "tokens_llm": 2, "cost": {m: {"forward_time_s": 0.1, "forward_calls": 1} for m in ("slm", "llm")},
                                     "flops": 1.0, "latency_estimate_s": 0.5}]))
    stats = {"flops": 1.0, "latency_estimate_s": 0.5, "router_calls": 1, "router_time_s": 0.1, "steps": 2,
             "capped_steps": 0, "drafted_steps": 1, "accepted_steps": 1}
    params = {"easd": {"tau_h": 1.0}, "rstitch_plus": {"router": str(ASSETS_DIR / "rstitch_router")}}.get(name, {})
    method = build_method(name, **params)
    own = method.summarize([{"id": "a", "latency_s": 1.0, "finish_reason": "eos", "stats": stats}])
    assert not set(own) & common, sorted(set(own) & common)
