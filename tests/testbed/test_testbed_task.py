"""Unit tests of the testbed task: problems, the exact step checker, corruption."""

import random

import pytest

from rstitch.testbed.checking import check_steps, extract_boxed, first_wrong_step, is_correct, locate_errors, split_steps
from rstitch.testbed.corruption import corrupt_steps
from rstitch.testbed.problems import STYLES, Difficulty, generate_problems, make_problem


@pytest.fixture(scope="module")
def example():
    return make_problem(47, [("+", 38), ("*", 6), ("-", 129)])


def test_example_texts(example):
    assert example.problem == "Start with 47. Add 38, then multiply by 6, then subtract 129. What is the result?"
    assert example.answer == "381"
    assert example.solution("concise") == (
        "47 + 38 = 47 + 30 + 8 = 77 + 8 = 85\n\n85 * 6 = 80 * 6 + 5 * 6 = 480 + 30 = 510\n\n"
        "510 - 129 = 510 - 120 - 9 = 390 - 9 = 381\n\n\\boxed{381}"
    )
    verbose = example.solution("verbose")
    assert verbose.startswith("We start with 47.\n\nAdding 38: 47 + 38 = 47 + 30 + 8 = 77 + 8 = 85. Check: 85 - 38 = 47.")
    assert verbose.endswith("So the answer is \\boxed{381}.")
    with pytest.raises(ValueError):
        example.solution("other")


def test_record_format(example):
    rec = example.to_record()
    assert set(rec) == {"id", "problem", "answer", "metadata"}
    assert rec["answer"] == "381" and rec["metadata"]["ops"] == [["+", 38], ["*", 6], ["-", 129]]


def test_generation_deterministic_and_bounded():
    a = generate_problems("train", 200, seed=3)
    b = generate_problems("train", 200, seed=3)
    assert [p.problem for p in a] == [p.problem for p in b]
    assert [p.problem for p in generate_problems("train", 50, seed=3)] == [p.problem for p in a[:50]]
    assert [p.problem for p in generate_problems("train", 50, seed=4)] != [p.problem for p in a[:50]]
    assert len({p.id for p in a}) == 200
    for p in a:
        assert 1 <= len(p.ops) <= 6
        assert all(0 <= v <= 999 for v in p.values)
        for (op, b_), v in zip(p.ops, p.values):
            if op == "*":
                assert v < 100 and 2 <= b_ <= 9
        assert p.answer == str(p.values[-1])


def test_splits_disjoint():
    texts = {s: {p.problem for p in generate_problems(s, 400, seed=0)} for s in ("train", "validation", "test")}
    texts["train"] |= {p.problem for p in generate_problems("train", 400, seed=1)}
    assert not texts["train"] & texts["validation"]
    assert not texts["train"] & texts["test"]
    assert not texts["validation"] & texts["test"]
    with pytest.raises(ValueError):
        generate_problems("dev", 1)


def test_difficulty_knob():
    easy = generate_problems("test", 100, difficulty="easy")
    assert all(len(p.ops) <= 3 and p.start <= 50 for p in easy)
    custom = generate_problems("test", 50, difficulty=Difficulty(min_ops=2, max_ops=2, max_operand=9))
    assert all(len(p.ops) == 2 for p in custom)
    assert all(b <= 9 for p in custom for _, b in p.ops)


def test_concise_shorter_than_verbose():
    probs = generate_problems("validation", 100)
    c = sum(len(p.solution("concise")) for p in probs)
    v = sum(len(p.solution("verbose")) for p in probs)
    assert c <= 0.6 * v


def test_gold_solutions_all_correct():
    for p in generate_problems("validation", 300):
        for style in STYLES:
            text = p.solution(style)
            assert all(check_steps(p, split_steps(text))), (p.problem, style)
            assert is_correct(p, text)
            assert first_wrong_step(p, split_steps(text)) is None


def test_corruptions_detected():
    rng = random.Random(0)
    for p in generate_problems("train", 300):
        for style in STYLES:
            for kind in ("slip", "carry", "link", "operand", "value", "answer", "misread"):
                steps = corrupt_steps(p, style, rng, kind)
                assert not all(check_steps(p, steps)), (p.problem, style, kind, steps)


def test_misread_applies_another_steps_operation():
    """The LLM's commonest mistake: it repeats an operation or operand of the problem, or jumps
    ahead. A misread step's chain starts from the true running value with an operation or
    operand taken from elsewhere in the problem."""
    rng = random.Random(2)
    n, from_the_problem, other_operand = 0, 0, 0
    for p in generate_problems("train", 300):
        if len(p.ops) < 2:
            continue
        steps = corrupt_steps(p, "concise", rng, "misread")
        k = first_wrong_step(p, steps)
        a, op, b = steps[k].split(" = ")[0].split()
        assert int(a) == p.values[k] and (op, int(b)) != p.ops[k]
        n += 1
        # (a perturbed operand only where no other step's operation fits the running value)
        from_the_problem += int(b) in {x for _, x in p.ops} or op != p.ops[k][0]
        other_operand += int(b) != p.ops[k][1]
    assert from_the_problem > 0.9 * n and other_operand > 0.3 * n


def test_unknown_corruption_kind_is_refused(example):
    with pytest.raises(ValueError, match="unknown corruption kind 'typo'"):
        corrupt_steps(example, "concise", random.Random(0), "typo")


def test_random_corruption_never_draws_misread():
    """Drawing a kind at random keeps the six original kinds (the tokenizer corpus and the
    judge's examples depend on these draws)."""
    rng = random.Random(0)
    for p in generate_problems("train", 200):
        for _ in range(3):
            steps = corrupt_steps(p, "concise", rng)
            k = first_wrong_step(p, steps)
            if k < len(p.ops):
                assert steps[k].split(" = ")[0].split()[1] == p.ops[k][0]


def test_wrong_step_propagates(example):
    steps = ["47 + 38 = 86", "86 * 6 = 516", "516 - 129 = 387", "\\boxed{387}"]
    assert check_steps(example, steps) == [False, False, False, False]
    assert first_wrong_step(example, steps) == 0
    # arithmetic right but wrong running value
    steps = ["47 + 38 = 85", "84 * 6 = 504", "504 - 129 = 375", "\\boxed{375}"]
    assert check_steps(example, steps) == [True, False, False, False]
    # wrong operand
    assert check_steps(example, ["47 + 39 = 86"]) == [False]
    # box before all operations are done
    assert check_steps(example, ["47 + 38 = 85", "\\boxed{85}"]) == [True, False]


def test_locate_errors_points_inside_the_step(example):
    steps = ["47 + 38 = 47 + 30 + 8 = 77 + 8 = 86", "86 * 6 = 516", "Multiplying by 6: 85 * 6 = 510.", "\\boxed{387}"]
    spans = locate_errors(example, steps)
    assert [span is None for span in spans] == check_steps(example, steps)
    good, bad = spans[0]  # right up to "77 + 8", wrong once "86" is written
    assert steps[0][:good] == "47 + 38 = 47 + 30 + 8 = 77 + 8" and steps[0][:bad] == steps[0]
    assert steps[1][: spans[1][1]] == "86"  # builds on the wrong value: wrong from its first number
    assert spans[2] is None and spans[3] == (0, len(steps[3]))
    rng = random.Random(1)
    for p in generate_problems("train", 200):
        for style in STYLES:
            bad_steps = corrupt_steps(p, style, rng)
            spans = locate_errors(p, bad_steps)
            assert [span is None for span in spans] == check_steps(p, bad_steps)
            assert all(0 <= span[0] < span[1] <= len(step) for step, span in zip(bad_steps, spans) if span)
            assert all(span is None for span in locate_errors(p, p.steps(style)))


def test_mixed_styles_and_fragments(example):
    steps = [
        "We start with 47.",
        "47 + 38 = 85",
        "Multiplying by 6: 85 * 6 = 80 * 6 + 5 * 6 = 480 + 30 = 510. Check: 510 / 6 = 85.",
        "510 - 129 = 381",
        "So the answer is \\boxed{381}.",
    ]
    assert check_steps(example, steps) == [True] * 5
    assert check_steps(example, ["We start with 48."]) == [False]
    assert check_steps(example, ["Adding 38:", "47 + 38 = 85"]) == [True, True]
    # a wrong decomposition link or a wrong check makes the step wrong
    assert check_steps(example, ["Adding 38: 47 + 38 = 47 + 30 + 8 = 76 + 8 = 85."]) == [False]
    assert check_steps(example, ["Adding 38: 47 + 38 = 85. Check: 85 - 38 = 46."]) == [False]
    # a check that coincides with the next operation is not taken as that operation
    p = make_problem(8, [("-", 6), ("+", 18), ("-", 18)])
    assert all(check_steps(p, p.steps("verbose")))


def test_extract_boxed():
    assert extract_boxed("a \\boxed{12} b \\boxed{ 13 }") == "13"
    assert extract_boxed("no box") is None
