"""R-Stitch with DEER's early exit (rstitch/methods/rstitch_deer.py) on the tiny random pair."""
import pytest

from rstitch.engines import Sampler
from rstitch.errors import ConfigError
from rstitch.methods import DecodeContext, build_method
from rstitch.methods.base import LLM, SLM
from rstitch.methods.rstitch_deer import closes_box, confidence

PROMPTS = [[5, 6, 7, 8], [20, 21, 9], [30, 40, 50, 60, 70]]
TAU = 0.35  # mixes both models on the tiny pair (tests/methods/test_methods.py)
ANSWER = "\n**Final Answer**\n\\boxed"
NEVER = {"exit_threshold": 1.0, "think_ratio": 1.0}  # trials run, no exit can fire


def decode(pair, name, prompt=PROMPTS[0], budget=60, temperature=0.0, **params):
    ctx = DecodeContext(pair, Sampler(temperature=temperature, seed=0), budget)
    return build_method(name, tau=TAU, **params).decode(list(prompt), ctx)


def frequent_char(pair, token_ids: list[int]) -> str:
    """A one-character token the output repeats: a transition that fires several times."""
    singles = [t for t in token_ids if len(pair.tokenizer.decode([t])) == 1]
    return pair.tokenizer.decode([max(set(singles), key=singles.count)])


def first_transition(pair, token_ids: list[int], transition: str) -> int:
    return next(i for i, t in enumerate(token_ids) if transition in pair.tokenizer.decode([t]))


def same_decoding(a, b) -> bool:
    return (a.token_ids, a.sources, a.discarded_tokens, a.switches, a.finish_reason) == \
        (b.token_ids, b.sources, b.discarded_tokens, b.switches, b.finish_reason)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_disabled_exit_is_plain_rstitch(tiny_runners, prompt, temperature):
    plain = decode(tiny_runners, "rstitch", prompt, temperature=temperature)
    off = decode(tiny_runners, "rstitch_deer", prompt, temperature=temperature, early_exit=False, exit_threshold=0.0)
    assert set(plain.sources) == {SLM, LLM}  # both models write: the comparison covers the switching
    assert same_decoding(off, plain)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("trial_model", ["llm", "slm", "active"])
def test_trials_that_never_fire_leave_rstitch_untouched_but_cost(tiny_runners, trial_model, temperature):
    plain_before = {k: r.cost.copy() for k, r in tiny_runners.models().items()}
    plain = decode(tiny_runners, "rstitch", temperature=temperature)
    plain_cost = {k: r.cost.since(plain_before[k]) for k, r in tiny_runners.models().items()}
    transition = frequent_char(tiny_runners, plain.token_ids)
    before = {k: r.cost.copy() for k, r in tiny_runners.models().items()}
    out = decode(tiny_runners, "rstitch_deer", temperature=temperature, trial_model=trial_model,
                 transitions=[transition], **NEVER)
    cost = {k: r.cost.since(before[k]) for k, r in tiny_runners.models().items()}
    stats = out.stats
    assert stats["deer_trials"] >= 2 and stats["deer_exit"] is None and stats["deer_forced_tokens"] == 0
    assert len(stats["deer_confidences"]) == stats["deer_trials"]
    assert same_decoding(out, plain)  # no trial token leaked, no draw of the sampler shifted
    # Each trial is real compute: the answer prompt and every trial token but the last run through a model.
    n_prompt = len(tiny_runners.tokenizer.encode(ANSWER, add_special_tokens=False))
    extra = sum(c.tokens_processed for c in cost.values()) - sum(c.tokens_processed for c in plain_cost.values())
    assert extra >= stats["deer_trials"] * (n_prompt - 1) + stats["deer_trial_tokens"]
    if trial_model != "active":
        other = "llm" if trial_model == "slm" else "slm"
        assert cost[other].tokens_processed <= plain_cost[other].tokens_processed  # trials ran on the chosen model only


@pytest.mark.parametrize("prompt", PROMPTS)
def test_exit_keeps_the_trial_answer_at_the_first_transition(tiny_runners, prompt):
    plain = decode(tiny_runners, "rstitch", prompt)
    transition = frequent_char(tiny_runners, plain.token_ids)
    cut = first_transition(tiny_runners, plain.token_ids, transition)
    out = decode(tiny_runners, "rstitch_deer", prompt, exit_threshold=0.0, on_exit="trial", transitions=[transition])
    answer_ids = tiny_runners.tokenizer.encode(ANSWER, add_special_tokens=False)
    assert out.finish_reason == "early_exit"
    assert (out.stats["deer_exit"], out.stats["deer_exit_position"], out.stats["deer_trials"]) == ("confidence", cut, 1)
    # The reasoning up to the transition, DEER's answer prompt, then the LLM's greedy trial answer.
    assert out.token_ids[:cut] == plain.token_ids[:cut] and out.sources[:cut] == plain.sources[:cut]
    assert out.token_ids[cut:cut + len(answer_ids)] == answer_ids
    trial = out.token_ids[cut + len(answer_ids):]
    assert len(trial) == out.stats["deer_trial_tokens"] > 0 and set(out.sources[cut:]) == {LLM}
    seq = tiny_runners.llm.new_sequence(prompt + plain.token_ids[:cut] + answer_ids)
    assert seq.generate(len(trial), Sampler()).token_ids == trial
    assert tiny_runners.tokenizer.decode(out.token_ids).endswith(ANSWER + tiny_runners.tokenizer.decode(trial))


def test_exit_appends_the_exit_text_and_rstitch_writes_on(tiny_runners):
    plain = decode(tiny_runners, "rstitch")
    transition = frequent_char(tiny_runners, plain.token_ids)
    cut = first_transition(tiny_runners, plain.token_ids, transition)
    out = decode(tiny_runners, "rstitch_deer", exit_threshold=0.0, transitions=[transition], exit_text="\n=")
    exit_ids = tiny_runners.tokenizer.encode("\n=", add_special_tokens=False)
    assert out.stats["deer_exit"] == "confidence" and out.stats["deer_trials"] == 1  # no trial after the exit
    assert out.token_ids[:cut] == plain.token_ids[:cut]
    assert out.token_ids[cut:cut + len(exit_ids)] == exit_ids
    assert len(out.token_ids) > cut + len(exit_ids) and out.finish_reason in ("eos", "length")
    assert len(out.token_ids) == len(out.sources) <= 60


def test_thinking_budget_forces_the_answer(tiny_runners):
    plain = decode(tiny_runners, "rstitch", budget=40)
    out = decode(tiny_runners, "rstitch_deer", budget=40, exit_threshold=1.0, think_ratio=0.5,
                 transitions=["never appears"], exit_text="\n=")
    assert (out.stats["deer_exit"], out.stats["deer_exit_position"], out.stats["deer_trials"]) == ("think_limit", 20, 0)
    assert out.token_ids[:20] == plain.token_ids[:20]
    assert out.token_ids[20:22] == tiny_runners.tokenizer.encode("\n=", add_special_tokens=False)
    assert len(out.token_ids) <= 40


def test_confidence_rules_leave_out_the_opening_brace():
    probs = [0.1, 0.9, 0.5, 1.0]
    assert confidence(probs, "mean") == pytest.approx(0.8)
    assert confidence(probs, "min") == 0.5
    assert confidence(probs, "geometric") == pytest.approx((0.9 * 0.5 * 1.0) ** (1 / 3))
    assert confidence([0.99], "mean") == 0.0  # nothing but the brace: never confident


def test_box_end_counts_nested_braces():
    assert not closes_box("{\\frac{1}{2}")
    assert closes_box("{\\frac{1}{2}}")
    assert closes_box("42}")  # the prompt opened the brace itself
    assert not closes_box("{42")


@pytest.mark.parametrize("params", [
    {"exit_threshold": 1.5}, {"exit_threshold": "high"}, {"early_exit": "yes"}, {"confidence": "median"},
    {"trial_model": "judge"}, {"transitions": "Wait"}, {"transitions": []}, {"transitions": ["Wait", ""]},
    {"answer_prompt": ""}, {"trial_max_tokens": 1}, {"max_trials": 0}, {"on_exit": "stop"},
    {"think_ratio": 0.0}, {"think_ratio": 1.2}, {"think_end": ""}, {"exit_text": None}, {"bogus": 1},
])
def test_bad_parameters_are_one_line_errors(params):
    with pytest.raises(ConfigError) as err:
        build_method("rstitch_deer", **params)
    assert "\n" not in str(err.value) and "rstitch_deer" in str(err.value)


def test_testbed_twin_exits_at_a_step_boundary_with_the_trial_answer(testbed_pair):
    import re

    from rstitch.cli.run import compose_config

    from conftest import decode_testbed_problem

    method = compose_config(["experiment=rstitch_testbed_deer"])["method"]
    name = method.pop("name")
    plain = decode_testbed_problem(testbed_pair, "rstitch", 256, 12, tau=method["tau"])
    never = decode_testbed_problem(testbed_pair, name, 256, 12, **{**method, **NEVER})
    assert never == plain
    out = decode_testbed_problem(testbed_pair, name, 256, 12, **method)
    text, plain_text = testbed_pair.tokenizer.decode(out), testbed_pair.tokenizer.decode(plain)
    reasoning, answer = re.fullmatch(r"(.*?)\n\n\\boxed\{(\d+)\}", text, re.S).groups()
    assert plain_text.startswith(reasoning + "\n\n") and len(reasoning) < plain_text.index("\\boxed")  # an early exit
