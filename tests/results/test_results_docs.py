"""The results pages (docs/results-testbed.md, docs/results-real.md) quote no figure: every measured
number lives in a report's page (docs/reports/<name>/README.md), which tests/analysis/test_reports.py
regenerates from the report's committed records, its readings included. A number typed into a
results page's prose fails here; so does any source mark (`<!--= -->`, `<!--~ -->`): a figure is
computed from records or not written.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ("results-testbed.md", "results-real.md")


def prose(text: str) -> str:
    """A page's words: without code blocks, inline code, link targets and headings."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


# A number standing alone (1.42x, 0.975, 8%, "1,240"), not a part of a name (GSM8K, MATH500, 0.5B).
FIGURE = re.compile(r"(?<![A-Za-z0-9_.])\d+(?:[.,]\d+)*(?:x|%)?(?!\.?[A-Za-z0-9])")


def figures(text: str) -> list[str]:
    words = prose(text)
    return [words[max(0, m.start() - 40):m.end() + 10].replace("\n", " ") for m in FIGURE.finditer(words)]


@pytest.mark.parametrize("page", PAGES)
def test_a_results_page_quotes_no_figure_of_its_own(page):
    text = (DOCS / page).read_text()
    assert "<!--=" not in text and "<!--~" not in text, f"{page}: a source mark; quote figures only in a report"
    assert figures(text) == [], f"{page}: figures no record computes: {figures(text)}"


@pytest.mark.parametrize("page", PAGES)
def test_a_results_page_links_only_reports_that_exist(page):
    for target in re.findall(r"\]\((reports/[^)]+)\)", (DOCS / page).read_text()):
        assert (DOCS / target).exists(), f"{page} links {target}, which is not committed"


def test_a_figure_in_prose_is_found_and_code_and_links_are_not():
    page = ("Run `--n 20` ([x](reports/t2/README.md)) on GSM8K and MATH500 with the 0.5B.\n```\npython s.py --n 40\n```\n"
            "# Table 1\nIt runs 1.42x faster, on 8% of 1,240 problems (Δ -0.100, p 0.004).\n")
    assert FIGURE.findall(prose(page)) == ["1.42x", "8%", "1,240", "0.100", "0.004"]
    assert len(figures(page)) == 5


def test_the_testbed_page_leads_with_the_estimated_speedup_and_says_why():
    words = prose((DOCS / "results-testbed.md").read_text())
    assert "estimated speedup" in words and "because" in words
    assert words.index("estimated speedup") < words.index("CPU-time speedup") < words.index("wall-clock speedup")
