"""pass@1 for code benchmarks: the response's program is right iff every test passes in the sandbox
(docs/sandbox.md, "What a pass means"). ``metadata["tests"]``: ``{"kind": "script", "prefix",
"suffix"}`` (HumanEval, MBPP), ``{"kind": "stdio", "cases"}`` or ``{"kind": "functional",
"func_name", "cases"}`` (LiveCodeBench stdin and LeetCode)."""
from __future__ import annotations

import dataclasses
import itertools
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from rstitch.grading.code_harness import HARNESS
from rstitch.grading.extract import search_order
from rstitch.grading.sandbox import SandboxLimits, SandboxResult, run_python

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"", "python", "python3", "py"}
FLOAT_TOLERANCE = 1e-6


def extract_program(response: str) -> str | None:
    """The last fenced Python block of the final answer, else of the whole response (prose is not run)."""
    for part in search_order(response):
        blocks = [code for tag, code in _FENCE_RE.findall(part) if tag.lower() in _PYTHON_TAGS]
        if blocks and blocks[-1].strip():
            return blocks[-1]
    return None


def grade_code(response: str, tests: Mapping[str, Any], limits: SandboxLimits | None = None) -> dict[str, Any]:
    """A sample's ``answer`` (the program), ``correct`` and ``code`` (how the tests went)."""
    program = extract_program(response)
    if program is None:
        total = len(tests["cases"]) if tests.get("kind") in ("stdio", "functional") else 1
        return {"answer": None, "correct": False, "code": {"status": "no_program", "passed": 0, "total": total}}
    outcome = run_tests(program, tests, limits)
    correct = outcome["status"] == "ok" and outcome["passed"] == outcome["total"] > 0
    return {"answer": program, "correct": correct, "code": outcome}


def run_tests(program: str, tests: Mapping[str, Any], limits: SandboxLimits | None = None) -> dict[str, Any]:
    """Run ``tests`` against ``program``; stops at the first failing case (pass@1 needs them all)."""
    kind = tests.get("kind")
    if kind in ("stdio", "functional") and not tests.get("cases"):
        raise ValueError(f"the {kind} tests have no cases: a program cannot pass them")
    if kind == "script":
        setup_and_program = f"{tests.get('prefix', '')}\n{program}\n"
        return _run_harness("script", "", setup_and_program, str(tests.get("suffix", "")), [], limits)
    if kind == "stdio":
        results: list[SandboxResult] = []
        for case in tests["cases"]:
            result = run_python(program, stdin=case["input"], limits=limits)
            if result.ok and not outputs_match(result.stdout, case["output"]):
                result = dataclasses.replace(result, status="wrong_output")
            results.append(result)
            if not result.ok:
                break
        return _summary(results, len(tests["cases"]))
    if kind == "functional":
        # one JSON value per line: the method's arguments in order
        calls = [[json.loads(line) for line in case["input"].split("\n") if line.strip()] for case in tests["cases"]]
        expected = [json.loads(case["output"]) for case in tests["cases"]]
        return _run_harness("functional", str(tests["func_name"]), program, "", calls, limits, expected)
    raise ValueError(f"unknown code test kind {kind!r}; valid: script, stdio, functional")


def outputs_match(printed: str, expected: str) -> bool:
    """Line by line, trailing whitespace aside; numbers may differ by 1e-6 (as LiveCodeBench's checker)."""
    got, want = printed.strip().splitlines(), expected.strip().splitlines()
    if [line.rstrip() for line in got] == [line.rstrip() for line in want]:
        return True
    got_tokens, want_tokens = printed.split(), expected.split()
    return len(got_tokens) == len(want_tokens) and all(map(_tokens_match, got_tokens, want_tokens))


def _tokens_match(got: str, want: str) -> bool:
    if got == want:
        return True
    try:
        return abs(float(got) - float(want)) <= FLOAT_TOLERANCE * max(1.0, abs(float(want)))
    except ValueError:
        return False


def _run_harness(kind: str, func_name: str, program: str, tests: str, calls: list[list[Any]],
                 limits: SandboxLimits | None, expected: Sequence[Any] = ()) -> dict[str, Any]:
    """Run the program under ``HARNESS``; a pass needs every expected result (compared here, never
    inside the program), then this run's secret marker (docs/sandbox.md, "What a pass means")."""
    secret = secrets.token_hex(16)
    call = f"_rstitch_harness({kind!r}, {func_name!r}, {program!r}, {tests!r}, {json.dumps(calls)!r})\n"
    result = run_python(HARNESS + call, stdin=secret + "\n", limits=limits)
    lines = result.report.split("\n")
    passed = len(list(itertools.takewhile(lambda pair: _result_matches(*pair), zip(lines, expected))))
    ran_to_end = passed == len(expected) and lines[len(expected):] == [f"done {secret}", ""]
    if result.ok and not ran_to_end:
        result = dataclasses.replace(result, status="wrong_output" if passed < len(expected) else "incomplete")
    if kind == "script":
        return _summary([result], 1)
    return _summary([result], len(expected), passed=passed)


def _result_matches(line: str, want: Any) -> bool:
    try:
        return bool(json.loads(line) == want)
    except ValueError:
        return False


def _summary(results: list[SandboxResult], total: int, passed: int | None = None) -> dict[str, Any]:
    passed = sum(1 for r in results if r.ok) if passed is None else passed
    last = results[-1]
    summary: dict[str, Any] = {"status": last.status, "passed": passed, "total": total,
                               "seconds": round(sum(r.duration_s for r in results), 3)}
    if not last.ok:
        summary["stderr_tail"] = last.stderr[-500:]
    return summary
