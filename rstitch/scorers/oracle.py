"""The exact step checker of the testbed as a PRM: 1.0 for a correct step, 0.0 otherwise (testbed
problems only: the text is parsed back into its start value and operations)."""
from __future__ import annotations

import re
import time
from collections.abc import Sequence

from rstitch.errors import ConfigError
from rstitch.scorers.prm import ProcessRewardModel
from rstitch.testbed.checking import check_steps
from rstitch.testbed.problems import TestbedProblem, make_problem, problem_text

_PROBLEM_RE = re.compile(r"^Start with (\d+)\. (.+)\. What is the result\?$")
_OPERATION_RE = re.compile(r"^(add|subtract|multiply by) (\d+)$")
_OPS_BY_WORD = {"add": "+", "subtract": "-", "multiply by": "*"}


def _not_testbed(text: str) -> ConfigError:
    return ConfigError(
        f"not a testbed problem (the testbed step checker / PRM scores testbed problems only; choose another prm): {text[:80]!r}"
    )


def parse_problem(text: str) -> TestbedProblem:
    """The testbed problem whose text is `text`; ConfigError for any other text (a testbed-only
    scorer asked to score another benchmark)."""
    match = _PROBLEM_RE.match(text.strip())
    if match is None:
        raise _not_testbed(text)
    ops = []
    for phrase in match.group(2).split(", then "):
        op = _OPERATION_RE.match(phrase[:1].lower() + phrase[1:])
        if op is None:
            raise _not_testbed(text)
        ops.append((_OPS_BY_WORD[op.group(1)], int(op.group(2))))
    start = int(match.group(1))
    if problem_text(start, ops) != text.strip():  # round trip: no silently different parse
        raise _not_testbed(text)
    return make_problem(start, ops)


class OracleStepChecker(ProcessRewardModel):
    name = "oracle"
    num_parameters = 0  # a program, not a model: no FLOPs

    def __init__(self) -> None:
        super().__init__()
        self._parsed: dict[str, TestbedProblem] = {}

    def score(self, problem: str, steps: Sequence[str]) -> list[float]:
        start = time.perf_counter()
        if problem not in self._parsed:
            self._parsed[problem] = parse_problem(problem)
        scores = [1.0 if ok else 0.0 for ok in check_steps(self._parsed[problem], list(steps))]
        self.cost.forward_calls += 1
        self.cost.forward_time_s += time.perf_counter() - start
        return scores
