import pytest
import torch

from rstitch.engines import ModelPair, Sampler
from rstitch.errors import ConfigError
from rstitch.methods import DecodeContext, build_method
from rstitch.methods.base import LLM, SLM
from rstitch.methods.steps import CostMeter, StepConfig, StepDecoder, StepLog, step_text, summarize_step_stats

PROMPTS = [[5, 6, 7, 8], [20, 21, 9], [30, 40, 50, 60, 70]]


def context(pair, budget=40):
    return DecodeContext(pair, Sampler(), budget)


def plain(pair, name, prompt, budget=40):
    return build_method(name).decode(list(prompt), context(pair, budget)).token_ids


def decoder(pair, prompt, budget=40, **config):
    return StepDecoder(prompt, context(pair, budget), StepConfig(**{"max_repeats": 0, **config}))


@pytest.mark.parametrize("config", [{}, {"max_step_tokens": 3}, {"separator": "t", "max_step_tokens": 7}])
def test_accepting_every_step_reproduces_plain_decoding(tiny_runners, config):
    for prompt, (source, name) in zip(PROMPTS, ((SLM, "slm_only"), (LLM, "llm_only"), (SLM, "slm_only"))):
        path = decoder(tiny_runners, prompt, **config)
        finish = path.complete(lambda p, source=source: p.generate(source))
        assert path.output == plain(tiny_runners, name, prompt)
        assert finish in ("eos", "length")
        assert [t for s in path.steps for t in s.token_ids] == path.output
        for step in path.steps[:-1]:  # every step but the last ends on its own condition
            assert step.finish in ("separator", "step_cap")
            if step.finish == "step_cap":
                assert len(step.token_ids) == path.config.max_step_tokens


def test_steps_end_at_the_first_separator(tiny_runners):
    tok = tiny_runners.slm.tokenizer
    path = decoder(tiny_runners, PROMPTS[0], budget=60, separator="t", max_step_tokens=50)
    path.complete(lambda p: p.generate(SLM))
    ended = [s for s in path.steps if s.finish == "separator"]
    assert ended, "the SLM writes 't' often; the test needs separator-ended steps"
    for step in ended:
        text = tok.decode(step.token_ids)
        assert text.endswith("t") and "t" not in tok.decode(step.token_ids[:-1])
        assert step.text == text[:-1].strip()


def test_alternating_models_stay_in_sync_with_fresh_sequences(tiny_runners):
    # Each model catches up on the other's steps by partial prefill; every step must equal
    # what a fresh sequence of that model writes from the same prefix.
    prompt = PROMPTS[1]
    path = decoder(tiny_runners, prompt, budget=48, max_step_tokens=5)
    path.complete(lambda p: p.generate(SLM if len(p.steps) % 2 == 0 else LLM))
    assert {s.source for s in path.steps} == {SLM, LLM}
    prefix = list(prompt)
    for step in path.steps:
        runner = tiny_runners.slm if step.source == SLM else tiny_runners.llm
        fresh = runner.new_sequence(prefix).generate(len(step.token_ids), Sampler())
        assert fresh.token_ids == step.token_ids
        prefix += step.token_ids


def test_rejected_draft_is_rolled_back_from_the_draft_cache(tiny_runners):
    prompt = PROMPTS[2]
    path = decoder(tiny_runners, prompt, budget=30, max_step_tokens=4)

    def reject_draft(p):
        p.generate(SLM)  # drafted, never committed
        return p.generate(LLM)

    path.complete(reject_draft)
    assert path.output == plain(tiny_runners, "llm_only", prompt, budget=30)
    slm_seq = path.models.aligned(SLM, path.prompt_ids + path.output)
    assert slm_seq.tokens == path.prompt_ids + path.output
    fresh = tiny_runners.slm.new_sequence(path.prompt_ids + path.output)
    torch.testing.assert_close(slm_seq.next_distribution().logits, fresh.next_distribution().logits, rtol=1e-4, atol=1e-4)
    assert path.calls[f"steps_{SLM}"] == path.calls[f"steps_{LLM}"] == len(path.steps)


def test_repeated_identical_steps_end_the_sample(tiny_pair):
    # A pair whose greedy output is "bccc...": one-token steps, and the sample must end right
    # where a token has repeated max_repeats (3) times, not before and not at the budget.
    from transformers import AutoTokenizer

    from test_specdec import BigramRunner, chain_table

    tok = AutoTokenizer.from_pretrained(tiny_pair["tokenizer"])
    a, b, c = tok.convert_tokens_to_ids(["a", "b", "c"])
    table = chain_table(len(tok), {a: b, b: c, c: c})
    pair = ModelPair(BigramRunner(table, "slm"), BigramRunner(table, "llm"))
    pair.slm.tokenizer = pair.llm.tokenizer = tok
    out = plain(pair, "llm_only", [a], budget=60)
    assert out == [b] + [c] * 59
    path = decoder(pair, [a], budget=60, max_step_tokens=1, max_repeats=3)
    assert path.complete(lambda p: p.generate(LLM)) == "repeat"
    assert path.output == [b, c, c, c]
    relaxed = decoder(pair, [a], budget=60, max_step_tokens=1, max_repeats=0)
    assert relaxed.complete(lambda p: p.generate(LLM)) == "length" and relaxed.output == out


def test_step_cap_and_budget_end_the_sample(tiny_runners):
    path = decoder(tiny_runners, PROMPTS[0], budget=40, max_step_tokens=2, max_steps=3)
    assert path.complete(lambda p: p.generate(SLM)) == "step_cap"
    assert len(path.steps) == 3 and len(path.output) <= 6
    path = decoder(tiny_runners, PROMPTS[0], budget=7, max_step_tokens=3)
    assert path.complete(lambda p: p.generate(SLM)) == "length"
    assert len(path.output) == 7 and path.steps[-1].finish == "budget"


def test_summaries_count_when_the_step_caps_fire(tiny_runners):
    method = build_method("maj", n=1, temperature=None, max_step_tokens=2, max_steps=3, max_repeats=0)
    capped = method.decode(list(PROMPTS[0]), context(tiny_runners, 40))
    assert capped.finish_reason == "step_cap" and capped.stats["capped_steps"] == 3
    free = build_method("maj", n=1, temperature=None, max_repeats=0).decode(list(PROMPTS[0]), context(tiny_runners, 40))
    assert free.stats["capped_steps"] == 0
    samples = [{"finish_reason": r.finish_reason, "stats": r.stats} for r in (capped, free)]
    samples.append({"finish_reason": "repeat", "stats": {**free.stats, "capped_steps": 1}})
    summary = method.summarize(samples)
    assert (summary["step_caps_max_step_tokens"], summary["step_caps_max_steps"], summary["step_caps_max_repeats"]) == (4, 1, 1)


def test_step_text_drops_the_separator():
    assert step_text("47 + 38 = 85\n\n", "\n\n") == "47 + 38 = 85"
    assert step_text("a\n\n\n", "\n\n") == "a"
    assert step_text(" cut by the cap", "\n\n") == "cut by the cap"


def test_cost_meter_counts_flops_per_component(tiny_runners):
    meter = CostMeter(tiny_runners)
    path = decoder(tiny_runners, PROMPTS[0], budget=20, max_step_tokens=4)
    path.complete(lambda p: p.generate(SLM if len(p.steps) % 2 else LLM))
    with meter.judging():
        tiny_runners.llm.new_sequence(PROMPTS[1]).next_distribution()
    stats = meter.stats()
    assert stats["judge_tokens"] == len(PROMPTS[1]) and stats["judge_calls"] == 1
    assert stats["flops_judge"] == 2 * tiny_runners.llm.num_parameters * len(PROMPTS[1])
    assert stats["flops_draft"] > 0 and stats["flops_target"] > 0
    assert stats["flops"] == stats["flops_draft"] + stats["flops_target"] + stats["flops_judge"]


def test_step_log_counts_wasted_escalations_only_where_both_were_scored():
    log = StepLog()
    log.add(SLM, "accept", 0.9)
    log.add(LLM, "escalate", 0.4)  # scored later by fill_target_scores: 0.3 <= 0.4, wasted
    log.add(LLM, "escalate", 0.2, 0.8)
    log.add(LLM, "escalate", 0.5)  # never scored
    log.fill_target_scores([0.9, 0.3, 0.8])
    stats = log.stats()
    assert stats["step_target_scores"] == [None, 0.3, 0.8, None]
    assert (stats["escalations"], stats["escalations_scored"], stats["wasted_escalations"]) == (3, 2, 1)
    assert stats["acceptance_rate"] == 0.25
    summary = summarize_step_stats([{"stats": stats}, {"stats": {**stats, "steps": 6}}])
    assert summary["steps"] == 5 and summary["wasted_escalation_rate"] == 0.5


@pytest.mark.parametrize("params", [{"separator": ""}, {"max_step_tokens": 0}, {"max_repeats": -1}, {"max_steps": "x"}])
def test_bad_step_options_are_one_clear_error(params):
    with pytest.raises(ConfigError) as err:
        build_method("rsd", **params)
    assert "\n" not in str(err.value)
