"""The testbed's exact step checker: which steps of a solution are correct, where the first
error is, and the final answer of a solution (tolerant to mixtures of the two solution styles)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from .problems import STEP_SEPARATOR, TestbedProblem, apply_op

_INT = r"-?\d+"
_EXPR = rf"{_INT}(?:\s*[-+*/×x]\s*{_INT})*"
_CHAIN_RE = re.compile(rf"{_EXPR}(?:\s*=\s*{_EXPR})+")
_BOXED_RE = re.compile(r"\\boxed\{\s*([^{}]*?)\s*\}")
_BIN_RE = re.compile(rf"^\s*({_INT})\s*([-+*/×x])\s*({_INT})\s*$")
_NUM_RE = re.compile(r"\d+")


def eval_expr(expr: str) -> int | None:
    """Integer value of ``a op b op c ...`` with the usual precedence; None if invalid."""
    expr = re.sub(r"\s", "", expr.replace("×", "*").replace("x", "*"))
    toks = re.findall(rf"(?<!\d){_INT}|[-+*/]", expr)  # a minus right after a number is an operator, not a sign
    if not toks or len(toks) % 2 == 0:
        return None
    try:  # a sum of signed terms, each a product (or exact quotient) of numbers
        total, sign, term = 0, 1, int(toks[0])
        for op, value in zip(toks[1::2], toks[2::2]):
            if op in ("*", "/"):
                term = apply_op(term, op, int(value))
            else:
                total, sign, term = total + sign * term, 1 if op == "+" else -1, int(value)
    except ValueError:
        return None
    return total + sign * term


def check_steps(problem: TestbedProblem, steps: Sequence[str]) -> list[bool]:
    """For each step, whether it is correct, by the rules of docs/testbed.md, "Step checker"; beyond
    them, a check is never an attempt, and a step makes at most one attempt unless a later chain
    starts exactly from the true running value."""
    ops = list(problem.ops)
    true_vals = problem.values
    k = 0  # index of the next operation
    out: list[bool] = []
    for step in steps:
        ok = True
        known = {true_vals[k]}
        chains = list(_CHAIN_RE.finditer(step))
        boxes = list(_BOXED_RE.finditer(step))
        attempted = False
        for m in chains:
            exprs = [e.strip() for e in m.group(0).split("=")]
            vals = [eval_expr(e) for e in exprs]
            arith_ok = None not in vals and len(set(vals)) == 1
            binary = _BIN_RE.match(exprs[0])  # "a op b": an operation's attempt, or a restatement
            first = (int(binary[1]), {"×": "*", "x": "*"}.get(binary[2], binary[2]), int(binary[3])) if binary else None
            is_check = "check" in step[max(0, m.start() - 12) : m.start()].lower()
            if first is not None and not is_check and k < len(ops) and first[1:] == ops[k] and (not attempted or first[0] == true_vals[k]):
                attempted = True  # an attempt at the next operation
                ok &= arith_ok and first[0] == true_vals[k]
                k += 1
                known.add(true_vals[k])
            elif is_check:
                head = eval_expr(exprs[0].split(" ")[0]) if exprs[0] else None
                ok &= arith_ok and head in known | {true_vals[k]}
            else:
                # only a restatement of an operation already done is allowed
                done = {(true_vals[i], op, b) for i, (op, b) in enumerate(ops[:k])}
                ok &= arith_ok and first is not None and first in done
            if arith_ok and vals:
                known.update(v for v in vals if v is not None)
        for m in boxes:
            ok &= m.group(1).strip() == problem.answer and k == len(ops)
        if not chains and not boxes:  # words only: each number is the running value, the start or the next operand
            allowed = {true_vals[k], problem.start, *(ops[k][1:] if k < len(ops) else ())}
            ok &= all(int(x) in allowed for x in _NUM_RE.findall(step))
        out.append(bool(ok))
    return out


def first_wrong_step(problem: TestbedProblem, steps: Sequence[str]) -> int | None:
    """Index of the first wrong step, or None if all steps are correct."""
    return next((i for i, good in enumerate(check_steps(problem, steps)) if not good), None)


def locate_errors(problem: TestbedProblem, steps: Sequence[str]) -> list[tuple[int, int] | None]:
    """Per step, None if it is correct, else ``(good, bad)`` character offsets: ``step[:good]`` is
    still correct and ``step[:bad]`` already wrong, judged at the ends of expressions (the only
    places a prefix can be judged on its own). The testbed PRM's dense labels."""
    located: list[tuple[int, int] | None] = []
    for k, (step, ok) in enumerate(zip(steps, check_steps(problem, steps))):
        if ok:
            located.append(None)
            continue
        good, bad = 0, len(step)
        for cut in _expression_ends(step):
            if not check_steps(problem, [*steps[:k], step[:cut]])[-1]:
                bad = cut
                break
            good = cut
        located.append((good, bad))
    return located


def _expression_ends(step: str) -> list[int]:
    """Offsets (exclusive, before the step's end) where a whole expression of `step` ends."""
    ends: set[int] = set()
    for m in _CHAIN_RE.finditer(step):
        chain = m.group(0)
        first = _NUM_RE.search(chain)
        assert first is not None, "a chain starts with a number (_EXPR)"
        ends.add(m.start() + first.end())  # the value a chain starts from
        ends.update(m.start() + len(chain[:i].rstrip()) for i, c in enumerate(chain) if c == "=")
        ends.add(m.end())
    ends.update(m.end() for m in _BOXED_RE.finditer(step))
    return sorted(e for e in ends if 0 < e < len(step))


def split_steps(text: str) -> list[str]:
    """Steps of a solution text (``text.split("\\n\\n")``, empty trailing parts dropped)."""
    parts = text.split(STEP_SEPARATOR)
    while parts and not parts[-1].strip():
        parts.pop()
    return parts


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} in ``text``, stripped; None if absent."""
    found = _BOXED_RE.findall(text)
    return found[-1].strip() if found else None


def is_correct(problem: TestbedProblem, text: str) -> bool:
    """Final-answer grading: the last \\boxed{} equals the gold answer."""
    return extract_boxed(text) == problem.answer
