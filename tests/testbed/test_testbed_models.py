"""The shipped testbed family, loaded through the framework, on a small slice of the test split."""
from __future__ import annotations

import pytest

from rstitch.data.prompts import PromptFormat
from rstitch.engines import Sampler
from rstitch.grading import grade
from rstitch.methods import DecodeContext, build_method
from rstitch.methods.specreason import digit_ids, digit_score, digit_token_ids, judge_prompt
from rstitch.results.uncertainty import roc_auc
from rstitch.scorers import load_prm
from rstitch.testbed import check_steps, generate_problems, split_steps

N = 16
PRM_AUC_FLOOR = 0.8  # measured on this slice: see docs/testbed.md for the full test split
JUDGE_AUC_FLOOR = 0.6

pytestmark = pytest.mark.slow  # decodes a slice of the test split with every model of the family


@pytest.fixture(scope="module")
def decoded(testbed_pair):
    problems = generate_problems("test", N)
    out = {}
    for name in ("slm_only", "llm_only"):
        method = build_method(name)
        rows = []
        for p in problems:
            ctx = DecodeContext(testbed_pair, Sampler(), 400, p.problem)
            result = method.decode(PromptFormat().encode(testbed_pair.tokenizer, p.problem), ctx)
            text = testbed_pair.tokenizer.decode(result.token_ids, skip_special_tokens=True)
            rows.append((p, result, text, grade(text, p.answer)))
        out[name] = rows
    return out


def test_family_sizes(testbed_pair):
    slm, llm = testbed_pair.slm, testbed_pair.llm
    assert llm.num_parameters >= 10 * slm.num_parameters
    assert llm.model.config.num_hidden_layers > slm.model.config.num_hidden_layers


def test_llm_is_more_accurate_and_more_verbose(decoded):
    acc = {k: sum(r[3] for r in rows) / N for k, rows in decoded.items()}
    assert acc["llm_only"] >= 0.7 and acc["llm_only"] >= acc["slm_only"] + 0.2, acc
    both = [i for i in range(N) if decoded["slm_only"][i][3] and decoded["llm_only"][i][3]]
    slm_tokens = sum(len(decoded["slm_only"][i][1].token_ids) for i in both)
    llm_tokens = sum(len(decoded["llm_only"][i][1].token_ids) for i in both)
    assert not both or slm_tokens <= 0.75 * llm_tokens


def test_rstitch_extremes_on_the_testbed(testbed_pair, decoded):
    for p, result, *_ in (decoded["slm_only"][0], decoded["slm_only"][1]):
        prompt = PromptFormat().encode(testbed_pair.tokenizer, p.problem)
        llm_tokens = next(r.token_ids for q, r, *_ in decoded["llm_only"] if q.id == p.id)
        for tau, expected in ((1.0, result.token_ids), (-1.0, llm_tokens)):
            ctx = DecodeContext(testbed_pair, Sampler(), 400, p.problem)
            assert build_method("rstitch", tau=tau).decode(prompt, ctx).token_ids == expected


@pytest.fixture(scope="module")
def slm_steps(decoded):
    """(problem, steps, per-step correctness) of the SLM's traces: the steps both scorers rate."""
    return [(p, split_steps(text), check_steps(p, split_steps(text))) for p, _, text, _ in decoded["slm_only"] if split_steps(text)]


def test_prm_separates_right_from_wrong_steps(slm_steps):
    prm = load_prm("testbed")
    scores = [s for p, steps, _ in slm_steps for s in prm.score(p.problem, steps)]
    labels = [y for *_, ys in slm_steps for y in ys]
    assert roc_auc(scores, labels) >= PRM_AUC_FLOOR


def test_judge_separates_right_from_wrong_steps(testbed_pair, slm_steps):
    llm = testbed_pair.llm
    digits = digit_token_ids(llm)
    scores, labels = [], []
    for p, steps, ys in slm_steps:
        for k in range(len(steps)):
            ids = llm.tokenizer.encode(judge_prompt(llm.tokenizer, p.problem, steps[: k + 1], "\n\n"), add_special_tokens=False)
            scores.append(digit_score(llm.new_sequence(ids).next_distribution().logits, digits, "expected"))
            labels.append(ys[k])
    assert roc_auc(scores, labels) >= JUDGE_AUC_FLOOR


def test_digit_ids_are_the_single_digit_tokens():
    from rstitch.testbed.tokenizer import load_tokenizer

    tok = load_tokenizer()
    assert [tok.decode([t]) for t in digit_ids(tok)] == [str(d) for d in range(10)]
