"""rstitch/analysis/step_scores.py: labelled steps of testbed traces and their PRM scores and
ROC-AUC (scripts/measure_testbed.py only parses arguments and renders)."""
from __future__ import annotations

import random

from rstitch.analysis.step_scores import auc_fields, labeled_steps, prm_scores
from rstitch.testbed import STEP_SEPARATOR, corrupt_steps, generate_problems
from rstitch.testbed.problems import STYLES


def test_steps_are_labelled_by_the_exact_checker():
    problem = generate_problems("test", 1, seed=5)[0]
    record = problem.to_record()
    right = problem.solution(STYLES[0])
    wrong = STEP_SEPARATOR.join(corrupt_steps(problem, STYLES[0], random.Random(0)))
    samples = [{"id": record["id"], "response": right}, {"id": record["id"], "response": wrong}]
    steps = labeled_steps(samples, {record["id"]: record["metadata"]})
    n_right = len([t for t in right.split("\n\n") if t.strip()])
    assert all(ok for *_, ok in steps[:n_right]) and not all(ok for *_, ok in steps[n_right:])
    assert all(p == problem.problem for p, *_ in steps)
    assert [len(prefix) for _, prefix, _ in steps[:n_right]] == list(range(1, n_right + 1))


class CountingPRM:
    def __init__(self):
        self.calls = 0

    def score(self, problem: str, steps: list[str]) -> list[float]:
        self.calls += 1
        return [float(len(s)) for s in steps]


def test_prm_scores_each_prefix_once_and_auc_reads_the_labels():
    steps = [("p", ["a"], True), ("p", ["a", "bbb"], True), ("p", ["a", "bbb", "c"], False), ("p", ["a"], True)]
    prm = CountingPRM()
    assert prm_scores(prm, steps) == [1.0, 3.0, 1.0, 1.0] and prm.calls == 3
    fields = auc_fields("auc", [0.9, 0.8, 0.1, 0.7], steps)
    assert fields["auc"] == 1.0 and len(fields["auc_ci95"]) == 2
