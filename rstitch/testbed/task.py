"""Synthetic multi-step arithmetic word problems: the offline testbed task.

A problem starts from an integer and applies 1-6 operations (add, subtract,
multiply by a one-digit number), e.g.

    Start with 47. Add 38, then multiply by 6, then subtract 129. What is the result?

Every intermediate value stays in [0, 1000); a multiplication is always a
two-digit (or one-digit) number times a one-digit number.

Two solution styles share the step separator "\\n\\n" and end in \\boxed{answer}:

* ``concise`` (small-model style): one equation chain per step, splitting the
  operand (or, for a product, the multiplicand) into tens and ones::

      47 + 38 = 47 + 30 + 8 = 77 + 8 = 85\\n\\n85 * 6 = 80 * 6 + 5 * 6 = 480 + 30 = 510
      \\n\\n...\\n\\n\\boxed{381}

* ``verbose`` (large-model style): the same chains, with an opening
  restatement, a header per step, a check, and a closing sentence::

      We start with 47.\\n\\nAdding 38: 47 + 38 = 47 + 30 + 8 = 77 + 8 = 85.
      Check: 85 - 38 = 47.\\n\\n...\\n\\nSo the answer is \\boxed{381}.

Splits are disjoint by construction: a problem belongs to the split selected
by a stable hash of its canonical form (start value and operations), so the
same problem text can never appear in two splits.

:func:`check_steps` is an exact step checker, tolerant to mixtures of the two
styles (see its docstring for the rules).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

JUDGE_INSTRUCTION = (
    "Evaluate the last reasoning step solely based on factual correctness and logical validity. "
    "Ignore style, phrasing, or overall usefulness—only judge whether the step is objectively "
    "correct and logically follows from prior steps. Assign a score from 0 to 9."
)
JUDGE_PREFIX = "I think the quality score is: "

STEP_SEPARATOR = "\n\n"
SPLITS = ("train", "validation", "test")
STYLES = ("concise", "verbose")
MAX_VALUE = 999  # every running value stays in [0, MAX_VALUE]

# Split assignment by hash bucket (out of 100): 80% train, 10% validation, 10% test.
_SPLIT_BUCKETS = {"train": range(0, 80), "validation": range(80, 90), "test": range(90, 100)}

_OP_WORDS = {"+": "add", "-": "subtract", "*": "multiply by"}
_OP_GERUNDS = {"+": "Adding", "-": "Subtracting", "*": "Multiplying by"}
_INVERSE = {"+": "-", "-": "+", "*": "/"}


# --------------------------------------------------------------------------- difficulty


@dataclass(frozen=True)
class Difficulty:
    """Difficulty knob of the generator.

    min_ops/max_ops: number of operations (uniform in the range).
    max_start: largest start value. max_operand: largest add/subtract operand.
    p_mul: probability of a multiplication when one is possible
    (running value < 100); the multiplier is uniform in [2, max_multiplier].
    """

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
DEFAULT_DIFFICULTY = DIFFICULTIES["medium"]


def _resolve_difficulty(difficulty: Difficulty | str | dict | None) -> Difficulty:
    if difficulty is None:
        return DEFAULT_DIFFICULTY
    if isinstance(difficulty, Difficulty):
        return difficulty
    if isinstance(difficulty, str):
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"unknown difficulty {difficulty!r}; choose from {sorted(DIFFICULTIES)}")
        return DIFFICULTIES[difficulty]
    if isinstance(difficulty, dict):
        return Difficulty(**difficulty)
    raise TypeError(f"difficulty must be a Difficulty, a name or a dict, got {type(difficulty)}")


# --------------------------------------------------------------------------- arithmetic


def apply_op(value: int, op: str, operand: int) -> int:
    if op == "+":
        return value + operand
    if op == "-":
        return value - operand
    if op == "*":
        return value * operand
    if op == "/":
        if operand == 0 or value % operand:
            raise ValueError("inexact division")
        return value // operand
    raise ValueError(f"unknown op {op!r}")


def _chain(a: int, op: str, b: int) -> list[str]:
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


# --------------------------------------------------------------------------- problems


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
        vals = [self.start]
        for op, b in self.ops:
            vals.append(apply_op(vals[-1], op, b))
        return vals

    def steps(self, style: str = "concise") -> list[str]:
        vals = self.values
        if style == "concise":
            out = [" = ".join(_chain(vals[i], op, b)) for i, (op, b) in enumerate(self.ops)]
            return out + [f"\\boxed{{{self.answer}}}"]
        if style == "verbose":
            out = [f"We start with {self.start}."]
            for i, (op, b) in enumerate(self.ops):
                a, c = vals[i], vals[i + 1]
                chain = " = ".join(_chain(a, op, b))
                check = f"{c} {_INVERSE[op]} {b} = {a}"
                out.append(f"{_OP_GERUNDS[op]} {b}: {chain}. Check: {check}.")
            return out + [f"So the answer is \\boxed{{{self.answer}}}."]
        raise ValueError(f"unknown style {style!r}; choose from {STYLES}")

    def solution(self, style: str = "concise") -> str:
        return STEP_SEPARATOR.join(self.steps(style))

    def to_record(self) -> dict:
        return {
            "id": self.id,
            "problem": self.problem,
            "answer": self.answer,
            "metadata": {
                "source": "rstitch-testbed",
                "split": self.split,
                "start": self.start,
                "ops": [[op, b] for op, b in self.ops],
                "num_ops": len(self.ops),
                **self.metadata,
            },
        }


def canonical_form(start: int, ops: Sequence[tuple[str, int]]) -> str:
    return f"{start}" + "".join(f"{op}{b}" for op, b in ops)


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def split_of(start: int, ops: Sequence[tuple[str, int]]) -> str:
    bucket = _stable_hash(canonical_form(start, ops)) % 100
    for name, rng in _SPLIT_BUCKETS.items():
        if bucket in rng:
            return name
    raise AssertionError("unreachable")


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
        choices = []
        if value < 100 and rng.random() < d.p_mul:
            op, b = "*", rng.randint(2, d.max_multiplier)
        else:
            if value + 1 <= MAX_VALUE:
                choices.append("+")
            if value >= 1:
                choices.append("-")
            op = rng.choice(choices)
            hi = min(d.max_operand, MAX_VALUE - value) if op == "+" else min(d.max_operand, value)
            b = rng.randint(1, hi)
        ops.append((op, b))
        value = apply_op(value, op, b)
    return start, ops


def generate_problems(
    split: str,
    n: int,
    seed: int = 0,
    difficulty: Difficulty | str | dict | None = None,
) -> list[TestbedProblem]:
    """``n`` distinct problems of ``split`` ("train" | "validation" | "test").

    Deterministic in (split, n, seed, difficulty); the first k problems of a call
    with n >= k equal those of a call with n = k.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {SPLITS}")
    d = _resolve_difficulty(difficulty)
    rng = random.Random(_stable_hash(f"rstitch-testbed/{split}/{seed}"))
    out: list[TestbedProblem] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * n + 10_000:
            raise RuntimeError(f"could not generate {n} distinct {split} problems with {d}")
        start, ops = _sample_ops(rng, d)
        canon = canonical_form(start, ops)
        if canon in seen or split_of(start, ops) != split:
            continue
        seen.add(canon)
        out.append(make_problem(start, ops, split))
    return out


# --------------------------------------------------------------------------- step checker

_INT = r"-?\d+"
_EXPR = rf"{_INT}(?:\s*[-+*/×x]\s*{_INT})*"
_CHAIN_RE = re.compile(rf"{_EXPR}(?:\s*=\s*{_EXPR})+")
_BOXED_RE = re.compile(r"\\boxed\{\s*([^{}]*?)\s*\}")
_BIN_RE = re.compile(rf"^\s*({_INT})\s*([-+*/×x])\s*({_INT})\s*$")
_NUM_RE = re.compile(r"\d+")


def _eval_expr(expr: str) -> int | None:
    """Integer value of ``a op b op c ...`` with the usual precedence; None if invalid."""
    expr = expr.replace("×", "*").replace("x", "*")
    tokens = re.findall(rf"{_INT}|[-+*/]", expr.replace(" ", ""))
    # re-tokenize so that binary minus is an operator, not a sign
    toks: list[str] = []
    for t in tokens:
        if toks and toks[-1] not in "+-*/" and t.startswith("-") and len(t) > 1:
            toks += ["-", t[1:]]
        else:
            toks.append(t)
    if not toks or len(toks) % 2 == 0:
        return None
    try:
        terms: list[int] = []
        signs: list[int] = []
        cur = int(toks[0])
        sign = 1
        i = 1
        while i < len(toks):
            op, val = toks[i], int(toks[i + 1])
            if op == "*":
                cur *= val
            elif op == "/":
                cur = apply_op(cur, "/", val)
            else:
                terms.append(cur)
                signs.append(sign)
                cur, sign = val, (1 if op == "+" else -1)
            i += 2
        terms.append(cur)
        signs.append(sign)
    except (ValueError, IndexError):
        return None
    return sum(s * t for s, t in zip(signs, terms))


def _parse_binary(expr: str) -> tuple[int, str, int] | None:
    m = _BIN_RE.match(expr)
    if not m:
        return None
    op = {"×": "*", "x": "*"}.get(m.group(2), m.group(2))
    return int(m.group(1)), op, int(m.group(3))


def check_steps(problem: TestbedProblem, steps: Sequence[str]) -> list[bool]:
    """For each step, whether it is correct.

    Steps come from ``text.split("\\n\\n")``; both styles and mixtures of them
    are accepted. The checker tracks the *true* running value and the index of
    the next operation of the problem. Each step is judged against the true
    running value, so after a wrong step every step that builds on the wrong
    value is wrong too. Rules for one step:

    * Equations are chains ``E0 = E1 = ... = En`` of integer expressions
      (``47 + 38 = 47 + 30 + 8 = 77 + 8 = 85``). Every chain must be
      arithmetically right (all expressions equal).
    * A chain whose first expression is ``a op b`` with (op, b) equal to the
      next operation of the problem is an attempt at that operation: it is
      right iff also ``a`` is the true running value; either way the
      operation counts as done and the true running value advances.
    * A check (a chain right after the word "Check", like ``Check: 85 - 38 =
      47``) must start from a value already established: the true running
      value before or after this step's operation, or a result stated earlier
      in this step.
    * Any other chain is right only if it restates an operation already done
      (``47 + 38 = 85`` again); e.g. ``47 + 39 = 86`` for "add 38" is wrong.
      A check is never an attempt, and a step makes at most one attempt
      unless a later chain starts exactly from the true running value.
    * ``\\boxed{x}`` is right iff x equals the gold answer and no operation of
      the problem is left undone.
    * A step with neither equation nor box (``We start with 47.``,
      ``Adding 38:``) is right iff every number it states is the true running
      value, the operand of the next operation, or the start value.
    """
    ops = list(problem.ops)
    true_vals = problem.values
    k = 0  # index of the next operation
    out: list[bool] = []
    for step in steps:
        ok = True
        known = {true_vals[k]}
        chains = list(_CHAIN_RE.finditer(step))
        boxes = list(_BOXED_RE.finditer(step))
        # text outside equations and boxes
        rest = _BOXED_RE.sub(" ", _CHAIN_RE.sub(" ", step))
        attempted = False
        for m in chains:
            exprs = [e.strip() for e in m.group(0).split("=")]
            vals = [_eval_expr(e) for e in exprs]
            arith_ok = None not in vals and len(set(vals)) == 1
            first = _parse_binary(exprs[0])
            is_check = "check" in step[max(0, m.start() - 12) : m.start()].lower()
            if (
                first is not None
                and not is_check
                and k < len(ops)
                and (first[1], first[2]) == ops[k]
                and (not attempted or first[0] == true_vals[k])
            ):
                attempted = True
                # attempt at the next operation
                ok &= arith_ok and first[0] == true_vals[k]
                k += 1
                known.add(true_vals[k])
            elif is_check:
                head = _eval_expr(exprs[0].split(" ")[0]) if exprs[0] else None
                ok &= arith_ok and head in known | {true_vals[k]}
            else:
                # only a restatement of an operation already done is allowed
                done = {(true_vals[i], op, b) for i, (op, b) in enumerate(ops[:k])}
                ok &= arith_ok and first is not None and first in done
            if arith_ok and vals:
                known.update(v for v in vals if v is not None)
        for m in boxes:
            ok &= m.group(1).strip() == problem.answer and k == len(ops)
        if not chains and not boxes:
            allowed = {true_vals[k], problem.start}
            if k < len(ops):
                allowed.add(ops[k][1])
            ok &= all(int(x) in allowed for x in _NUM_RE.findall(rest))
        out.append(bool(ok))
    return out


def first_wrong_step(problem: TestbedProblem, steps: Sequence[str]) -> int | None:
    """Index of the first wrong step, or None if all steps are correct."""
    for i, good in enumerate(check_steps(problem, steps)):
        if not good:
            return i
    return None


def locate_errors(problem: TestbedProblem, steps: Sequence[str]) -> list[tuple[int, int] | None]:
    """Where each wrong step goes wrong: per step, None if it is correct, else ``(good, bad)``
    character offsets: ``step[:good]`` is still correct and ``step[:bad]`` is already wrong.

    A prefix of a step can be judged on its own only where an expression ends, so the cuts
    are the ends of expressions (the first number of each chain, before each "=", the end
    of each chain and each box);
    the error lies between the last correct cut and the first wrong one (the step's end when
    every cut before it is correct). These are the dense labels of the testbed PRM: they show
    the token where a step goes wrong, not only the step.
    """
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
        ends.add(m.start() + _NUM_RE.search(chain).end())  # the value a chain starts from
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


# --------------------------------------------------------------------------- corruption


CORRUPTION_KINDS = ("slip", "carry", "link", "operand", "value", "answer")  # drawn when no kind is given


def corrupt_steps(
    problem: TestbedProblem, style: str, rng: random.Random, kind: str | None = None
) -> list[str]:
    """A solution with one injected error that later steps carry forward.

    kind: "slip" (one digit of a result changed), "carry" (result off by 10 or
    100: a missed or extra carry), "link" (a slip inside the chain, on the partial
    result the chain goes on from), "operand" (wrong operand used), "value"
    (wrong running value copied), "answer" (wrong boxed answer) or "misread"
    (the operation or operand of another step of the problem applied, a mistake the
    trained LLM makes; chosen only when asked for, so that drawing a random kind
    stays as it was). The error is propagated: later steps compute correctly
    from the wrong value, as a model that slipped would. Labels come from
    :func:`check_steps`.
    """
    kind = kind or rng.choice(CORRUPTION_KINDS)
    if kind not in (known := (*CORRUPTION_KINDS, "misread")):
        raise ValueError(f"unknown corruption kind {kind!r}; choose from {known}")
    n = len(problem.ops)
    j = rng.randrange(n)  # operation where the error happens
    vals = [problem.start]
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
        true_c = _safe(a, op, bb)
        if true_c is not None and 0 <= true_c and (op != "*" or a < 100):
            chain = _chain(a, op, bb)
            chain[-1] = str(c)  # a slip of the result lands on the last link
            if i == j and kind == "link":
                chain, c = _slip_inside(chain, rng)
        else:
            chain = [f"{a} {op} {bb}", str(c)]
        lines_ops.append((a, op, bb, chain))
        cur = c
        vals.append(cur)
    final = cur
    if kind == "answer":
        final = _perturb(cur, rng)
    steps: list[str] = []
    if style == "verbose":
        steps.append(f"We start with {problem.start}.")
    for a, op, b, chain in lines_ops:
        c = int(chain[-1])
        if style == "concise":
            steps.append(" = ".join(chain))
        else:
            steps.append(f"{_OP_GERUNDS[op]} {b}: {' = '.join(chain)}. Check: {c} {_INVERSE[op]} {b} = {a}.")
    box = f"\\boxed{{{final}}}"
    steps.append(box if style == "concise" else f"So the answer is {box}.")
    return steps


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
    if len(chain) < 4:
        c = _perturb(int(chain[-1]), rng)
        return [*chain[:-1], str(c)], c
    left, op, right = chain[2].split(" ")
    left = str(_perturb(int(left), rng, hi=MAX_VALUE))
    c = _eval_expr(f"{left} {op} {right}")
    if c is None or not 0 <= c <= MAX_VALUE:
        c = _perturb(int(chain[-1]), rng)
        return [*chain[:-1], str(c)], c
    return [chain[0], chain[1], f"{left} {op} {right}", str(c)], c


def _safe(a: int, op: str, b: int) -> int | None:
    try:
        return apply_op(a, op, b)
    except ValueError:
        return None


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


def iter_all_styles() -> Iterable[str]:
    return iter(STYLES)
