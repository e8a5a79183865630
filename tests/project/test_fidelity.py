"""docs/fidelity.md against the papers' own texts: every quote is in its paper (whitespace collapsed),
every citation carries a number, and every number a cited preset value has is in its quotes. The
texts are not in the repository (conftest.paper_file: skipped where absent, failed in CI)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import paper_file

FIDELITY = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"
PAPER_FILES = {"R-Stitch": "rstitch.txt", "RSD": "rsd.txt", "SpecReason": "specreason.txt", "Arbitrage": "arbitrage.txt",
               "EASD": "easd.txt"}
PAPER_NAME = re.compile(r"(?<![\w-])(R-Stitch|RSD|SpecReason|Arbitrage|EASD)(?![\w-])")
# A citation's number: a section (§4.1), an equation, table, figure, algorithm, definition or appendix.
NUMBERED = re.compile(r"\d|appendix [A-Z]\b", re.IGNORECASE)
UNCITED_SECTIONS = ("Choices of ours (no paper counterpart)", "Not yet faithful")
# The one table whose citation is its last cell; the choice tables cite in their second ("paper").
PRESET_SECTION = "Presets: every value and its citation"
WORD_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
MIN_QUOTE = 8  # characters: a quote states a value in words, not a lone number


def collapsed(text: str) -> str:
    return " ".join(text.split())


def table_rows() -> list[dict]:
    """Each table row outside the uncited sections: its section, its cells and its citation cell."""
    rows, section = [], ""
    for line in FIDELITY.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        if not line.startswith("|") or section in UNCITED_SECTIONS:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("choice", "presets") or set(cells[0]) <= {"-"}:
            continue
        citation = cells[-1] if section == PRESET_SECTION else cells[1]
        rows.append({"section": section, "cells": cells, "citation": citation, "line": line})
    return rows


def citations(cell: str) -> list[tuple[str, str, str]]:
    """(paper, head, quote) for each quote of a cell: the paper is the last one named before the quote
    and the head the text from that name to the quote (a second quote of one citation reuses it)."""
    out, paper, head, position = [], None, "", 0
    for match in re.finditer(r'"([^"]*)"', cell):
        between = cell[position:match.start()]
        names = list(PAPER_NAME.finditer(between))
        if names:
            paper, head = names[-1].group(1), between[names[-1].start():]
        out.append((paper, head, match.group(1)))
        position = match.end()
    return out


def numbers(text: str) -> set[float]:
    """The numbers a quote states: digits (8k is 8192), and number words."""
    found = {float(m.group(1)) * (1024 if m.group(2) else 1) for m in re.finditer(r"(\d+(?:\.\d+)?)(k\b)?", text)}
    found |= {float(v) for w, v in WORD_NUMBERS.items() if re.search(rf"\b{w}\b", text, re.IGNORECASE)}
    return found


def number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


ROWS = table_rows()


def row_id(row: dict) -> str:
    return f"{row['section'][:12]}:{row['cells'][0][:40]}:{row['cells'][1][:24]}"


@pytest.fixture(scope="module")
def papers() -> dict[str, str]:
    return {name: collapsed(paper_file(file).read_text()) for name, file in PAPER_FILES.items()}


def test_the_tables_are_parsed():
    assert len(ROWS) > 120
    assert {row["section"] for row in ROWS} == {"R-Stitch / R-Stitch+", "RSD", "SpecReason", "Arbitrage", "EASD",
                                               PRESET_SECTION}


@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_every_row_cites_its_paper_by_number_with_quotes_found_in_the_text(row, papers):
    citation = row["citation"]
    found = citations(citation)
    if citation.startswith("not stated"):
        # The paper said nothing: name it and the numbered parts searched; any quote must still be its text.
        paper = PAPER_NAME.search(citation)
        assert paper and NUMBERED.search(citation[paper.end():]), f"a 'not stated' row names the paper and where: {citation}"
        assert "ours" in row["line"], f"a 'not stated' row says what we chose: {citation}"
    else:
        assert found, f"no quote: {citation}"
    for paper, head, quote in found:
        assert paper, f"a quote without its paper: {quote!r}"
        assert NUMBERED.search(head), f"{paper}'s citation carries no section, table, figure or equation number: {head!r}"
        assert len(quote) >= MIN_QUOTE, f"too short to state a value: {quote!r}"
        assert collapsed(quote) in papers[paper], f"not in {PAPER_FILES[paper]}: {quote!r}"


PRESET_ROWS = [row for row in ROWS if row["section"] == PRESET_SECTION and not row["citation"].startswith("not stated")]


@pytest.mark.parametrize("row", PRESET_ROWS, ids=row_id)
def test_every_number_a_cited_preset_value_has_is_in_its_quotes(row):
    """A cited value is stated by its quotes: each number of the value occurs in them (a row that also
    says "ours" for a part of the value needs one number from the paper)."""
    values = [number(v.strip()) for v in row["cells"][2].strip("`").split(",")]
    values = [v for v in values if v is not None]
    if not values:
        return
    stated = set().union(*(numbers(quote) for _, _, quote in citations(row["citation"])))
    missing = [v for v in values if v not in stated]
    if "ours" in row["citation"]:
        assert len(missing) < len(values), (row["cells"][:3], sorted(stated))
    else:
        assert not missing, (row["cells"][:3], missing, sorted(stated))


def test_a_changed_quote_is_not_found(papers):
    """The check is strict: one changed value in a quote fails it."""
    assert collapsed("set the token budget to be 8192 tokens") in papers["SpecReason"]
    assert collapsed("set the token budget to be 4096 tokens") not in papers["SpecReason"]
    assert "[0.6, 0.7, 0.8, 0.9]" in papers["RSD"] and "[0.5, 0.6, 0.7, 0.8, 0.9]" not in papers["RSD"]


def test_every_test_a_row_names_exists():
    """`tests/x.py::name`, and a `::name` after it (same file), name test functions that exist."""
    missing, current = [], None
    for match in re.finditer(r"`(tests/[\w/]+\.py)(?:::(\w+))?`|`::(\w+)`", FIDELITY.read_text()):
        current = match.group(1) or current
        name = match.group(2) or match.group(3)
        path = FIDELITY.parent.parent / current if current else None
        if path is None or not path.is_file():
            missing.append(current or match.group(0))
        elif name and not re.search(rf"^def {name}\(", path.read_text(), re.MULTILINE):
            missing.append(f"{current}::{name}")
    assert not missing, missing
