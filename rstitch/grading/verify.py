"""Decide whether a response's answer equals the gold answer (docs/grading.md). math-verify runs in
a pebble pool: its own timeout needs ``signal.alarm`` (main thread only), and sympy can hang on
``(10^7)!``; a worker past its limit is killed and replaced, from any thread."""
from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import re
import resource
import signal
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from decimal import Decimal
from typing import Any

from rstitch.grading.extract import MATH_DELIMITERS, Extracted, extract_final
from rstitch.grading.structured import grade_grid, grade_literal

logger = logging.getLogger(__name__)

WORKER_MEMORY_LIMIT_BYTES = 4 * 1024**3  # a runaway sympy evaluation fails instead of eating RAM
MAX_ANSWER_CHARS = 2_000  # longer "answers" are extraction noise; don't feed them to sympy
MAX_EXPONENT_DIGITS = 15  # Decimal cannot hold larger exponents; such strings are not plain numbers
MAX_SYMPY_EXPONENT = 300  # beyond a float's range math-verify would build the whole power (1e1000000000)


def grade(response: str, gold: str, multiple_choice: bool = False, timeout_s: float = 5.0,
          tolerance: Sequence[float | None] | None = None) -> bool:
    """True iff the final answer in ``response`` is equivalent to ``gold``; past ``timeout_s`` it is not.
    ``tolerance``: a record's ``metadata["tolerance"]`` (``within_tolerance``)."""
    return _grade_found(extract_final(response, multiple_choice=multiple_choice), gold, multiple_choice, timeout_s, tolerance)


def _grade_found(found: Extracted | None, gold: str, multiple_choice: bool, timeout_s: float,
                 tolerance: Sequence[float | None] | None) -> bool:
    if found is None:
        return False
    if multiple_choice:
        return found.text.strip().upper() == gold.strip().strip("()").strip().upper()
    predicted = shaped_like_gold(found, str(gold))
    if tolerance and within_tolerance(predicted, gold, tolerance):
        return True
    return is_equivalent(predicted, gold, timeout_s=timeout_s)


_BRACKETS = (("\\left(", "\\right)"), ("\\left[", "\\right]"), ("\\{", "\\}"), ("(", ")"), ("[", "]"))


def shaped_like_gold(found: Extracted, gold: str) -> str:
    """Several boxes' contents as one list, in the gold's brackets when the gold is one tuple,
    interval or set of as many parts (docs/grading.md, "Notes on the rules")."""
    if not found.parts:
        return found.text
    joined = ", ".join(found.parts)
    text = _strip_delimiters(gold.strip())
    for opener, closer in _BRACKETS:
        if text.startswith(opener) and text.endswith(closer):
            inner = text[len(opener) : len(text) - len(closer)]
            # "(1, 2), (3, 4)" is two tuples, not one: the first bracket must not close early
            encloses_all = all(depth >= 0 for depth in itertools.accumulate((c in "([{") - (c in ")]}") for c in inner))
            if encloses_all and len(split_parts(inner)) == len(found.parts):
                return f"{opener}{joined}{closer}"
            break
    return joined


TOLERANCE_SLACK = 1.01  # OlympiadBench's judge accepts |gold - answer| <= error * 1.01 (float rounding)


def within_tolerance(predicted: str, gold: str, tolerance: Sequence[float | None]) -> bool:
    """OlympiadBench's numeric tolerance (docs/grading.md). ``tolerance`` has one entry for every
    part, or one per part (None: that part is exact)."""
    gold_parts, predicted_parts = split_parts(gold), split_parts(predicted)
    if len(gold_parts) != len(predicted_parts):
        return False
    limits = list(tolerance) * len(gold_parts) if len(tolerance) == 1 else list(tolerance)
    if len(limits) != len(gold_parts):
        return False
    unused = [_as_number(normalize_answer(part)) for part in predicted_parts]
    for part, limit in zip(gold_parts, limits):
        reference = _as_number(normalize_answer(part))
        if reference is None:
            return False
        slack = Decimal(str(limit or 0)) * Decimal(str(TOLERANCE_SLACK))
        match = next((i for i, value in enumerate(unused) if value is not None and abs(value - reference) <= slack), None)
        if match is None:
            return False
        unused[match] = None
    return True


def split_parts(answer: str) -> list[str]:
    """The comma-separated parts of an answer, commas inside brackets kept ("(1, 2), 3" has two)."""
    text = _strip_delimiters(answer.strip())
    if _THOUSANDS_RE.match(text):  # "1,000" is one number
        return [text]
    depths = itertools.accumulate((c in "([{") - (c in ")]}") for c in text)
    commas = [i for i, (char, depth) in enumerate(zip(text, depths)) if char == "," and depth == 0]
    return [text[start + 1 : end].strip() for start, end in zip([-1, *commas], [*commas, len(text)])]


ANSWER_TYPES = ("math", "multiple_choice", "code", "zebra_grid", "python_literal")


def grade_sample(response: str, gold: str, multiple_choice: bool = False, timeout_s: float = 5.0,
                 metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A sample's ``answer`` and ``correct``, plus ``grading_error`` when grading raised (the run goes
    on). ``metadata["answer_type"]`` picks the grader (math when absent; docs/datasets.md)."""
    metadata = metadata or {}
    answer_type = metadata.get("answer_type") or ("multiple_choice" if multiple_choice else "math")
    try:
        if answer_type == "code":  # code runs in the sandbox only here, for records marked as code
            from rstitch.grading.code import grade_code

            return grade_code(response, metadata["tests"])
        if answer_type == "zebra_grid":
            return grade_grid(response, metadata["grid"])
        if answer_type == "python_literal":
            return grade_literal(response, gold)
        if answer_type not in ANSWER_TYPES:
            raise ValueError(f"unknown answer_type {answer_type!r}; valid: {', '.join(ANSWER_TYPES)}")
        choice = answer_type == "multiple_choice"
        tolerance = metadata.get("tolerance")
        found = extract_final(response, multiple_choice=choice)
        return {"answer": found.text if found is not None else None,
                "correct": _grade_found(found, gold, choice, timeout_s, tolerance)}
    except Exception as err:  # noqa: BLE001 - recorded on the sample and counted in the summary
        reason = f"{type(err).__name__}: {err}"[:500]
        logger.warning("grading failed; sample counted as wrong (%s)", reason)
        return {"answer": None, "correct": False, "grading_error": reason}


def is_equivalent(predicted: str, gold: str, timeout_s: float = 5.0, fast_path: bool = True) -> bool:
    """True iff ``predicted`` equals ``gold`` mathematically; ``fast_path=False`` sends every pair to
    math-verify (for checking the fast path itself)."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    gold = str(gold)
    if not predicted.strip() or not gold.strip():
        return False
    if len(predicted) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:  # keeps every regex below cheap
        return predicted.strip() == gold.strip()
    predicted, gold = read_decimal_commas(predicted, gold)
    quick = quick_compare(predicted, gold) if fast_path else None
    if quick is not None:
        return quick
    result = _get_pool().compare(_as_latex(gold), _as_latex(predicted), timeout_s)
    if result is None:
        logger.warning("answer comparison exceeded %.1fs; counted as wrong (answer %.80r)", timeout_s, predicted)
        return False
    return result


_DROPPED_TOKENS = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "~")
_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_THOUSANDS_RE = re.compile(r"^-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")  # "0,111" is no thousands grouping
# Words for percent and units after a number: "28 percent", "28 \\text{pct}", "15 cm^2", "125\\textnormal{ miles}".
_PERCENT_WORD_RE = re.compile(r"(?<=[\d}])\s*(?:\\(?:text|mbox|textnormal)\s*\{\s*)?(?:percentage|percent|pct)s?\b\s*\}?",
                              re.IGNORECASE)
# math written in words is not a unit: "2 pi", "6 and 8", "3 mod 5"
_UNIT_WORDS = r"(?!(?:pi|sqrt|and|or|inf\w*|mod|log|ln|sin|cos|tan|cot|sec|csc|exp)\b)[A-Za-z]{2,}(?:\s+[A-Za-z]{2,})*"
_NUMBER_WITH_UNIT_RE = re.compile(
    rf"^(-?[\d.,]*\d(?:/\d+)?)\s*(?:\\(?:text|mbox|textnormal|mathrm)\s*\{{\s*{_UNIT_WORDS}\s*\}}|{_UNIT_WORDS})"
    r"(?:\^\{?\d\}?)?$")
_BARE_UNIT_RE = re.compile(rf"(?<=[\d}}])\s+({_UNIT_WORDS})(\^\{{?\d\}}?)?$")
_DECIMAL_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)$")
_SCIENTIFIC_RE = re.compile(r"^([-+]?(?:\d+\.?\d*|\.\d+))(?:[eE]|\\times10\^\{?)([-+]?\d+)\}?$")
_INTEGER_RE = re.compile(r"^[-+]?\d+$")
_PARENTHESIZED_NUMBER_RE = re.compile(r"^\(([-+]?(?:\d+\.?\d*|\.\d+))\)$")


def quick_compare(predicted: str, gold: str) -> bool | None:
    """True/False when a cheap check settles the comparison (docs/grading.md, "Fast path"), None
    when math-verify must. Numbers beyond a float's range are settled: math-verify would expand them."""
    pred, ref = normalize_answer(predicted), normalize_answer(gold)
    if not pred or not ref:
        return None
    if pred == ref:
        return True
    pred_number, ref_number = _as_number(pred), _as_number(ref)
    if pred_number is None or ref_number is None:
        return None
    if pred_number == ref_number:
        return True
    integers = bool(_INTEGER_RE.match(pred) and _INTEGER_RE.match(ref))  # rounding only matters for decimals
    if integers or max(abs(pred_number.adjusted()), abs(ref_number.adjusted())) > MAX_SYMPY_EXPONENT:
        return False
    return None


def normalize_answer(answer: str) -> str:
    """Canonical text of an answer for string comparison (docs/grading.md, "Fast path")."""
    text = _strip_delimiters(answer.strip())
    text = _PERCENT_WORD_RE.sub("", text)
    text = _NUMBER_WITH_UNIT_RE.sub(r"\1", text.strip())
    text = _TEXT_WRAPPER_RE.sub(r"\1", text)
    text = re.sub(r"\{,\}|,\\!\s*", ",", text)  # "10{,}080", "10,\! 080"
    for token in _DROPPED_TOKENS:
        text = text.replace(token, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"\^\s*\{?\\circ\}?|°", "", text)
    text = text.replace("\\%", "").replace("%", "").replace("\\$", "")
    text = text.strip().rstrip(".").strip()
    if _THOUSANDS_RE.match(text):
        text = text.replace(",", "")
    text = re.sub(r"\s+", "", text)
    parenthesized = _PARENTHESIZED_NUMBER_RE.match(text)  # AoPS writes "\\textbf{(073)}"
    return parenthesized.group(1) if parenthesized else text


def read_decimal_commas(predicted: str, gold: str) -> tuple[str, str]:
    """A decimal comma ("1,22") is read as a decimal point when the other side is one plain
    number; against a list ("1, 22") it stays a list. "1,220" is a thousands grouping either way."""
    pred, ref = (_strip_delimiters(s.strip()) for s in (predicted, gold))
    if _is_decimal_comma(pred) and _as_number(normalize_answer(gold)) is not None:
        return pred.replace(",", "."), gold
    if _is_decimal_comma(ref) and _as_number(normalize_answer(predicted)) is not None:
        return predicted, ref.replace(",", ".")
    return predicted, gold


def _is_decimal_comma(text: str) -> bool:
    return bool(re.match(r"^-?\d+,\d+$", text)) and not _THOUSANDS_RE.match(text)


def _strip_delimiters(text: str) -> str:
    for opener, closer in MATH_DELIMITERS.items():
        if text.startswith(opener) and text.endswith(closer) and len(text) >= len(opener) + len(closer):
            return text[len(opener) : len(text) - len(closer)].strip()
    return text


def _as_number(normalized: str) -> Decimal | None:
    """The exact value of a plain or scientific number; Decimal never expands "1e1000000000"."""
    if _DECIMAL_RE.match(normalized):
        return Decimal(normalized)
    scientific = _SCIENTIFIC_RE.match(normalized)
    if scientific and len(scientific.group(2).lstrip("+-")) <= MAX_EXPONENT_DIGITS:
        return Decimal(f"{scientific.group(1)}e{scientific.group(2)}")
    return None


def _as_latex(answer: str) -> str:
    """Wrap an answer so math-verify parses all of it as one LaTeX expression."""
    text = _strip_delimiters(answer.strip()).rstrip(".").strip()
    if "\\boxed" in text:
        return f"${text}$"
    normalized = normalize_answer(text)
    if _as_number(normalized) is not None:  # "1,000", "(073)", "50\\%", "90^\\circ" -> the bare number
        text = normalized
    scientific = _SCIENTIFIC_RE.match(text.replace(" ", ""))
    if scientific:  # "4.5e33" would otherwise parse as 4.5 * E * 33
        text = f"{scientific.group(1)}\\times10^{{{int(scientific.group(2))}}}"
    text = text.replace("\\%", "").replace("%", "")
    text = _PERCENT_WORD_RE.sub("", text)
    # math-verify drops a unit in \\text{}, but reads bare words as products of symbols
    text = _BARE_UNIT_RE.sub(r" \\text{ \1}\2", text)
    # math-verify cannot parse \\mathrm{e} inside a fraction and compares what is left as a string
    text = re.sub(r"\\(?:mathrm|operatorname)\s*\{\s*([ei])\s*\}", r"\1", text)
    return f"\\boxed{{{text}}}"


class _VerifyPool:
    """math-verify in a pebble pool; a task's limit counts from when a worker starts it, never while it waits."""

    def __init__(self, workers: int) -> None:
        import multiprocessing

        from pebble import ProcessPool

        # spawn: a fresh interpreter, never a fork of a parent that holds threads, locks or a GPU
        self._pool = ProcessPool(max_workers=workers, initializer=_start_worker,
                                 context=multiprocessing.get_context("spawn"))
        self._lock = threading.Lock()
        self.timed_out = 0  # comparisons that ran out of time or lost their worker

    def compare(self, gold: str, predicted: str, timeout_s: float) -> bool | None:
        """The worker's verdict, or None when it took longer than ``timeout_s`` or its worker died."""
        from pebble import ProcessExpired

        future = self._pool.schedule(_compare_in_worker, args=(gold, predicted), timeout=timeout_s)
        try:
            return bool(future.result())
        except (FutureTimeout, ProcessExpired):  # past its limit (killed), or died, e.g. out of memory
            with self._lock:
                self.timed_out += 1
            return None

    def close(self) -> None:
        self._pool.stop()
        self._pool.join()


_POOL: _VerifyPool | None = None
_POOL_LOCK = threading.Lock()


def _get_pool() -> _VerifyPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = _VerifyPool(workers=max(1, min(4, os.cpu_count() or 1)))
        return _POOL


def _forget_parent_pool() -> None:
    """In a forked child: the parent's pool (its threads and pipes) is not ours to use."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


def _close_pool() -> None:
    if _POOL is not None:
        _POOL.close()


os.register_at_fork(after_in_child=_forget_parent_pool)
atexit.register(_close_pool)


def _start_worker() -> None:
    with contextlib.suppress(ValueError, OSError):  # best effort: not every platform lowers the limit
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_LIMIT_BYTES, WORKER_MEMORY_LIMIT_BYTES))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops the pool
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _compare_in_worker("1", "1")  # import sympy and build the parsers before the first timed comparison


def _compare_in_worker(gold_latex: str, predicted_latex: str) -> bool:
    """math-verify's verdict with its signal-based timeouts off (the pool enforces one)."""
    from math_verify import parse, verify

    try:
        gold = parse(gold_latex, parsing_timeout=None)
        predicted = parse(predicted_latex, parsing_timeout=None)
        return bool(gold and predicted and verify(gold, predicted, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - an answer math-verify cannot handle is a wrong answer, not a dead worker
        return False
