"""Answers that are data rather than math: ZebraLogic solution grids and CRUXEval's predicted
Python outputs. Both are parsed, not compared as text, so spacing and quoting do not matter."""
from __future__ import annotations

import ast
import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any

from rstitch.grading.extract import THINK_END, last_boxed

Grid = dict[str, dict[str, str]]  # "House 1" -> {"Name": "Arnold", ...}

_ANSWER_TAG_RE = re.compile(r"\[ANSWER\](.*?)\[/ANSWER\]", re.DOTALL)
_ASSERT_RE = re.compile(r"^\s*assert\b.*?==\s*", re.DOTALL)
_FENCE_RE = re.compile(r"```[A-Za-z0-9_]*\n(.*?)```", re.DOTALL)
MAX_LITERAL_CHARS = 10_000  # literal_eval of a huge nested literal can exhaust the stack


def _final_part(response: str) -> str:
    return response.rsplit(THINK_END, 1)[1] if THINK_END in response else response


def grid_from_solution(solution: Mapping[str, Any]) -> Grid:
    """The hub's ``{"header": ["House", "Name", ...], "rows": [["1", "Arnold", ...], ...]}`` as
    ``{"House 1": {"Name": "Arnold", ...}}``, the shape the prompt asks the model to answer in."""
    header = list(solution["header"])
    return {f"{header[0]} {row[0]}": {column: str(value) for column, value in zip(header[1:], list(row)[1:])}
            for row in solution["rows"]}


def extract_grid(response: str) -> Grid | None:
    """The last JSON object of the final answer that holds a grid (under "solution" or at top level)."""
    for candidate in reversed(_json_objects(_final_part(response))):
        grid = candidate.get("solution", candidate) if isinstance(candidate, dict) else None
        if isinstance(grid, dict) and grid and all(isinstance(v, dict) for v in grid.values()):
            return {str(k): {str(c): str(v) for c, v in row.items()} for k, row in grid.items()}
    return None


def _json_objects(text: str) -> list[Any]:
    """Every top-level ``{...}`` of ``text`` that parses as JSON, in order."""
    decoder = json.JSONDecoder()
    found, index = [], text.find("{")
    while index >= 0:
        try:
            value, end = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            index = text.find("{", index + 1)
            continue
        found.append(value)
        index = text.find("{", end)
    return found


def grade_grid(response: str, gold: Grid) -> dict[str, Any]:
    """Right iff every cell matches (case and surrounding space ignored); ``cell_accuracy`` too."""
    predicted = extract_grid(response)
    if predicted is None:
        return {"answer": None, "correct": False, "cell_accuracy": 0.0}
    lowered = {_key(house): {_key(c): _key(v) for c, v in row.items()} for house, row in predicted.items()}
    cells = [(_key(house), _key(column), _key(value)) for house, row in gold.items() for column, value in row.items()]
    right = sum(1 for house, column, value in cells if lowered.get(house, {}).get(column) == value)
    return {"answer": json.dumps(predicted, sort_keys=True), "correct": right == len(cells) > 0,
            "cell_accuracy": right / len(cells) if cells else 0.0}


def _key(text: str) -> str:
    return " ".join(str(text).split()).lower()


def extract_literal(response: str) -> str | None:
    """The predicted output: ``[ANSWER]...[/ANSWER]``, else the last box, else the last fenced
    block, of the final answer; an ``assert f(...) == X`` wrapper is reduced to ``X``."""
    text = _final_part(response)
    tagged = _ANSWER_TAG_RE.findall(text)
    fenced = _FENCE_RE.findall(text)
    raw = (tagged[-1] if tagged else None) or last_boxed(text) or (fenced[-1] if fenced else None)
    if raw is None:
        return None
    return _ASSERT_RE.sub("", raw.strip(), count=1).strip() or None


def literals_equal(predicted: str, gold: str) -> bool:
    """Equal as Python values when both parse (``'a'`` and ``"a"``), else as text."""
    if len(predicted) <= MAX_LITERAL_CHARS and len(gold) <= MAX_LITERAL_CHARS:
        with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return ast.literal_eval(predicted) == ast.literal_eval(gold)
    return predicted.strip() == gold.strip()


def grade_literal(response: str, gold: str) -> dict[str, Any]:
    predicted = extract_literal(response)
    return {"answer": predicted, "correct": predicted is not None and literals_equal(predicted, gold)}
