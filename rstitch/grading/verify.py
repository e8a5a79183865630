"""Decide whether a response's answer equals the gold answer.

``grade`` extracts the answer, tries a cheap normalized-string / plain-number comparison, and
only then asks math-verify. math-verify runs in a persistent worker interpreter because its
own timeout relies on ``signal.alarm`` (main thread only) and sympy can hang on answers such
as ``(10^7)!``: the worker is killed and replaced when one comparison exceeds its time limit,
which works from any thread or process and never stalls a run.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from rstitch.grading.extract import Extracted, extract_final

logger = logging.getLogger(__name__)

WORKER_STARTUP_TIMEOUT_S = 120.0  # importing sympy on a busy machine can take a while
WORKER_MEMORY_LIMIT_BYTES = 4 * 1024**3  # a runaway sympy evaluation fails instead of eating RAM
MAX_ANSWER_CHARS = 2_000  # longer "answers" are extraction noise; don't feed them to sympy
MAX_EXPONENT_DIGITS = 15  # Decimal cannot hold larger exponents; such strings are not plain numbers
MAX_SYMPY_EXPONENT = 300  # beyond a float's range math-verify would build the whole power (1e1000000000)


def grade(response: str, gold: str, multiple_choice: bool = False, timeout_s: float = 5.0,
          tolerance: Sequence[float | None] | None = None) -> bool:
    """True iff the final answer in ``response`` is equivalent to ``gold``.

    A comparison that takes longer than ``timeout_s`` counts as wrong. ``tolerance`` (a record's
    ``metadata["tolerance"]``, OlympiadBench's ``error``) also accepts numbers within it of the
    gold's: see ``within_tolerance``.
    """
    found = extract_final(response, multiple_choice=multiple_choice)
    return _grade_found(found, gold, multiple_choice, timeout_s, tolerance)


def _grade_found(found: Extracted | None, gold: str, multiple_choice: bool, timeout_s: float,
                 tolerance: Sequence[float | None] | None) -> bool:
    if found is None:
        return False
    if multiple_choice:
        return found.text.strip().upper() == _gold_letter(gold)
    predicted = shaped_like_gold(found, str(gold))
    if tolerance and within_tolerance(predicted, gold, tolerance):
        return True
    return is_equivalent(predicted, gold, timeout_s=timeout_s)


_BRACKETS = (("\\left(", "\\right)"), ("\\left[", "\\right]"), ("\\{", "\\}"), ("(", ")"), ("[", "]"))


def shaped_like_gold(found: Extracted, gold: str) -> str:
    """The answer to compare with ``gold``: an answer written in several boxes is the list of
    their contents, in the gold's brackets when the gold is one bracketed tuple, interval or set
    of as many parts (``\\boxed{1}, \\boxed{2}`` against ``(1, 2)`` is ``(1, 2)``)."""
    if not found.parts:
        return found.text
    joined = ", ".join(found.parts)
    text = _strip_delimiters(gold.strip())
    for opener, closer in _BRACKETS:
        if text.startswith(opener) and text.endswith(closer):
            inner = text[len(opener) : len(text) - len(closer)]
            if _encloses_all(inner) and len(split_parts(inner)) == len(found.parts):
                return f"{opener}{joined}{closer}"
            break
    return joined


def _encloses_all(inner: str) -> bool:
    """True when ``inner``, the text between a gold's first and last bracket, never closes the
    first one early ("(1, 2), (3, 4)" is two tuples, not one)."""
    depth = 0
    for char in inner:
        depth += char in "([{"
        depth -= char in ")]}"
        if depth < 0:
            return False
    return True


TOLERANCE_SLACK = 1.01  # OlympiadBench's judge accepts |gold - answer| <= error * 1.01 (float rounding)


def within_tolerance(predicted: str, gold: str, tolerance: Sequence[float | None]) -> bool:
    """OlympiadBench's numeric tolerance: the answer's comma-separated parts pair up with the
    gold's (in any order), and each pair is two numbers at most its part's tolerance apart.
    ``tolerance`` has one entry for every part, or one per part (None: that part is exact)."""
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
    """The comma-separated parts of an answer, commas inside brackets or braces kept
    ("(1, 2), 3" has two parts)."""
    parts, depth, start = [], 0, 0
    text = _strip_delimiters(answer.strip())
    if _THOUSANDS_RE.match(text):  # "1,000" is one number
        return [text]
    for index, char in enumerate(text):
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(text[start:index].strip())
            start = index + 1
    parts.append(text[start:].strip())
    return parts


ANSWER_TYPES = ("math", "multiple_choice", "code", "zebra_grid", "python_literal")


def grade_sample(response: str, gold: str, multiple_choice: bool = False, timeout_s: float = 5.0,
                 metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A sample record's ``answer`` and ``correct``, plus ``grading_error`` when grading raised:
    one bad sample is graded wrong with the reason, and the run goes on. A record's
    ``metadata["answer_type"]`` picks the grader (math when absent; docs/datasets.md)."""
    answer_type = (metadata or {}).get("answer_type") or ("multiple_choice" if multiple_choice else "math")
    try:
        if answer_type not in ("math", "multiple_choice"):
            return _grade_structured(response, gold, answer_type, metadata or {})
        choice = answer_type == "multiple_choice"
        tolerance = (metadata or {}).get("tolerance")
        found = extract_final(response, multiple_choice=choice)
        return {"answer": found.text if found is not None else None,
                "correct": _grade_found(found, gold, choice, timeout_s, tolerance)}
    except Exception as err:  # noqa: BLE001 - recorded on the sample and counted in the summary
        reason = f"{type(err).__name__}: {err}"[:500]
        logger.warning("grading failed; sample counted as wrong (%s)", reason)
        return {"answer": None, "correct": False, "grading_error": reason}


def _grade_structured(response: str, gold: str, answer_type: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Code runs in the sandbox only here, for records whose loader marked them as code."""
    if answer_type == "code":
        from rstitch.grading.code import grade_code

        return grade_code(response, metadata["tests"])
    from rstitch.grading.structured import grade_grid, grade_literal

    if answer_type == "zebra_grid":
        return grade_grid(response, metadata["grid"])
    if answer_type == "python_literal":
        return grade_literal(response, gold)
    raise ValueError(f"unknown answer_type {answer_type!r}; valid: {', '.join(ANSWER_TYPES)}")


def is_equivalent(predicted: str, gold: str, timeout_s: float = 5.0, fast_path: bool = True) -> bool:
    """True iff the extracted answer ``predicted`` is mathematically equivalent to ``gold``.

    ``fast_path=False`` sends every pair to math-verify (for checking the fast path itself).
    """
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


# --------------------------------------------------------------------------- fast path

_MATH_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_DROPPED_TOKENS = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "~")
_DEGREE_RE = re.compile(r"\^\s*\{?\\circ\}?|°")
_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_LATEX_THOUSANDS_RE = re.compile(r"\{,\}|,\\!\s*")  # "10{,}080", "10,\! 080"
_THOUSANDS_RE = re.compile(r"^-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")  # "0,111" is no thousands grouping
_DECIMAL_COMMA_RE = re.compile(r"^-?\d+,\d+$")
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
    """True/False when a cheap check settles the comparison, None when math-verify must.

    Equal normalized strings are equivalent; two plain numbers are compared exactly, and two
    different integers are settled as unequal (rounding tolerance only matters for decimals), as
    are numbers beyond a float's range, which math-verify would try to expand digit by digit.
    """
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
    if _INTEGER_RE.match(pred) and _INTEGER_RE.match(ref):
        return False
    if max(abs(pred_number.adjusted()), abs(ref_number.adjusted())) > MAX_SYMPY_EXPONENT:
        return False
    return None


def normalize_answer(answer: str) -> str:
    """Canonical text of an answer for string comparison: no math delimiters, spacing,
    \\left/\\right, \\text{} wrappers, degree or percent signs, dollar signs, final period or
    thousands separators ("1,000" and "10,\\!080" but not the list "2, 125")."""
    text = _strip_delimiters(answer.strip())
    text = _PERCENT_WORD_RE.sub("", text)
    text = _NUMBER_WITH_UNIT_RE.sub(r"\1", text.strip())
    text = _TEXT_WRAPPER_RE.sub(r"\1", text)
    text = _LATEX_THOUSANDS_RE.sub(",", text)
    for token in _DROPPED_TOKENS:
        text = text.replace(token, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _DEGREE_RE.sub("", text)
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
    return bool(_DECIMAL_COMMA_RE.match(text)) and not _THOUSANDS_RE.match(text)


def _strip_delimiters(text: str) -> str:
    for opener, closer in _MATH_DELIMITERS:
        if text.startswith(opener) and text.endswith(closer) and len(text) >= len(opener) + len(closer):
            return text[len(opener) : len(text) - len(closer)].strip()
    return text


def _as_number(normalized: str) -> Decimal | None:
    """The exact value of a plain or scientific number. Decimal keeps "1e1000000000" as digits
    and an exponent, so neither building nor comparing it expands the power."""
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


def _gold_letter(gold: str) -> str:
    text = gold.strip().strip("()").strip()
    return text.upper()


# --------------------------------------------------------------------------- worker process


class _VerifyWorker:
    """A child interpreter that answers one math-verify comparison per request line."""

    def __init__(self) -> None:
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from rstitch.grading.verify import serve_worker; serve_worker()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env,
        )
        assert self._process.stdin is not None and self._process.stdout is not None, "both are pipes"
        self._stdin, self._stdout = self._process.stdin, self._process.stdout
        self._pending = b""
        self._readable = selectors.DefaultSelector()  # poll/epoll: no FD_SETSIZE limit unlike select()
        self._readable.register(self._stdout, selectors.EVENT_READ)
        ready = self._read_line(time.monotonic() + WORKER_STARTUP_TIMEOUT_S)
        if ready != b"ready":
            self.kill()
            raise RuntimeError(f"math-verify grading worker failed to start (got {ready!r}); see its stderr above")

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def compare(self, gold: str, predicted: str, timeout_s: float) -> bool | None:
        """The worker's verdict, or None when it took longer than ``timeout_s`` (then it is killed)."""
        request = json.dumps({"gold": gold, "pred": predicted}).encode() + b"\n"
        self._stdin.write(request)
        self._stdin.flush()
        line = self._read_line(time.monotonic() + timeout_s)
        if line is None:
            self.kill()
            return None
        return bool(json.loads(line)["equal"])

    def _read_line(self, deadline: float) -> bytes | None:
        fd = self._stdout.fileno()
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._readable.select(remaining):
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker died (e.g. out of memory): treat like a timeout
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line

    def kill(self) -> None:
        if self.alive:
            self._process.kill()
        self._process.wait()
        self._readable.close()
        for stream in (self._stdin, self._stdout):
            stream.close()

    def close(self) -> None:
        """Ask the worker to exit (end of input), killing it if it does not."""
        try:
            self._stdin.close()
            self._process.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class _WorkerPool:
    """Idle workers shared by all threads. Every caller compares on a worker of its own (an idle
    one, else a new one), so a timeout never includes waiting for another caller's comparison;
    at most ``max_idle`` workers are kept between comparisons."""

    def __init__(self, max_idle: int) -> None:
        self._idle: list[_VerifyWorker] = []
        self._lock = threading.Lock()
        self._max_idle = max_idle
        self.timed_out = 0  # comparisons that ran out of time (their worker was replaced)

    def compare(self, gold: str, predicted: str, timeout_s: float) -> bool | None:
        worker = self._take()
        try:
            result = _ask(worker, gold, predicted, timeout_s)
        except BrokenPipeError:  # the idle worker died since its last answer: use a new one
            worker = _VerifyWorker()
            result = _ask(worker, gold, predicted, timeout_s)
        if result is None:
            with self._lock:
                self.timed_out += 1
        else:
            self._give_back(worker)
        return result

    def _take(self) -> _VerifyWorker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive:
                    return worker
                worker.kill()
        return _VerifyWorker()  # started outside the lock: startup takes a second or two

    def _give_back(self, worker: _VerifyWorker) -> None:
        with self._lock:
            keep = len(self._idle) < self._max_idle
            if keep:
                self._idle.append(worker)
        if not keep:  # a burst of callers is over: do not keep its extra interpreters
            worker.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()


def _ask(worker: _VerifyWorker, gold: str, predicted: str, timeout_s: float) -> bool | None:
    try:
        return worker.compare(gold, predicted, timeout_s)
    except BaseException:  # e.g. KeyboardInterrupt mid-request: the worker's state is unknown
        worker.kill()
        raise


_POOL: _WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def _get_pool() -> _WorkerPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = _WorkerPool(max_idle=max(1, min(4, os.cpu_count() or 1)))
        return _POOL


def _forget_parent_pool() -> None:
    """In a forked child: the parent's workers and locks are not ours to use."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


def _close_pool() -> None:
    if _POOL is not None:
        _POOL.close()


os.register_at_fork(after_in_child=_forget_parent_pool)
atexit.register(_close_pool)


# --------------------------------------------------------------------------- inside the worker


def serve_worker() -> None:
    """Worker main loop: one JSON request per stdin line, one JSON verdict per stdout line."""
    _limit_memory(WORKER_MEMORY_LIMIT_BYTES)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; we end with its stdin
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the protocol
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    math_verify_equal("1", "1")  # import sympy and build the parsers before saying ready
    replies.write(b"ready\n")
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            equal = math_verify_equal(request["gold"], request["pred"])
        except Exception:  # noqa: BLE001 - a bad request is a wrong answer, not a dead worker
            equal = False
        replies.write(json.dumps({"equal": equal}).encode() + b"\n")


def math_verify_equal(gold_latex: str, predicted_latex: str) -> bool:
    """math-verify's verdict with its signal-based timeouts disabled (the caller enforces one)."""
    from math_verify import parse, verify

    gold = parse(gold_latex, parsing_timeout=None)
    predicted = parse(predicted_latex, parsing_timeout=None)
    if not gold or not predicted:
        return False
    return bool(verify(gold, predicted, timeout_seconds=None))


def _limit_memory(limit_bytes: int) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    except (ImportError, ValueError, OSError):
        pass  # best effort: not every platform allows lowering the limit
