"""SpecReason+Decode: speculative decoding of the base model's steps is lossless."""
import pytest

from rstitch.data.prompts import PromptFormat
from rstitch.engines import Sampler, load_pair
from rstitch.errors import ConfigError
from rstitch.methods import DecodeContext, build_method
from rstitch.testbed import LLM_DIR, SLM_DIR, generate_problems

PROMPTS = [[5, 6, 7, 8], [30, 40, 50, 60, 70]]
STEP_OPTIONS = {"max_step_tokens": 6, "max_repeats": 0}


def run(pair, name, prompt, problem="What is 2 + 3?", budget=36, **params):
    ctx = DecodeContext(pair, Sampler(), budget, problem=problem)
    return build_method(name, **params).decode(list(prompt), ctx)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("threshold,k", [(0, 3), (5, 2), (10, 5), (10, 1)])
def test_greedy_output_equals_specreason(tiny_runners, prompt, threshold, k):
    plain = run(tiny_runners, "specreason", prompt, threshold=threshold, **STEP_OPTIONS)
    spec = run(tiny_runners, "specreason_decode", prompt, threshold=threshold, k=k, **STEP_OPTIONS)
    assert spec.token_ids == plain.token_ids
    assert spec.stats["step_decisions"] == plain.stats["step_decisions"]
    assert spec.stats["step_scores"] == plain.stats["step_scores"]
    if threshold == 10:  # every step is the base model's: all of them went through the drafter
        assert spec.stats["spec_draft_tokens_proposed"] > 0
        assert spec.stats["spec_verifications"] >= spec.stats["target_calls"]


def test_on_the_testbed_pair_with_the_real_separator():
    pair = load_pair({"path": str(SLM_DIR)}, {"path": str(LLM_DIR)})
    for p in generate_problems("test", 2):
        prompt = PromptFormat().encode(pair.tokenizer, p.problem)
        plain = run(pair, "specreason", prompt, p.problem, budget=200, threshold=10)
        spec = run(pair, "specreason_decode", prompt, p.problem, budget=200, threshold=10, k=4)
        assert spec.token_ids == plain.token_ids and plain.stats["target_calls"] >= 2


@pytest.mark.parametrize("k", [0, -1, "3"])
def test_bad_k_is_rejected(k):
    with pytest.raises(ConfigError):
        build_method("specreason_decode", k=k)
