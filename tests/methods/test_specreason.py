import pytest
import torch

from rstitch.engines import Sampler
from rstitch.errors import ConfigError
from rstitch.methods import DecodeContext, build_method
from rstitch.methods.base import LLM, SLM
from rstitch.methods.specreason import (
    JUDGE_INSTRUCTION,
    JUDGE_PREFIX,
    SpecReason,
    digit_score,
    digit_token_ids,
    judge_prompt,
    judge_suffix_ids,
    without_trailing_space,
)
from rstitch.methods.steps import step_text

from conftest import decode_testbed_problem

PROMPTS = [[5, 6, 7, 8], [30, 40, 50, 60, 70]]
PROBLEM = "What is 2 + 3?"
STEP_OPTIONS = {"max_step_tokens": 6, "max_repeats": 0}


def context(pair, budget=36):
    return DecodeContext(pair, Sampler(), budget, problem=PROBLEM)


def decode(pair, prompt=PROMPTS[0], method=None, **params):
    method = method or build_method("specreason", **{**STEP_OPTIONS, **params})
    return method.decode(list(prompt), context(pair))


def as_step(runner, ids):
    return step_text(runner.tokenizer.decode(ids, skip_special_tokens=True), "\n\n")


def plain(pair, name, prompt):
    return build_method(name).decode(list(prompt), context(pair)).token_ids


@pytest.mark.parametrize("prompt,score_mode", [(PROMPTS[0], "greedy"), (PROMPTS[1], "expected")])
def test_extreme_thresholds_reproduce_single_models(tiny_runners, prompt, score_mode):
    never = decode(tiny_runners, prompt, threshold=10, score_mode=score_mode)
    always = decode(tiny_runners, prompt, threshold=0, score_mode=score_mode)
    assert never.token_ids == plain(tiny_runners, "llm_only", prompt) and set(never.sources) == {LLM}
    assert always.token_ids == plain(tiny_runners, "slm_only", prompt) and set(always.sources) == {SLM}
    for out in (never, always):  # one judge prefill per draft, reported apart from decoding
        assert out.stats["judge_calls"] == out.stats["drafted_steps"] == out.stats["steps"]
        assert out.stats["flops_judge"] == 2 * tiny_runners.llm.num_parameters * out.stats["judge_tokens"] > 0
        assert all(0 <= s <= 9 for s in out.stats["step_scores"])
    assert always.stats["flops_target"] == 0  # the base model only judged


def test_mid_threshold_judges_each_draft_in_one_prefill(tiny_runners):
    """`judge_context: chat`: each draft is judged in a separate judge conversation."""
    scores = decode(tiny_runners, threshold=0, score_mode="expected", judge_context="chat").stats["step_scores"]
    threshold = sorted(scores)[len(scores) // 2]
    out = decode(tiny_runners, threshold=threshold, score_mode="expected", judge_context="chat")
    assert {"accept", "escalate"} <= set(out.stats["step_decisions"])

    llm, slm = tiny_runners.llm, tiny_runners.slm
    eos = set(llm.eos_token_ids)
    prefix, steps, position = list(PROMPTS[0]), [], 0
    for decision, score in zip(out.stats["step_decisions"], out.stats["step_scores"]):
        limit = min(6, 36 - position)
        draft = slm.new_sequence(prefix).generate(limit, Sampler(), ["\n\n"], eos).token_ids
        text = judge_prompt(llm.tokenizer, PROBLEM, steps + [as_step(slm, draft)], "\n\n")
        logits = llm.new_sequence(llm.tokenizer.encode(text, add_special_tokens=False)).next_distribution().logits
        expected = digit_score(logits, digit_token_ids(llm), "expected")
        assert score == pytest.approx(expected, abs=1e-4)
        assert decision == ("accept" if expected >= threshold else "escalate")
        if decision == "escalate":
            draft = llm.new_sequence(prefix).generate(limit, Sampler(), ["\n\n"], eos).token_ids
        assert out.token_ids[position:position + len(draft)] == draft
        steps.append(as_step(llm, draft))
        prefix += draft
        position += len(draft)
    assert position == len(out.token_ids)


def mid_threshold(pair, **params) -> float:
    scores = decode(pair, threshold=0, score_mode="expected", **params).stats["step_scores"]
    return sorted(scores)[len(scores) // 2]


def test_judge_reads_the_draft_on_the_base_models_own_sequence(tiny_runners):
    """Section 4.1: the judgement is the base model's next-token distribution after the reasoning
    it holds (prompt, committed steps), the draft step and the scoring prompt, on its own sequence."""
    threshold = mid_threshold(tiny_runners)
    out = decode(tiny_runners, threshold=threshold, score_mode="expected")
    assert {"accept", "escalate"} <= set(out.stats["step_decisions"])
    llm, slm = tiny_runners.llm, tiny_runners.slm
    suffix, eos = judge_suffix_ids(llm.tokenizer), set(llm.eos_token_ids)
    assert llm.tokenizer.decode(suffix).endswith(f"Assign a score from 0 to 9.<|assistant|>{JUDGE_PREFIX}")
    prefix, position = list(PROMPTS[0]), 0
    for decision, score in zip(out.stats["step_decisions"], out.stats["step_scores"]):
        limit = min(6, 36 - position)
        draft = slm.new_sequence(prefix).generate(limit, Sampler(), ["\n\n"], eos).token_ids
        judged = prefix + without_trailing_space(llm.tokenizer, draft) + suffix
        expected = digit_score(llm.new_sequence(judged).next_distribution().logits, digit_token_ids(llm), "expected")
        assert score == pytest.approx(expected, abs=1e-4)
        assert decision == ("accept" if expected >= threshold else "escalate")
        if decision == "escalate":
            draft = llm.new_sequence(prefix).generate(limit, Sampler(), ["\n\n"], eos).token_ids
        assert out.token_ids[position:position + len(draft)] == draft
        prefix += draft
        position += len(draft)
    assert position == len(out.token_ids)


@pytest.mark.parametrize("threshold", [10, None])  # every step rewritten; a mix
def test_a_judgement_prefills_only_the_new_step_and_the_scoring_prompt(tiny_runners, threshold):
    """On its own sequence the base model processes each token of the output once, each rejected
    draft once, and the scoring prompt once per judgement: no step is prefilled twice, unlike the
    separate judge conversation (`judge_context: chat`), which prefills every step again."""
    threshold = mid_threshold(tiny_runners) if threshold is None else threshold
    out = decode(tiny_runners, threshold=threshold, score_mode="expected")
    chat = decode(tiny_runners, threshold=threshold, score_mode="expected", judge_context="chat")
    llm, suffix = tiny_runners.llm, len(judge_suffix_ids(tiny_runners.llm.tokenizer))

    def processed(result):  # tokens the base model ran forwards on, decoding and judging
        return (result.stats["flops_target"] + result.stats["flops_judge"]) / (2 * llm.num_parameters)

    # generated_tokens: every step written, kept or not (each rejected draft once); + one re-run
    # position per step at most (a rollback outside the kept logits)
    once = len(PROMPTS[0]) + out.stats["generated_tokens"] + out.stats["judge_calls"] * suffix + out.stats["steps"]
    assert processed(out) <= once
    assert processed(out) < processed(chat)
    assert out.stats["judge_tokens"] / out.stats["judge_calls"] < chat.stats["judge_tokens"] / chat.stats["judge_calls"]
    if threshold == 10:  # the same decisions either way: the saving is the second prefill alone
        assert chat.stats["step_decisions"] == out.stats["step_decisions"] and chat.token_ids == out.token_ids


def test_judgements_on_the_testbed_match_the_judge_chat(testbed_pair):
    """With the chat prompt the testbed decodes with, the judge reads the same text on the base
    model's sequence as in the separate judge conversation: the same scores and decisions."""
    run = lambda **p: decode_testbed_problem(testbed_pair, "specreason", threshold=7, **p)  # noqa: E731
    assert run() == run(judge_context="chat")


def test_first_steps_by_base_model(tiny_runners):
    out = decode(tiny_runners, threshold=0, first_n_by_base=2)
    assert out.stats["step_decisions"][:2] == ["base", "base"]
    assert out.stats["step_sources"][:2] == [LLM, LLM] and set(out.stats["step_sources"][2:]) == {SLM}
    assert out.stats["judge_calls"] == out.stats["steps"] - 2


def test_regeneration_is_pluggable(tiny_runners):
    class CountingSpecReason(SpecReason):
        regenerated = 0

        def regenerate_step(self, run, path):
            self.regenerated += 1
            return super().regenerate_step(run, path)

    method = CountingSpecReason(threshold=10, first_n_by_base=1, **STEP_OPTIONS)
    out = decode(tiny_runners, method=method)
    assert method.regenerated == out.stats["steps"] == out.stats["target_calls"]
    assert out.token_ids == plain(tiny_runners, "llm_only", PROMPTS[0])


def test_digit_scores():
    logits = torch.full((20,), -10.0)
    digits = list(range(10, 20))
    logits[13], logits[17] = 2.0, 2.0 + torch.log(torch.tensor(3.0))
    assert digit_score(logits, digits, "greedy") == 7.0
    assert digit_score(logits, digits, "expected") == pytest.approx((3 * 1 + 7 * 3) / 4, abs=1e-3)


def test_judge_prompt_layout(tiny_runners):
    tok = tiny_runners.llm.tokenizer
    text = judge_prompt(tok, "P?", ["step one", "step two"], "\n\n")
    # (the test template renders turns without newlines)
    assert text == f"<|user|>P?<|assistant|>step one\n\nstep two<|endoftext|><|user|>{JUDGE_INSTRUCTION}<|assistant|>{JUDGE_PREFIX}"


def test_judge_prompt_joins_the_steps_with_the_methods_separator(tiny_runners):
    text = judge_prompt(tiny_runners.llm.tokenizer, "P?", ["step one", "step two"], "\n")
    assert "<|assistant|>step one\nstep two<|endoftext|>" in text
    assert JUDGE_INSTRUCTION.endswith("Assign a score from 0 to 9.") and text.endswith("I think the quality score is: ")


@pytest.mark.parametrize("params", [{"score_mode": "mean"}, {"threshold": "7"}, {"first_n_by_base": -1},
                                    {"judge_context": "separate"}])
def test_bad_config_is_one_clear_error(params):
    with pytest.raises(ConfigError) as err:
        build_method("specreason", **params)
    assert "\n" not in str(err.value)


def test_testbed_extremes_reproduce_single_models(testbed_pair):
    run = lambda name, **p: decode_testbed_problem(testbed_pair, name, **p)  # noqa: E731
    assert run("specreason", threshold=10) == run("llm_only")
    assert run("specreason", threshold=0) == run("slm_only")
