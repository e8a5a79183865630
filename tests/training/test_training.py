"""rstitch/training: R-Stitch+'s router training loop and its data (scripts/train_router.py only
parses arguments and calls these)."""
from __future__ import annotations

import json

import pytest
import torch

from rstitch.data.prompts import PromptFormat
from rstitch.latency.model import LatencyModel
from rstitch.testbed import generate_problems
from rstitch.training.dapo import RolloutSettings
from rstitch.training.fit_rstitch_router import TrainSettings, new_router, train_router, training_problems, write_history


def test_testbed_training_problems_come_from_the_registry_unchanged():
    assert training_problems("testbed", 5, seed=3) == [(p.problem, p.answer) for p in generate_problems("train", 5, seed=3)]
    with pytest.raises(ValueError, match="unknown training data 'nope'; valid: testbed, dapo"):
        training_problems("nope", 1, 0)


def test_a_new_router_starts_at_the_asked_llm_probability(tiny_runners):
    router = new_router(tiny_runners, init_p_llm=0.9)
    bias = router.head.bias.detach()
    assert torch.softmax(bias, dim=0)[1].item() == pytest.approx(0.9)  # the head's prior: logits [0, logit(0.9)]


def test_train_router_takes_dapo_steps_and_logs_each(tiny_runners, tmp_path):
    """Every rollout counts as correct (random models), so rewards differ by latency alone: the
    groups are informative, the router's weights move, and each step is logged once."""
    torch.manual_seed(0)
    router = new_router(tiny_runners, init_p_llm=0.5)
    with torch.no_grad():
        router.head.weight.mul_(0.01)  # P(LLM) near the head's prior for any state: a group's rollouts differ
    before = [p.detach().clone() for p in router.parameters()]
    latency = {k: LatencyModel(0.0, 0.0, 1e-3 * (1 + 9 * (k == "llm")), 0.0, model=m.name) for k, m in tiny_runners.models().items()}
    rollout = RolloutSettings(tau=-1.0, max_new_tokens=6, grade_answers=False)  # tau < 0: the router decides every position
    settings = TrainSettings(lam=10.0, rollout=rollout, batch=1, group=4, updates=2, steps=2)
    logged: list[dict] = []
    history = train_router(router, tiny_runners, [("1+1?", "2"), ("2+2?", "4")], PromptFormat(), latency, settings, lr=0.05,
                           log=logged.append)
    assert logged == history and [row["step"] for row in history] == [1, 2]
    assert history[0]["kept_groups"] == 1 and history[0]["router_decisions"] > 0 and history[0]["loss"] == history[0]["loss"]
    assert any(not torch.equal(a, b) for a, b in zip(before, router.parameters()))
    write_history(history, tmp_path)
    assert json.loads((tmp_path / "training_log.json").read_text())[1]["step"] == 2
    assert (tmp_path / "training_log.csv").read_text().splitlines()[0].startswith("step,reward,accuracy")


# --------------------------------------------------------------------------- Arbitrage's router

def test_arbitrage_labels_are_balanced_and_evaluated_per_class():
    import random

    import numpy as np

    from rstitch.training.fit_arbitrage_router import Example, balanced, evaluate

    examples = [Example("p", [], f"d{i}", delta) for i, delta in enumerate([0.5, 0.2, -0.1, 0.0, -0.3, -0.4])]
    chosen = balanced(examples, random.Random(0))
    assert sorted(e.delta > 0 for e in chosen) == [False, False, True, True]
    report = evaluate(np.array([0.9, 0.2, 0.4, 0.6]), [0.5, 0.3, -0.1, -0.2])
    assert report["accuracy_class1"] == 0.5 and report["accuracy_class0"] == 0.5 and report["positive_frac"] == 0.5
    assert report["spearman_rho"] == pytest.approx(0.2)  # ranks (4, 1, 2, 3) against (4, 3, 2, 1)


class LengthPRM:
    """Scores a step by its length: the longer of two steps wins (enough to label pairs)."""

    name = "length"

    def score(self, problem: str, steps: list[str]) -> list[float]:
        return [float(len(s)) for s in steps]


def test_arbitrage_paired_steps_label_each_step_and_follow_the_choice(tiny_runners):
    from rstitch.methods.base import LLM
    from rstitch.training.fit_arbitrage_router import LabelSettings, paired_steps

    settings = LabelSettings(max_new_tokens=12, max_step_tokens=4, max_steps=3, gen_batch_size=2, follow="target")
    examples = paired_steps(settings, ["1+1?", "2+3?"], tiny_runners, LengthPRM(), minutes=10)
    assert examples and all(len(e.history) < 3 for e in examples)
    # follow=target: every history holds the target's steps only, and grows by one step per round
    assert all(author == LLM for e in examples for author, _ in e.history)
    by_problem = [[len(e.history) for e in examples if e.problem == p] for p in ("1+1?", "2+3?")]
    assert all(lengths == list(range(len(lengths))) for lengths in by_problem)


def test_arbitrage_router_trains_and_predicts(tiny_pair):
    from rstitch.training.fit_arbitrage_router import Example, FitSettings, encode, load_router, predict, train

    model, tokenizer = load_router(tiny_pair["slm"], "cpu")
    examples = [Example("1+1?", [], "2", 1.0), Example("2+2?", [], "5", -1.0)] * 2
    ids = encode(tokenizer, examples, max_length=64)
    before = [p.detach().clone() for p in model.parameters()]
    report = train(model, ids, [int(e.delta > 0) for e in examples], FitSettings(epochs=2, batch_size=2, lr=1e-2))
    assert report["steps"] == 4
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    y_hat = predict(model, ids, "cpu")
    assert y_hat.shape == (4,) and ((0 <= y_hat) & (y_hat <= 1)).all()


# --------------------------------------------------------------------------- the testbed family

def test_family_schedule_warms_up_then_decays_to_a_tenth():
    from rstitch.training.testbed_family import lr_at

    assert lr_at(0, 1000, 1.0) == pytest.approx(0.01)  # warmup: 100 steps
    assert lr_at(99, 1000, 1.0) == pytest.approx(1.0)
    assert lr_at(999, 1000, 1.0) == pytest.approx(0.1, abs=1e-5)
    assert lr_at(500, 1000, 1.0, time_frac=1.0) == pytest.approx(0.1)  # --schedule-by-time: the cap's fraction wins


def test_family_batches_pad_right_and_mask_the_loss():
    from rstitch.training.testbed_family import collate

    ids, labels, mask = collate(0, [([5, 6, 7], [-100, 6, 7]), ([8], [8])])
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert labels.tolist() == [[-100, 6, 7], [8, -100, -100]]


def test_rows_decoded_together_match_each_row_decoded_alone(tiny_pair):
    """Left padding and the shared KV cache change nothing: each row stops where `ended` says."""
    from transformers import AutoModelForCausalLM

    from rstitch.training.testbed_family import decode_rows

    model = AutoModelForCausalLM.from_pretrained(tiny_pair["slm"]).eval()
    rows = [[5, 6, 7, 8, 9], [10, 11]]
    together = decode_rows(model, rows, 0, lambda i, tokens: len(tokens) >= 4 + i)
    alone = [decode_rows(model, [row], 0, lambda _, tokens, n=4 + i: len(tokens) >= n)[0] for i, row in enumerate(rows)]
    assert together == alone and [len(tokens) for tokens in together] == [4, 5]
    sampled = [decode_rows(model, rows, 0, lambda i, tokens: len(tokens) >= 6, 1.0, torch.Generator().manual_seed(3)) for _ in range(2)]
    assert sampled[0] == sampled[1]  # one generator seed, one draw


def test_family_problem_streams_are_deterministic_and_differ_by_phase():
    from itertools import islice

    from rstitch.training.testbed_family import problem_stream

    first = [p.problem for p in islice(problem_stream(0, "slm"), 5)]
    assert first == [p.problem for p in islice(problem_stream(0, "slm"), 5)]
    assert first != [p.problem for p in islice(problem_stream(0, "llm"), 5)]


def test_family_labelled_samples_carry_the_checker_s_labels():
    import random

    from rstitch.testbed import check_steps, generate_problems
    from rstitch.training.testbed_family import labelled_sample, mixed_steps

    rng = random.Random(0)
    for problem in generate_problems("train", 20, seed=1):
        assert all(check_steps(problem, mixed_steps(problem, rng, corrupt=False)))
        prob, steps, labels = labelled_sample(problem, rng, [])
        assert prob is problem and labels == check_steps(problem, steps)


def test_a_set_number_of_steps_has_no_time_budget_unless_one_is_given(monkeypatch):
    """`--steps N` alone runs N steps however slow the machine (a retrain that reproduces a number
    of steps); without it the budget is 30 minutes; both together keep both."""
    import importlib.util
    import math
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "train_router.py"
    spec = importlib.util.spec_from_file_location("train_router_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def parsed(*argv):
        monkeypatch.setattr(sys, "argv", ["train_router.py", *argv])
        args = script.parse_args()
        return args.steps, args.minutes

    assert parsed() == (100, 30.0)
    assert parsed("--steps", "26") == (26, math.inf)
    assert parsed("--steps", "26", "--minutes", "5") == (26, 5.0)
    assert parsed("--minutes", "22") == (100, 22.0)
