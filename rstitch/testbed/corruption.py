"""Wrong solutions of testbed problems: one injected error (a slip, a wrong carry, a broken link
between steps, a misread operand or value, a wrong answer) that later steps carry forward; the
judge, PRM and router training data."""

from __future__ import annotations

import random

from .checking import eval_expr
from .problems import MAX_VALUE, TestbedProblem, apply_op, equation_chain, render_steps

CORRUPTION_KINDS = ("slip", "carry", "link", "operand", "value", "answer")  # drawn when no kind is given


def corrupt_steps(problem: TestbedProblem, style: str, rng: random.Random, kind: str | None = None) -> list[str]:
    """A solution with one injected error of `kind` (docs/testbed.md, "Step checker"), carried
    forward: later steps compute correctly from the wrong value, as a model that slipped would.
    "misread" is chosen only when asked for by name, so that drawing a random kind stays as it was."""
    kind = kind or rng.choice(CORRUPTION_KINDS)
    if kind not in (known := (*CORRUPTION_KINDS, "misread")):
        raise ValueError(f"unknown corruption kind {kind!r}; choose from {known}")
    j = rng.randrange(len(problem.ops))  # operation where the error happens
    lines_ops: list[tuple[int, str, int, list[str]]] = []  # (a, op, b, chain) as written
    cur = problem.start
    for i, (op, b) in enumerate(problem.ops):
        a, bb = cur, b
        if i == j and kind == "value":
            a = _perturb(cur, rng)
        if i == j and kind == "operand":
            bb = _perturb(b, rng, lo=1 if op != "*" else 2, hi=9 if op == "*" else MAX_VALUE)
        if i == j and kind == "misread":
            op, bb = _misread(problem.ops, i, a, rng)
        c = apply_op(a, op, bb) if (op != "-" or a >= bb) else abs(a - bb)
        if i == j and kind in ("slip", "carry"):
            c = _perturb(c, rng, carry=(kind == "carry"))
        if 0 <= apply_op(a, op, bb) and (op != "*" or a < 100):  # written as the true chain, its result slipped
            chain = equation_chain(a, op, bb)
            chain[-1] = str(c)  # a slip of the result lands on the last link
            if i == j and kind == "link":
                chain, c = _slip_inside(chain, rng)
        else:
            chain = [f"{a} {op} {bb}", str(c)]
        lines_ops.append((a, op, bb, chain))
        cur = c
    return render_steps(style, problem.start, lines_ops, _perturb(cur, rng) if kind == "answer" else cur)


def _misread(ops: list[tuple[str, int]], i: int, value: int, rng: random.Random) -> tuple[str, int]:
    """Operation i read wrongly: another step's operation and/or operand (the LLM repeats the
    previous one or jumps ahead), or, in a one-step problem, the other of + and -."""
    op, b = ops[i]
    options = {(o, x) for k, (o2, x2) in enumerate(ops) if k != i for o, x in ((o2, x2), (op, x2), (o2, b))}
    options |= {("-" if op == "+" else "+", b)} if op != "*" else set()
    valid = sorted(
        (o, x) for o, x in options
        if (o, x) != (op, b) and (o != "*" or (2 <= x <= 9 and value < 100))
        and 0 <= apply_op(value, o, x) <= MAX_VALUE
    )
    if not valid:
        return op, _perturb(b, rng, lo=1 if op != "*" else 2, hi=9 if op == "*" else MAX_VALUE)
    return rng.choice(valid)


def _slip_inside(chain: list[str], rng: random.Random) -> tuple[list[str], int]:
    """The chain with a slip on its partial result (``77 + 8`` -> ``78 + 8``), computed on
    from there; a chain without a partial result gets the slip on its result."""
    if len(chain) >= 4:
        left, op, right = chain[2].split(" ")
        left = str(_perturb(int(left), rng, hi=MAX_VALUE))
        partial = eval_expr(f"{left} {op} {right}")
        if partial is not None and 0 <= partial <= MAX_VALUE:
            return [chain[0], chain[1], f"{left} {op} {right}", str(partial)], partial
    c = _perturb(int(chain[-1]), rng)
    return [*chain[:-1], str(c)], c


def _perturb(x: int, rng: random.Random, lo: int = 0, hi: int = MAX_VALUE, carry: bool = False) -> int:
    for _ in range(50):
        if carry:
            y = x + rng.choice([-10, 10, -100, 100, -1, 1])
        else:
            digits = list(str(x))
            i = rng.randrange(len(digits))
            digits[i] = str((int(digits[i]) + rng.choice([1, 2, 3, 7, 8, 9])) % 10)
            y = int("".join(digits))
        if y != x and lo <= y <= hi:
            return y
    return x + 1 if x + 1 <= hi else x - 1
