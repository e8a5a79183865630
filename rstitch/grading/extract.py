"""Pull the final answer out of a model response.

Order of preference: the last complete ``\\boxed{...}`` (also ``\\fbox``, ``\\framebox`` and
``\\boxed 5``), then an explicit "final answer is X" / "answer: X" statement, then the last
number. Multiple-choice responses are reduced to a single option letter.
"""
from __future__ import annotations

import bisect
import re

BOX_COMMANDS = ("\\boxed", "\\fbox", "\\framebox")
THINK_END = "</think>"
OPTION_LETTERS = "ABCDEFGHIJ"
MAX_OPTIONAL_ARGS = 2  # \\framebox[width][pos]{...} takes at most two

_BOX_RE = re.compile(r"\\(?:" + "|".join(command[1:] for command in BOX_COMMANDS) + r")(?![A-Za-z])")
_ANSWER_STATEMENT_RE = re.compile(
    r"(?:final\s+answer\s*(?:is|would\s+be|=)?|answer\s+(?:is|would\s+be)|answer\s*[:：=])"
    r"\s*[:：]?\s*(?:\*\*)?\s*",
    re.IGNORECASE,
)
_NUMBER_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+/\d+|-?\d+(?:\.\d+)?|-?\.\d+")
_NUMBER_THEN_WORDS_RE = re.compile(r"^(-?[\d,]*\.?\d+(?:/\d+)?)\s+[A-Za-z][A-Za-z ]*$")
_BOXED_LETTER_RE = re.compile(rf"^\(?([{OPTION_LETTERS}])\)?(?:[.):]\s*.*)?$", re.DOTALL)
# In running text only A-D count as options, and a bare letter must end its clause, so that
# "the answer is A bit tricky" or "answer: I think" are not read as choices.
_TEXT_LETTER = r"(?:\(([A-D])\)|\b([A-D])(?=[.,;:!)*$\\]|[ \t]*$))"
_MC_ANSWER_RE = re.compile(
    rf"(?i:answer)\s*(?i:is|would\s+be)?\s*[:：]?\s*(?i:option|choice)?\s*(?:\*\*|\$)?\s*{_TEXT_LETTER}",
    re.MULTILINE,
)
_MC_CHOICE_RE = re.compile(
    rf"(?i:correct|best|right)\s+(?i:option|choice)\s*(?i:is)?\s*[:：]?\s*(?:\*\*|\$)?\s*{_TEXT_LETTER}",
    re.MULTILINE,
)
_MC_LAST_LINE_RE = re.compile(r"^(?:\*\*)?\(?([A-D])\)(?:\*\*)?(?:\s|$)|^(?:\*\*)?([A-D])(?:\*\*)?\.?$")
_SPACE_RUN_RE = re.compile(r"[^\S\n]+")
_NEWLINE_RUN_RE = re.compile(r"\s*\n\s*")
_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")


def extract_answer(response: str, multiple_choice: bool = False) -> str | None:
    """The final answer stated in ``response``, or None when there is none.

    Text after ``</think>`` is searched first so a reasoning model's drafts do not win over
    its final statement; the whole response is the fallback.
    """
    extract = _extract_letter if multiple_choice else _extract_math
    for part in _search_order(_squeeze_whitespace(response)):
        answer = extract(part)
        if answer is not None:
            return answer
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty ``\\boxed{...}``-style command in ``text``."""
    # Once a box fails to close, no earlier box can close past its start: stop scanning there,
    # which keeps a response full of unclosed boxes linear instead of quadratic.
    limit = len(text)
    closers = _Closers(text)
    for match in reversed(list(_BOX_RE.finditer(text))):
        content, opened_at = _box_argument(text, match.end(), limit, closers)
        if content:
            return content
        if content is None and opened_at is not None:
            limit = opened_at
    return None


def _squeeze_whitespace(text: str) -> str:
    """One space or one newline per whitespace run: the patterns below contain several
    optional ``\\s*`` in a row, which would backtrack polynomially over long runs."""
    return _NEWLINE_RUN_RE.sub("\n", _SPACE_RUN_RE.sub(" ", text))


def _search_order(response: str) -> list[str]:
    if THINK_END in response:
        final_part = response.rsplit(THINK_END, 1)[1]
        if final_part.strip():
            return [final_part, response]
    return [response]


class _Closers:
    """Positions of "]" in a text, found once: looking each one up again from every box
    command would make a response of many unclosed ``\\boxed[`` quadratic."""

    def __init__(self, text: str):
        self._text = text
        self._positions: list[int] | None = None

    def find(self, start: int, limit: int) -> int:
        if self._positions is None:
            self._positions = [m.start() for m in re.finditer(r"\]", self._text)]
        k = bisect.bisect_left(self._positions, start)
        return self._positions[k] if k < len(self._positions) and self._positions[k] < limit else -1


def _box_argument(text: str, start: int, limit: int, closers: _Closers) -> tuple[str | None, int | None]:
    """(argument, index of its opening brace) of a box command whose name ends at ``start``;
    the argument is None when the braces do not close before ``limit``."""
    i = _skip_spaces(text, start)
    for _ in range(MAX_OPTIONAL_ARGS):  # \\framebox[width][pos]{...}
        if not text.startswith("[", i):
            break
        close = closers.find(i, limit)
        if close < 0:
            return None, None
        start = close + 1
        i = _skip_spaces(text, start)
    if text.startswith("[", i):  # more optional arguments than any box command takes: not a box
        return None, None
    if text.startswith("{", i):
        end = _matching_brace(text, i, limit)
        return (text[i + 1 : end].strip() if end is not None else None), i
    if i == start:  # "\\boxed5" is not LaTeX for a box; only "\\boxed 5" is
        return None, None
    token = re.match(r"[^\s$]+", text[i : i + 200])
    return (token.group(0).rstrip(".,;") if token else None), None


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def _matching_brace(text: str, open_index: int, limit: int) -> int | None:
    depth = 0
    i = open_index
    while i < limit:
        char = text[i]
        if char == "\\":  # an escaped brace \\{ or \\} does not change the depth
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


# --------------------------------------------------------------------------- free-form answers


def _extract_math(text: str) -> str | None:
    return last_boxed(text) or _answer_statement(text) or _last_number(text)


def _answer_statement(text: str) -> str | None:
    """The value after the last "final answer is" / "the answer is" / "answer:" phrase."""
    for match in reversed(list(_ANSWER_STATEMENT_RE.finditer(text))):
        value = _statement_value(_rest_of_line(text, match.end()))
        if value:
            return value
    return None


def _rest_of_line(text: str, start: int, max_chars: int = 1000) -> str:
    window = text[start : start + max_chars]  # bounded, so many statements stay linear
    return window.split("\n", 1)[0]


def _statement_value(line: str) -> str | None:
    line = line.strip()
    math = _leading_math(line)
    if math is not None:
        return math.strip() or None
    boxed = last_boxed(line)
    if boxed:
        return boxed
    # Plain prose: the value ends at the first sentence break.
    value = re.split(r"\.(?:\s|$)|;|\*\*", line, maxsplit=1)[0]
    value = value.strip().rstrip(".").strip()
    number_then_words = _NUMBER_THEN_WORDS_RE.match(value)  # "18 dollars" -> "18"
    return (number_then_words.group(1) if number_then_words else value) or None


def _leading_math(line: str) -> str | None:
    """Content of a math span ($...$, $$...$$, \\(...\\), \\[...\\]) that opens ``line``."""
    for opener, closer in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if line.startswith(opener):
            end = line.find(closer, len(opener))
            if end > 0:
                inner = line[len(opener) : end]
                return last_boxed(inner) or inner
    return None


def _last_number(text: str) -> str | None:
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


# --------------------------------------------------------------------------- multiple choice


def _extract_letter(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        letter = _letter_of(boxed)
        if letter:
            return letter
    for pattern in (_MC_ANSWER_RE, _MC_CHOICE_RE):
        found = pattern.findall(text)
        if found:
            return "".join(found[-1])  # one of the two groups is empty
    return _letter_on_last_line(text)


def _letter_of(content: str) -> str | None:
    """"B", "(B)", "\\text{B}", "B) 42" -> "B"."""
    unwrapped = _TEXT_WRAPPER_RE.sub(r"\1", content).strip().strip("*").strip()
    match = _BOXED_LETTER_RE.match(unwrapped)
    return match.group(1) if match else None


def _letter_on_last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    match = _MC_LAST_LINE_RE.match(lines[-1])
    return (match.group(1) or match.group(2)) if match else None
