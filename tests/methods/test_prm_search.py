from collections import Counter

import pytest

from rstitch.engines import Sampler
from rstitch.errors import ConfigError
from rstitch.grading import extract_answer, normalize_answer
from rstitch.methods import DecodeContext, build_method
from rstitch.methods.base import LLM, SLM
from rstitch.scorers.prm import ProcessRewardModel
from rstitch.testbed import generate_problems

PROMPT = [5, 6, 7, 8]
PROBLEM = generate_problems("test", 1, seed=2)[0].problem  # the oracle PRM checks testbed problems
OPTIONS = {"max_step_tokens": 5, "max_repeats": 0}
ORACLE = {"name": "oracle"}


def decode(pair, name, budget=16, seed=0, **params):
    ctx = DecodeContext(pair, Sampler(seed=seed), budget, problem=PROBLEM)  # greedy unless the method samples
    return build_method(name, **{**OPTIONS, **params}).decode(list(PROMPT), ctx)


def plain(pair, name, budget=16):
    return build_method(name).decode(list(PROMPT), DecodeContext(pair, Sampler(), budget)).token_ids


@pytest.mark.parametrize("name,params", [
    ("maj", {"n": 1}), ("best_of_n", {"n": 1, "prm": ORACLE}), ("process_bon", {"n": 1, "prm": ORACLE}),
    ("beam_search", {"beam_size": 1, "expansions": 1, "prm": ORACLE}),
    ("beam_search", {"beam_size": 2, "expansions": 2, "prm": ORACLE}),  # identical greedy beams fork
])
def test_one_greedy_candidate_reproduces_plain_decoding(tiny_runners, name, params):
    for model, source, single in (("llm", LLM, "llm_only"), ("slm", SLM, "slm_only")):
        out = decode(tiny_runners, name, model=model, temperature=None, **params)
        assert out.token_ids == plain(tiny_runners, single)
        assert set(out.sources) == {source}


def test_best_of_n_keeps_the_best_last_step_and_counts_every_candidate(tiny_runners):
    out = decode(tiny_runners, "best_of_n", n=3, temperature=1.0, prm=ORACLE, seed=1)
    scores = out.stats["candidate_scores"]
    assert len(scores) == 3 and out.stats["step_scores"][-1] == max(scores)
    assert out.stats["target_calls"] >= 3 and out.stats["draft_calls"] == 0
    assert out.discarded_tokens == out.stats["generated_tokens"] - len(out.token_ids) > 0
    again = decode(tiny_runners, "best_of_n", n=3, temperature=1.0, prm=ORACLE, seed=1)
    assert again.token_ids == out.token_ids


def test_majority_vote_returns_the_first_solution_with_the_most_frequent_answer(tiny_runners):
    out = decode(tiny_runners, "maj", n=5, model="slm", temperature=1.0, seed=2, budget=20)
    answers = out.stats["candidate_answers"]
    counted = Counter(a for a in answers if a is not None)
    assert len(answers) == 5 and counted, "tiny models state some number; the vote needs answers"
    winner = counted.most_common(1)[0][0]
    response = tiny_runners.slm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert normalize_answer(extract_answer(response)) == winner and out.stats["votes"] == counted[winner]
    assert out.stats["draft_calls"] >= 5 and out.stats["target_calls"] == 0


def test_process_bon_scores_n_candidates_per_step(tiny_runners):
    out = decode(tiny_runners, "process_bon", n=3, temperature=1.0, prm=ORACLE, seed=3)
    steps = out.stats["steps"]
    assert out.stats["target_calls"] == out.stats["prm_calls"] == 3 * steps
    assert set(out.stats["step_decisions"]) == {"select"} and out.discarded_tokens > 0


class TextPRM(ProcessRewardModel):
    """A causal stub: each step's score is a hash of its text; every call is logged."""

    name = "text"
    num_parameters = 1000

    def __init__(self):
        super().__init__()
        self.calls: list[list[str]] = []

    def score(self, problem, steps):
        self.calls.append(list(steps))
        self.cost.add_forward(len(steps), 0.0)
        return [(sum(map(ord, s)) % 97) / 96 for s in steps]


def test_process_bon_selects_per_step_and_differs_from_best_of_n(tiny_runners):
    prm = TextPRM()
    out = decode(tiny_runners, "process_bon", n=3, temperature=1.0, top_p=1.0, prm=prm, seed=5, budget=24)
    steps, not_first = 0, 0
    for k in range(out.stats["steps"]):
        candidates = [c for c in prm.calls if len(c) == k + 1 and (k == 0 or c[:k] == prm.calls[-1][:k])]
        assert len(candidates) == 3
        scores = [(sum(map(ord, c[-1])) % 97) / 96 for c in candidates]
        assert out.stats["step_scores"][k] == max(scores)  # the best of this step's N candidates
        not_first += scores.index(max(scores)) > 0
        steps += 1
    assert steps >= 3 and not_first > 0  # the choice mattered: not always the first sample
    best = decode(tiny_runners, "best_of_n", n=3, temperature=1.0, top_p=1.0, prm=TextPRM(), seed=5, budget=24)
    assert best.stats["steps"] > 0 and out.token_ids != best.token_ids


def test_beam_search_finishes_within_the_beam(tiny_runners):
    out = decode(tiny_runners, "beam_search", beam_size=2, expansions=2, temperature=1.0, prm=ORACLE, seed=4)
    assert 1 <= out.stats["beams_finished"] <= 2
    assert out.finish_reason in ("eos", "length") and len(out.token_ids) <= 16
    assert out.stats["prm_calls"] == out.stats["target_calls"] >= 2
    again = decode(tiny_runners, "beam_search", beam_size=2, expansions=2, temperature=1.0, prm=ORACLE, seed=4)
    assert again.token_ids == out.token_ids


@pytest.mark.parametrize("name,params", [
    ("maj", {"model": "big"}), ("maj", {"prm": ORACLE}), ("best_of_n", {"n": 0}),
    ("beam_search", {"beam_size": 0}), ("process_bon", {"temperature": "hot"}),
])
def test_bad_config_is_one_clear_error(name, params):
    with pytest.raises(ConfigError) as err:
        build_method(name, **params)
    assert "\n" not in str(err.value)



@pytest.mark.parametrize("preset,n", [("rsd_paper_baselines", 16), ("rsd_paper_72b_baselines", 64), ("easd_paper_baselines", 16)])
def test_rsd_baseline_presets_sample_their_candidates_at_the_papers_settings(tiny_runners, monkeypatch, preset, n):
    """Each method of the composed preset (RSD §3 and Table 2, EASD Table 1: N = 16 / 64, temperature 0.7, top_p 0.8)
    is built and decoded under a greedy run, and every candidate step it generates is drawn by a
    sampler at 0.7 / 0.8, not by the run's."""
    from test_scaleout import sweep_params

    from rstitch.cli.run import compose_config
    from rstitch.methods.steps import StepDecoder

    drawn: list[tuple] = []
    generate = StepDecoder.generate

    def spy(self, source, sampler=None):
        used = sampler or self.ctx.sampler
        drawn.append((used.temperature, used.top_p))
        return generate(self, source, sampler)

    monkeypatch.setattr(StepDecoder, "generate", spy)
    for name in sweep_params(preset)["method"]:
        method = compose_config([f"experiment={preset}", f"method={name}", "logger=none"])["method"]
        assert method.get("n", n) == n and (method["temperature"], method["top_p"]) == (0.7, 0.8)
        small = {"n": 2} if "n" in method else {"beam_size": 2, "expansions": 1}  # few candidates on the tiny pair
        method = {**method, **small, **({"prm": ORACLE} if "prm" in method else {})}
        drawn.clear()
        ctx = DecodeContext(tiny_runners, Sampler(seed=1), 8, problem=PROBLEM)  # a greedy run
        build_method(**{**OPTIONS, **method}).decode(list(PROMPT), ctx)
        assert drawn and set(drawn) == {(0.7, 0.8)}, (preset, name, drawn)
