import math

import pytest
import torch

from rstitch.engines import Sampler
from rstitch.errors import ConfigError
from rstitch.methods import DecodeContext, build_method
from rstitch.methods.base import LLM, SLM
from rstitch.methods.rsd import RSD, WEIGHTINGS, accepts
from rstitch.methods.steps import step_text
from rstitch.scorers.likelihood_prm import LikelihoodHead, TestbedPRM, save_prm

from conftest import decode_testbed_problem

PROMPTS = [[5, 6, 7, 8], [20, 21, 9]]
PROBLEM = "What is 2 + 3?"
STEP_OPTIONS = {"max_step_tokens": 5, "max_repeats": 0}


@pytest.fixture(scope="module")
def prm_path(tiny_pair, tmp_path_factory) -> str:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tiny_pair["tokenizer"])
    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=tok.pad_token_id,
    ))
    path = tmp_path_factory.mktemp("rsd_prm")
    save_prm(path, model, tok, LikelihoodHead(weight=[2.0, 2.0], bias=9.0))  # rewards spread over (0, 1)
    return str(path)


@pytest.fixture(scope="module")
def prm(prm_path) -> TestbedPRM:
    return TestbedPRM(prm_path)


def decode(pair, prompt=PROMPTS[0], budget=40, **params):
    ctx = DecodeContext(pair, Sampler(), budget, problem=PROBLEM)
    return build_method("rsd", **{**STEP_OPTIONS, **params}).decode(list(prompt), ctx)


def plain(pair, name, prompt, budget=40):
    return build_method(name).decode(list(prompt), DecodeContext(pair, Sampler(), budget)).token_ids


@pytest.mark.parametrize("prompt", PROMPTS)
def test_extreme_thresholds_reproduce_single_models(tiny_runners, prm, prompt):
    llm, slm = plain(tiny_runners, "llm_only", prompt), plain(tiny_runners, "slm_only", prompt)
    assert llm != slm
    never = decode(tiny_runners, prompt, delta=1.01, prm=prm)  # above the PRM's range (0, 1)
    always = decode(tiny_runners, prompt, delta=0.0, prm=prm)
    assert never.token_ids == llm and set(never.sources) == {LLM}
    assert always.token_ids == slm and set(always.sources) == {SLM}
    assert set(never.stats["step_decisions"]) == {"escalate"} and never.stats["acceptance_rate"] == 0.0
    assert set(always.stats["step_decisions"]) == {"accept"} and always.stats["acceptance_rate"] == 1.0
    assert always.stats["target_calls"] == 0 and always.discarded_tokens == 0
    assert never.stats["target_calls"] == never.stats["steps"] == never.stats["draft_calls"]
    assert never.discarded_tokens > 0


def test_mid_threshold_follows_algorithm_1(tiny_runners, prm, prm_path):
    # Pick delta inside the observed reward range, then replay the rule with fresh sequences.
    scores = decode(tiny_runners, delta=0.0, prm=prm).stats["step_scores"]
    delta = sorted(scores)[len(scores) // 2]
    out = decode(tiny_runners, delta=delta, prm=prm)
    assert {"accept", "escalate"} <= set(out.stats["step_decisions"])

    eos = set(tiny_runners.llm.eos_token_ids)
    prefix, steps, position = list(PROMPTS[0]), [], 0
    fresh_prm = TestbedPRM(prm_path)
    for decision, score in zip(out.stats["step_decisions"], out.stats["step_scores"]):
        limit = min(5, 40 - position)
        draft = tiny_runners.slm.new_sequence(prefix).generate(limit, Sampler(), ["\n\n"], eos).token_ids
        reward = fresh_prm.score(PROBLEM, steps + [step_text(tiny_runners.slm.tokenizer.decode(draft, skip_special_tokens=True), "\n\n")])[-1]
        assert score == pytest.approx(reward, abs=1e-5)
        assert decision == ("accept" if reward >= delta else "escalate")
        if decision == "escalate":
            draft = tiny_runners.llm.new_sequence(prefix).generate(limit, Sampler(), ["\n\n"], eos).token_ids
        assert out.token_ids[position:position + len(draft)] == draft
        steps.append(step_text(tiny_runners.llm.tokenizer.decode(draft, skip_special_tokens=True), "\n\n"))  # as the method reads steps
        prefix += draft
        position += len(draft)
    assert position == len(out.token_ids)

    # Escalated steps get their reward from the next PRM call: wasted = target <= draft.
    targets = out.stats["step_target_scores"]
    for i, (decision, target) in enumerate(zip(out.stats["step_decisions"], targets)):
        if decision == "escalate" and i < len(targets) - 1:
            assert target == pytest.approx(fresh_prm.score(PROBLEM, steps[: i + 1])[-1], abs=1e-5)
    wasted = sum(1 for s, t in zip(out.stats["step_scores"], targets) if t is not None and t <= s)
    assert out.stats["wasted_escalations"] == wasted


def omega(weighting, r, **params):
    return RSD(weighting=weighting, prm={"name": "oracle"}, **params).omega(r)


def test_weighting_functions():
    assert omega("constant", 0.1, p=0.3) == 0.3
    assert (omega("binary", 0.69), omega("binary", 0.7)) == (0.0, 1.0)
    # Table 1: clipping is min(1, max(0, r)), delta plays no part.
    assert (omega("clipping", 0.35, delta=0.7), omega("clipping", 1.4), omega("clipping", -0.2)) == (0.35, 1.0, 0.0)
    assert (omega("scaled_clipping", 0.35, delta=0.7), omega("scaled_clipping", 0.9, delta=0.7)) == (0.5, 1.0)
    coins = torch.Generator().manual_seed(0)
    draws = [accepts(0.25, coins) for _ in range(400)]
    assert 0.15 < sum(draws) / 400 < 0.35
    assert accepts(1.0, coins) and not accepts(0.0, coins)


def test_the_weightings_are_table_1s_rows():
    """RSD Table 1 has five rows: constant, the binary step, clipping, the sigmoidal transformation
    max(0, r / (1 + r)) and the logistic function; `scaled_clipping` is the one weighting of ours."""
    assert set(WEIGHTINGS) == {"constant", "binary", "clipping", "sigmoidal", "logistic", "scaled_clipping"}


@pytest.mark.parametrize("reward,expected", [(1.0, 0.5), (0.5, 1 / 3), (0.0, 0.0), (-0.5, 0.0), (-1.0, 0.0), (-3.0, 0.0)])
def test_sigmoidal_transformation_is_max_of_zero_and_r_over_one_plus_r(reward, expected):
    """Table 1: omega(r) = max(0, r / (1 + r)). A negative reward is refused (-0.5 gave -1 without the
    max); at r <= -1 the fraction is undefined or above 1, outside Algorithm 2's [0, 1]: 0 there too."""
    assert omega("sigmoidal", reward) == pytest.approx(expected)


@pytest.mark.parametrize("reward", [-0.3, 0.0, 0.6, 0.7, 0.75, 0.8, 1.0, 2.5])
def test_logistic_is_table_1s_logistic_function(reward):
    """Table 1: omega(r) = 1 / (1 + exp(-alpha (r - delta))), no outer max."""
    assert omega("logistic", reward, alpha=10, delta=0.7) == pytest.approx(1 / (1 + math.exp(-10 * (reward - 0.7))))


@pytest.mark.parametrize("reward,alpha", [(-100.0, 10.0), (0.0, 2000.0), (-1e6, 1.0)])
def test_logistic_far_below_delta_is_zero_without_overflow(reward, alpha):
    """A reward far below delta is refused (omega 0), never an overflow, and stays in [0, 1]."""
    weight = omega("logistic", reward, alpha=alpha, delta=0.7)
    assert weight == pytest.approx(0.0, abs=1e-12) and 0.0 <= weight <= 1.0
    assert not accepts(weight, torch.Generator().manual_seed(0))


def test_random_acceptance_is_seeded_and_spares_the_token_stream(tiny_runners, prm):
    assert decode(tiny_runners, weighting="constant", p=1.0, prm=prm).token_ids == plain(tiny_runners, "slm_only", PROMPTS[0])
    assert decode(tiny_runners, weighting="constant", p=0.0, prm=prm).token_ids == plain(tiny_runners, "llm_only", PROMPTS[0])
    a = decode(tiny_runners, weighting="constant", p=0.5, seed=1, prm=prm)
    b = decode(tiny_runners, weighting="constant", p=0.5, seed=1, prm=prm)
    c = decode(tiny_runners, weighting="constant", p=0.5, seed=2, prm=prm)
    assert {"accept", "escalate"} <= set(a.stats["step_decisions"])
    assert a.token_ids == b.token_ids and a.stats["step_decisions"] != c.stats["step_decisions"]


def test_flops_sum_draft_target_and_prm(tiny_runners, prm):
    before = {k: m.cost.copy() for k, m in tiny_runners.models().items()}
    prm_before = prm.cost.copy()
    out = decode(tiny_runners, delta=0.5, prm=prm)
    spent = {k: m.cost.since(before[k]).tokens_processed for k, m in tiny_runners.models().items()}
    prm_tokens = prm.cost.since(prm_before).tokens_processed
    expected = 2 * (tiny_runners.slm.num_parameters * spent["slm"] + tiny_runners.llm.num_parameters * spent["llm"]
                    + prm.num_parameters * prm_tokens)
    assert out.stats["flops"] == expected and out.stats["prm_tokens"] == prm_tokens > 0
    assert out.stats["prm_calls"] == out.stats["draft_calls"]


@pytest.mark.parametrize("params", [{"weighting": "step"}, {"delta": "high"}, {"p": 2}, {"prm": {"name": "nope"}}, {"prm": "testbed"}])
def test_bad_config_is_one_clear_error(params):
    with pytest.raises(ConfigError) as err:
        build_method("rsd", **params)
    assert "\n" not in str(err.value)


def test_testbed_extremes_reproduce_single_models(testbed_pair):
    run = lambda name, **p: decode_testbed_problem(testbed_pair, name, **p)  # noqa: E731
    assert run("rsd", delta=1.01) == run("llm_only")
    assert run("rsd", delta=0.0) == run("slm_only")
