"""Synthetic multi-step arithmetic word problems, the offline testbed task, in two solution styles
(docs/testbed.md, "The task"); the step checker is in ``checking.py``, injected errors in ``corruption.py``."""

from __future__ import annotations

import hashlib
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

STEP_SEPARATOR = "\n\n"
SPLITS = ("train", "validation", "test")
STYLES = ("concise", "verbose")
MAX_VALUE = 999  # every running value stays in [0, MAX_VALUE]

_OP_WORDS = {"+": "add", "-": "subtract", "*": "multiply by"}
OP_GERUNDS = {"+": "Adding", "-": "Subtracting", "*": "Multiplying by"}
INVERSE = {"+": "-", "-": "+", "*": "/"}
_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul}


@dataclass(frozen=True)
class Difficulty:
    """Difficulty knob of the generator: min_ops..max_ops operations (uniform), start <= max_start,
    add/subtract operands <= max_operand; p_mul is the chance of a multiplication when one is possible
    (running value < 100), by a multiplier uniform in [2, max_multiplier]."""

    min_ops: int = 1
    max_ops: int = 6
    max_start: int = 50
    max_operand: int = 50
    max_multiplier: int = 9
    p_mul: float = 0.35

    def __post_init__(self) -> None:
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}")
        if not 1 <= self.max_start <= MAX_VALUE or not 1 <= self.max_operand <= MAX_VALUE:
            raise ValueError("max_start and max_operand must be in [1, 999]")
        if not 2 <= self.max_multiplier <= 9:
            raise ValueError("max_multiplier must be in [2, 9]")


DIFFICULTIES = {
    "easy": Difficulty(min_ops=1, max_ops=3, max_start=50, max_operand=30, max_multiplier=5),
    "medium": Difficulty(),
    "hard": Difficulty(min_ops=4, max_ops=6, max_start=99, max_operand=99, p_mul=0.45),
}


def apply_op(value: int, op: str, operand: int) -> int:
    if op == "/":
        if operand == 0 or value % operand:
            raise ValueError("inexact division")
        return value // operand
    if op not in _APPLY:
        raise ValueError(f"unknown op {op!r}")
    return _APPLY[op](value, operand)


def equation_chain(a: int, op: str, b: int) -> list[str]:
    """Expressions of the verbose chain ``a op b = ... = c`` (tens first, then ones)."""
    c = apply_op(a, op, b)
    if op in "+-":
        tens, ones = b - b % 10, b % 10
        if tens == 0 or ones == 0:
            return [f"{a} {op} {b}", str(c)]
        mid = apply_op(a, op, tens)
        return [f"{a} {op} {b}", f"{a} {op} {tens} {op} {ones}", f"{mid} {op} {ones}", str(c)]
    # multiplication: two-digit by one-digit
    tens, ones = a - a % 10, a % 10
    if tens == 0 or ones == 0:
        return [f"{a} * {b}", str(c)]
    return [f"{a} * {b}", f"{tens} * {b} + {ones} * {b}", f"{tens * b} + {ones * b}", str(c)]


def render_steps(style: str, start: int, chains: Sequence[tuple[int, str, int, list[str]]], answer: object) -> list[str]:
    """A solution's steps in ``style`` from its chains ``(a, op, b, [a op b, ..., c])`` as written."""
    if style == "concise":
        return [" = ".join(chain) for *_, chain in chains] + [f"\\boxed{{{answer}}}"]
    if style == "verbose":
        lines = [f"{OP_GERUNDS[op]} {b}: {' = '.join(chain)}. Check: {chain[-1]} {INVERSE[op]} {b} = {a}." for a, op, b, chain in chains]
        return [f"We start with {start}.", *lines, f"So the answer is \\boxed{{{answer}}}."]
    raise ValueError(f"unknown style {style!r}; choose from {STYLES}")


@dataclass
class TestbedProblem:
    """One problem: ``start`` followed by ``ops`` = [(op, operand), ...], op in "+-*"."""

    __test__ = False  # not a pytest test class

    id: str
    problem: str
    answer: str
    ops: list[tuple[str, int]]
    start: int
    split: str = ""
    metadata: dict = field(default_factory=dict)

    @property
    def values(self) -> list[int]:
        """Running values: [start, after op 1, ..., after last op]."""
        return list(accumulate(self.ops, lambda value, op_b: apply_op(value, *op_b), initial=self.start))

    def steps(self, style: str = "concise") -> list[str]:
        chains = [(a, op, b, equation_chain(a, op, b)) for a, (op, b) in zip(self.values, self.ops)]
        return render_steps(style, self.start, chains, self.answer)

    def solution(self, style: str = "concise") -> str:
        return STEP_SEPARATOR.join(self.steps(style))

    def to_record(self) -> dict:
        metadata = {"source": "rstitch-testbed", "split": self.split, "start": self.start, "ops": [[op, b] for op, b in self.ops],
                    "num_ops": len(self.ops), **self.metadata}
        return {"id": self.id, "problem": self.problem, "answer": self.answer, "metadata": metadata}


def canonical_form(start: int, ops: Sequence[tuple[str, int]]) -> str:
    return f"{start}" + "".join(f"{op}{b}" for op, b in ops)


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def split_of(start: int, ops: Sequence[tuple[str, int]]) -> str:
    bucket = _stable_hash(canonical_form(start, ops)) % 100
    return "train" if bucket < 80 else "validation" if bucket < 90 else "test"  # 80%, 10%, 10%


def problem_text(start: int, ops: Sequence[tuple[str, int]]) -> str:
    phrases = [f"{_OP_WORDS[op]} {b}" for op, b in ops]
    phrases[0] = phrases[0][0].upper() + phrases[0][1:]
    return f"Start with {start}. " + ", then ".join(phrases) + ". What is the result?"


def make_problem(start: int, ops: Sequence[tuple[str, int]], split: str | None = None) -> TestbedProblem:
    ops = [(str(op), int(b)) for op, b in ops]
    canon = canonical_form(start, ops)
    p = TestbedProblem(
        id="tb-" + hashlib.sha256(canon.encode()).hexdigest()[:12],
        problem=problem_text(start, ops),
        answer="",
        ops=ops,
        start=int(start),
        split=split or split_of(start, ops),
    )
    vals = p.values
    if any(v < 0 or v > MAX_VALUE for v in vals):
        raise ValueError(f"running values out of range: {vals}")
    p.answer = str(vals[-1])
    return p


def _sample_ops(rng: random.Random, d: Difficulty) -> tuple[int, list[tuple[str, int]]]:
    start = rng.randint(1, d.max_start)
    n = rng.randint(d.min_ops, d.max_ops)
    value, ops = start, []
    for _ in range(n):
        if value < 100 and rng.random() < d.p_mul:
            op, b = "*", rng.randint(2, d.max_multiplier)
        else:
            op = rng.choice([sign for sign, possible in (("+", value + 1 <= MAX_VALUE), ("-", value >= 1)) if possible])
            hi = min(d.max_operand, MAX_VALUE - value) if op == "+" else min(d.max_operand, value)
            b = rng.randint(1, hi)
        ops.append((op, b))
        value = apply_op(value, op, b)
    return start, ops


def generate_problems(split: str, n: int, seed: int = 0, difficulty: Difficulty | str | None = None) -> list[TestbedProblem]:
    """``n`` distinct problems of ``split`` ("train" | "validation" | "test"), deterministic in
    (split, n, seed, difficulty); the first k problems of a call with n >= k are those of n = k."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {SPLITS}")
    if isinstance(difficulty, str) and difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose from {sorted(DIFFICULTIES)}")
    d = DIFFICULTIES[difficulty or "medium"] if not isinstance(difficulty, Difficulty) else difficulty
    rng = random.Random(_stable_hash(f"rstitch-testbed/{split}/{seed}"))
    out: list[TestbedProblem] = []
    seen: set[str] = set()
    for _ in range(200 * n + 10_000):
        if len(out) == n:
            return out
        start, ops = _sample_ops(rng, d)
        canon = canonical_form(start, ops)
        if canon not in seen and split_of(start, ops) == split:
            seen.add(canon)
            out.append(make_problem(start, ops, split))
    if len(out) < n:
        raise RuntimeError(f"could not generate {n} distinct {split} problems with {d}")
    return out
