"""Pull the final answer out of a model response, by the rules of docs/grading.md, "Extraction"."""
from __future__ import annotations

import bisect
import itertools
import re
from collections import deque
from dataclasses import dataclass

BOX_COMMANDS = ("\\boxed", "\\fbox", "\\framebox")
THINK_END = "</think>"
OPTION_LETTERS = "ABCDEFGHIJ"
MAX_OPTIONAL_ARGS = 2  # \\framebox[width][pos]{...} takes at most two
MAX_JOINED_BOXES = 12  # an answer of more parts than this is a list of drafts, not one answer
MAX_BOX_SEPARATOR_CHARS = 70  # "\\quad \\text{ for part (a) and } \\quad" fits; a paragraph does not
MAX_SEPARATOR_WORDS = 5
MAX_UNDELIMITED_CHARS = 500  # a response that is one undelimited LaTeX expression is short

_BOX_RE = re.compile(r"\\(?:" + "|".join(command[1:] for command in BOX_COMMANDS) + r")(?![A-Za-z])")
_ANSWER_STATEMENT_RE = re.compile(
    r"(?:final\s+answer\s*(?:is|would\s+be|=)?|answer\s+(?:is|would\s+be)|answer\s*[:：=])"
    r"\s*[:：]?\s*(?:\*\*)?\s*",
    re.IGNORECASE,
)
# A decimal comma ("1,22") is one number only where it stands alone: "1,2,3" is a list. A number
# glued to letters before it is part of a name ("x2", "H2O"), not a value.
_NUMBER_RE = re.compile(r"(?=[-.\d])(?<![A-Za-z_\d])(?:-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])|-?[1-9]\d{0,2}(?: \d{3})+(?![\d.,])"
                        r"|(?<![\d,])-?\d+,\d+(?![\d,])|-?\d+/\d+|-?\d+(?:\.\d+)?|-?\.\d+)")
_NUMBER_THEN_WORDS_RE = re.compile(r"^(-?[\d,]*\.?\d+(?:/\d+)?)\s+[A-Za-z][A-Za-z ]*$")
# "The largest $n$ is 34": the value a prose statement states follows its last copula.
_COPULA_RE = re.compile(r"\s(?:is|are|was|were|equals|would\s+be)\s+(?=\S)", re.IGNORECASE)
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
# "A. Because ..." opening the answer: a letter, then "." or ")", then the reason.
_MC_FIRST_LINE_RE = re.compile(r"^(?:\*\*)?\(?([A-D])(?:\*\*)?[.)](?:\*\*)?\s+\S")
_OPTION_LINE_RE = re.compile(r"^\s*(?:\*\*)?\(?([A-J])[.)]\s", re.MULTILINE)
_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")
_BRACE_RE = re.compile(r"\\.|[{}]", re.DOTALL)


@dataclass(frozen=True)
class Extracted:
    """The answer a response states; ``parts``: the boxes that together form it, in order (``text`` joins them)."""

    text: str
    parts: tuple[str, ...] = ()


def extract_answer(response: str, multiple_choice: bool = False) -> str | None:
    """The final answer stated in ``response``, or None when there is none."""
    found = extract_final(response, multiple_choice=multiple_choice)
    return found.text if found is not None else None


def extract_final(response: str, multiple_choice: bool = False) -> Extracted | None:
    """The final answer of ``response`` with its parts, or None when there is none."""
    # one space or newline per whitespace run: runs of optional ``\s*`` would backtrack polynomially
    squeezed = re.sub(r"\s*\n\s*", "\n", re.sub(r"[^\S\n]+", " ", response))
    for part in search_order(squeezed):
        found = _extract_letter(part) if multiple_choice else _extract_math(part)
        if found is not None:
            return found
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty ``\\boxed{...}``-style command in ``text``."""
    box = next(_boxes_from_end(text), None)
    return box.content if box is not None else None


def search_order(response: str) -> list[str]:
    """The text after ``</think>`` first, so a reasoning model's drafts do not win; then the whole."""
    if THINK_END in response:
        final_part = response.rsplit(THINK_END, 1)[1]
        if final_part.strip():
            return [final_part, response]
    return [response]


@dataclass(frozen=True)
class _Box:
    content: str
    start: int  # index of the backslash of the command
    end: int    # index just past the closing brace (or the bare token)


def _boxes_from_end(text: str):
    """The complete, non-empty boxes of ``text``, last first."""
    # Once a box fails to close, no earlier box can close past its start: stop scanning there,
    # which keeps a response full of unclosed boxes linear instead of quadratic.
    limit = len(text)
    matches = list(_BOX_RE.finditer(text))
    # every "]" found once: a search from each box would make many unclosed "\\boxed[" quadratic
    closers = [m.start() for m in re.finditer(r"\]", text)] if matches else []
    for match in reversed(matches):
        if match.start() >= limit:
            continue
        content, opened_at, end = _box_argument(text, match.end(), limit, closers)
        if content:
            yield _Box(content, match.start(), end)
        if content is None and opened_at is not None:
            limit = opened_at


def _box_argument(text: str, start: int, limit: int, closers: list[int]) -> tuple[str | None, int | None, int]:
    """(argument, index of its opening brace, end) of a box command whose name ends at ``start``;
    the argument is None when the braces do not close before ``limit``."""
    i = _skip_spaces(text, start)
    for _ in range(MAX_OPTIONAL_ARGS):  # \\framebox[width][pos]{...}
        if not text.startswith("[", i):
            break
        k = bisect.bisect_left(closers, i)
        if k == len(closers) or closers[k] >= limit:
            return None, None, start
        start = closers[k] + 1
        i = _skip_spaces(text, start)
    if text.startswith("[", i):  # more optional arguments than any box command takes: not a box
        return None, None, start
    if text.startswith("{", i):
        depth = 0
        for brace in _BRACE_RE.finditer(text, i, limit):
            depth += {"{": 1, "}": -1}.get(brace.group(0), 0)  # an escaped brace \\{ or \\} is neither
            if depth == 0:
                return text[i + 1 : brace.start()].strip(), i, brace.end()
        return None, i, start
    token = re.match(r"[^\s$]+", text[i : i + 200])
    if i == start or not token:  # "\\boxed5" is not LaTeX for a box; only "\\boxed 5" is
        return None, None, start
    return token.group(0).rstrip(".,;"), None, i + len(token.group(0))


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


# Between two boxes of one answer: spacing, math delimiters, punctuation, markup and a few words
# ("\\quad \\text{and} \\quad", ", ", "\\text{ for part (a) and }").
_SEPARATOR_NOISE_RE = re.compile(r"\\q?quad|\\[,;:! ]|~|\$|\\[()\[\]]|\*\*|\\(?:text|textbf|mbox|mathrm)\s*\{|[{}]")
_CONJUNCTION_RE = re.compile(r"^(?:[,;]\s*)?(?:and|or|&)?\s*[,;]?$", re.IGNORECASE)
_SENTENCE_BREAK_RE = re.compile(r"[.:!?](?:\s|$)|\n\s*\n")


def _joins_boxes(separator: str) -> bool:
    """True when ``separator``, the text between two boxes, only joins them (docs/grading.md, rule 1a)."""
    if len(separator) > MAX_BOX_SEPARATOR_CHARS or _SENTENCE_BREAK_RE.search(separator):
        return False
    words = _SEPARATOR_NOISE_RE.sub(" ", separator).split()
    if _CONJUNCTION_RE.match(" ".join(words)):
        return True
    tokens = [w.strip(",;").lower() for w in words]
    return len(tokens) <= MAX_SEPARATOR_WORDS and bool({"and", "or"} & set(tokens))


def _last_boxes(text: str) -> list[_Box]:
    """The last box and those before it that form one answer with it, in order."""
    boxes = _boxes_from_end(text)
    last = next(boxes, None)
    if last is None:
        return []
    joined = [last]
    for box in boxes:
        if (len(joined) == MAX_JOINED_BOXES or box.end > joined[-1].start or box.content == joined[-1].content
                or not _joins_boxes(text[box.end : joined[-1].start])):
            break
        joined.append(box)
    return joined[::-1]


def _extract_math(text: str) -> Extracted | None:
    boxes = _last_boxes(text)
    if boxes:
        later = _answer_statement(text, after_box=boxes[-1].end)
        if later is not None:
            return Extracted(later)
        parts = tuple(box.content for box in boxes)
        return Extracted(", ".join(parts), parts if len(parts) > 1 else ())
    value = _answer_statement(text) or _last_span_or_number(text)
    return Extracted(value) if value else None


def _answer_statement(text: str, after_box: int | None = None) -> str | None:
    """The value after the last "final answer is" / "the answer is" / "answer:" phrase. ``after_box``
    (where the last box ends): only a "final answer" after it that states a value (a digit or LaTeX)."""
    for match in reversed(list(_ANSWER_STATEMENT_RE.finditer(text, after_box or 0))):
        if after_box is not None and "final" not in match.group(0).lower():
            continue
        line = text[match.end() : match.end() + 1000].split("\n", 1)[0]  # bounded: many statements stay linear
        value = _statement_value(line)
        if value and (after_box is None or re.search(r"[\d\\]", value)):
            return value
    return None


def _statement_value(line: str) -> str | None:
    line = line.strip()
    math = _leading_math(line)
    if math is not None:
        return math.strip() or None
    boxed = last_boxed(line)
    if boxed:
        return boxed
    # Plain prose: the value ends at the first sentence break ("." not inside a number).
    value = re.split(r"\.(?:\s|$)|;|\*\*", line, maxsplit=1)[0].strip().rstrip(".").strip()
    if not re.search(r"[A-Za-z0-9]", value):  # a lone delimiter ("$" of a span that goes on below) states nothing
        return None
    # what the sentence states (docs/grading.md, rule 2)
    copulas = list(_COPULA_RE.finditer(value))
    if copulas and _is_prose(value[: copulas[-1].start()]):
        value = value[copulas[-1].end() :].strip()
        math = _leading_math(value)
        if math is not None:
            return math.strip() or None
    number_then_words = _NUMBER_THEN_WORDS_RE.match(value)  # "18 dollars" -> "18"
    if number_then_words:
        return number_then_words.group(1)
    outside_math = list(value)
    for start, end, _ in _math_spans(value):
        outside_math[start:end] = " " * (end - start)
    if _is_prose("".join(outside_math)):
        return _last_span_or_number(value) or value
    return value


_PROSE_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}\b|\b(?:to|of|is|in|at|or|by|an|on|if|so|as|it|we|be)\b")
_LATEX_WORD_RE = re.compile(r"\\(?:text\w*|mathrm|mathbf|mbox|operatorname|begin|end)\s*\{[^{}]*\}|\\[A-Za-z]+")


def _is_prose(text: str) -> bool:
    """True when ``text`` holds words of running text (LaTeX commands and \\text{} aside)."""
    return bool(_PROSE_WORD_RE.search(_LATEX_WORD_RE.sub(" ", text)))


def _leading_math(line: str) -> str | None:
    """Content of a math span ($...$, $$...$$, \\(...\\), \\[...\\]) that opens ``line``."""
    for opener, closer in MATH_DELIMITERS.items():
        if line.startswith(opener):
            end = line.find(closer, len(opener))
            if end > 0:
                inner = line[len(opener) : end]
                return last_boxed(inner) or inner
    return None


_DELIMITER_RE = re.compile(r"\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]")
MATH_DELIMITERS = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}  # opener -> closer, "$$" before "$"
_INLINE = ("$", "\\(")  # inline math does not run across a line break


def _math_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every math span, in order, in one pass; a "$" after a digit is currency."""
    spans: list[tuple[int, int, str]] = []
    if "$" not in text and "\\(" not in text and "\\[" not in text:  # most text: no scan at all
        return spans
    opener: re.Match | None = None
    for token in _DELIMITER_RE.finditer(text):
        mark = token.group(0)
        if mark == "\\$":
            continue
        if opener is None:
            if mark in MATH_DELIMITERS and not (mark == "$" and token.start() > 0 and text[token.start() - 1].isdigit()):
                opener = token
            continue
        content = text[opener.end() : token.start()]
        if opener.group(0) in _INLINE and "\n" in content:
            opener = token if mark in MATH_DELIMITERS else None  # the old opener was a stray: start again here
            continue
        if mark == MATH_DELIMITERS[opener.group(0)]:
            spans.append((opener.start(), token.end(), content))
            opener = None
    return spans


_BARE_FRACTION_RE = re.compile(r"-?\\[dtc]?frac\s*\{[^{}$]*\}\s*\{[^{}$]*\}")


def _reads_as_math(content: str) -> bool:
    """Not prose between two currency signs ("$5 and $10"): no two words, no number followed by words."""
    words = _PROSE_WORD_RE.findall(_LATEX_WORD_RE.sub(" ", content))
    currency = content[:1].isdigit() and content[-1:].isspace() and bool(words)
    return bool(content.strip()) and len(words) < 2 and not currency


def _last_span_or_number(text: str) -> str | None:
    """docs/grading.md, rules 3 and 4 (a bare fraction counts as a span: math-verify reads those too)."""
    last = next((s for s in reversed(_math_spans(text)) if _reads_as_math(s[2])), None)
    if last is None and "\\" in text and len(text) <= MAX_UNDELIMITED_CHARS and not _is_prose(text):
        return _span_value(text)
    after = last[1] if last is not None else 0
    fraction = _last_match(_BARE_FRACTION_RE, text, after)
    if fraction is not None:
        last, after = (fraction.start(), fraction.end(), fraction.group(0)), fraction.end()
    number = _last_match(_NUMBER_RE, text, after)
    if number is not None:
        return number.group(0)
    return _span_value(last[2]) if last is not None else None


def _last_match(pattern: re.Pattern[str], text: str, pos: int = 0) -> re.Match[str] | None:
    last = deque(pattern.finditer(text, pos), maxlen=1)  # keeps one match at a time
    return last[0] if last else None


def _span_value(content: str) -> str:
    """A span's answer: a chain of equalities ("3 + 4 = 7 = x") gives its last side."""
    content = content.strip().rstrip(".,").strip()
    if "," in content or ";" in content:  # "a = 1, b = 2" is one answer
        return content
    depths = itertools.accumulate((char == "{") - (char == "}") for char in content)
    equals = [i for i, (char, depth) in enumerate(zip(content, depths))
              if char == "=" and depth == 0 and (i == 0 or content[i - 1] not in "<>!\\")]
    return content[equals[-1] + 1 :].strip() if len(equals) > 1 else content


def _extract_letter(text: str) -> Extracted | None:
    boxed = last_boxed(text)
    if boxed is not None:  # "B", "(B)", "\\text{B}", "B) 42"
        letter = _BOXED_LETTER_RE.match(_TEXT_WRAPPER_RE.sub(r"\1", boxed).strip().strip("*").strip())
        if letter:
            return Extracted(letter.group(1))
    for pattern in (_MC_ANSWER_RE, _MC_CHOICE_RE):
        found = pattern.findall(text)
        if found:
            return Extracted("".join(found[-1]))  # one of the two groups is empty
    last_line = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
    on_last_line = _MC_LAST_LINE_RE.match(last_line)
    if on_last_line:
        return Extracted(on_last_line.group(1) or on_last_line.group(2))
    # "A. Because ...", unless the response lists the options ("A) x", "B) y")
    opening = _MC_FIRST_LINE_RE.match(text.strip())
    if opening and set(_OPTION_LINE_RE.findall(text.strip())) <= {opening.group(1)}:
        return Extracted(opening.group(1))
    return None
