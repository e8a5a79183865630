"""pass@1 for code benchmarks: extract the program from a response, run the benchmark's tests on it
in the sandbox (rstitch/grading/sandbox.py), and call it right iff every test passes.

A record's ``metadata["tests"]`` says how it is tested:

- ``{"kind": "script", "prefix": ..., "suffix": ...}``: one program ``prefix + code + suffix``
  (HumanEval: the prompt before, ``check(entry_point)`` after; MBPP: the asserts after) that must
  exit with status 0;
- ``{"kind": "stdio", "cases": [{"input", "output"}, ...]}``: the program reads each input on
  stdin and must print the output (LiveCodeBench stdin problems);
- ``{"kind": "functional", "func_name": ..., "cases": [...]}``: ``Solution().<func_name>(*args)``
  with each case's JSON arguments must return its JSON output (LiveCodeBench LeetCode problems).
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from rstitch.grading.extract import THINK_END
from rstitch.grading.sandbox import SandboxLimits, SandboxResult, run_python

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"", "python", "python3", "py"}
FLOAT_TOLERANCE = 1e-6


def extract_program(response: str) -> str | None:
    """The last fenced Python block of the final answer (text after ``</think>``), else of the whole
    response; None when there is no fenced block (prose is not run)."""
    parts = [response.rsplit(THINK_END, 1)[1], response] if THINK_END in response else [response]
    for part in parts:
        blocks = [code for tag, code in _FENCE_RE.findall(part) if tag.lower() in _PYTHON_TAGS]
        if blocks and blocks[-1].strip():
            return blocks[-1]
    return None


def grade_code(response: str, tests: Mapping[str, Any], limits: SandboxLimits | None = None) -> dict[str, Any]:
    """A sample's ``answer`` (the program), ``correct`` and ``code`` (how the tests went)."""
    program = extract_program(response)
    if program is None:
        return {"answer": None, "correct": False, "code": {"status": "no_program", "passed": 0, "total": _count(tests)}}
    outcome = run_tests(program, tests, limits)
    return {"answer": program, "correct": outcome["passed"] == outcome["total"] > 0, "code": outcome}


def run_tests(program: str, tests: Mapping[str, Any], limits: SandboxLimits | None = None) -> dict[str, Any]:
    """Run ``tests`` against ``program``; stops at the first failing case (pass@1 needs them all)."""
    kind = tests.get("kind")
    if kind == "script":
        source = f"{tests.get('prefix', '')}\n{program}\n{tests.get('suffix', '')}\n"
        return _summary([run_python(source, limits=limits)], 1)
    if kind == "stdio":
        return _run_stdio(program, tests["cases"], limits)
    if kind == "functional":
        source = program + "\n" + _functional_harness(tests["func_name"], tests["cases"])
        return _summary([run_python(source, limits=limits)], 1)
    raise ValueError(f"unknown code test kind {kind!r}; valid: script, stdio, functional")


def _count(tests: Mapping[str, Any]) -> int:
    return len(tests["cases"]) if tests.get("kind") == "stdio" else 1


def _run_stdio(program: str, cases: list[Mapping[str, str]], limits: SandboxLimits | None) -> dict[str, Any]:
    results: list[SandboxResult] = []
    for case in cases:
        result = run_python(program, stdin=case["input"], limits=limits)
        if result.ok and not outputs_match(result.stdout, case["output"]):
            result = SandboxResult("wrong_output", result.exit_code, result.stdout, result.stderr,
                                   result.duration_s, result.isolation)
        results.append(result)
        if not result.ok:
            break
    return _summary(results, len(cases))


def outputs_match(printed: str, expected: str) -> bool:
    """Line by line after trimming trailing whitespace; tokens that are both numbers may differ
    by 1e-6 (LiveCodeBench's checker allows float answers that way)."""
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


def _functional_harness(func_name: str, cases: list[Mapping[str, str]]) -> str:
    """Calls ``Solution().func_name`` on each case; a wrong result exits with status 1."""
    payload = json.dumps([[case["input"], case["output"]] for case in cases])
    return (
        "\nimport json as _json, sys as _sys\n"
        f"for _args, _expected in _json.loads({payload!r}):\n"
        "    _values = [_json.loads(_line) for _line in _args.split('\\n') if _line.strip()]\n"
        f"    _got = getattr(Solution(), {func_name!r})(*_values)\n"
        "    if isinstance(_got, tuple): _got = list(_got)\n"
        "    if _got != _json.loads(_expected): _sys.exit(1)\n"
    )


def _summary(results: list[SandboxResult], total: int) -> dict[str, Any]:
    passed = sum(1 for r in results if r.ok)
    last = results[-1]
    summary: dict[str, Any] = {"status": last.status, "passed": passed, "total": total,
                               "seconds": round(sum(r.duration_s for r in results), 3)}
    if not last.ok:
        summary["stderr_tail"] = last.stderr[-500:]
    return summary
