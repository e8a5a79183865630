"""The readings of the results pages quote their tables: every figure they take from a table is
marked with the cell (or the arithmetic on cells) it comes from, and must match it.

A mark follows the number it checks, invisible once rendered:

    SpecDec runs at 0.81x<!--= specdec.speedup --> ...
    0.98<!--= rstitch[tau=0.005].speedup -->-2.37x<!--= rstitch[tau=0.02].speedup -->
    8%<!--= 1 - rstitch[tau=0.001].share -->  (a percentage is compared as a fraction)
    a ratio of 1.6<!--= llamacpp/gsm8k:note(ratio) -->
    12.4 ms<!--= 5.91 / 478 * 1000 -->  (arithmetic on figures quoted from a paper)

A reference is `[table:]method[setting].column`: `table` is `<block>/<name>` (a generated block's
bold table title, e.g. `llamacpp/gsm8k`, `results/step`) or a hand table's `<!-- table: name -->`;
without it the method's row is looked up in every table of the page, which must agree. Columns are
the headers, lower case with `_` for spaces ("LLM token share" is `share`, "latency (s)" `latency`,
either acceptance rate `acceptance`). `note(word)` is the number after `word` in the bullet lines
under a generated table. The quoted number must equal the value to the precision it is quoted at.

Figures a reading takes from elsewhere (the runs' samples, other pages) carry `<!--~ source -->`.
Every speedup (`1.42x`) and every three-decimal fraction (`0.975`) in a reading must carry one mark
or the other, so a reading cannot quote a speedup its table does not show.
"""
from __future__ import annotations

import ast
import operator
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = ("results-testbed.md", "results-real.md")
MARK = re.compile(r"(?P<number>\d+(?:,\d{3})*(?:\.\d+)?)(?P<unit>x|%)?(?P<space>\s?)<!--(?P<kind>[=~])(?P<body>.*?)-->", re.S)
BLOCK = re.compile(r"<!-- results(?:-(?P<name>[\w-]+))?:begin -->(?P<body>.*?)<!-- results(?:-[\w-]+)?:end -->", re.S)
REF = re.compile(r"(?:(?P<table>[\w-]+/[\w-]+|[\w-]+):)?"
                 r"(?:note\((?P<note>[^)]+)\)|(?P<method>[a-z_]+)(?:\[(?P<setting>[^\]]*)\])?\.(?P<column>[a-z_@0-9]+))")
# Figures a reading must mark: speedups, and fractions at the three decimals the tables print; a
# setting's value (tau 0.001, delta 0.005) names a row, not a figure.
MUST_MARK = re.compile(r"(?<![\w.=])(?:\d+\.\d+x|0\.\d{3})(?![\w.])")
# The bullet lines right under a table (after at most one blank line): its notes, not a reading.
TABLE_NOTES = re.compile(r"((?:^\|.*\n)+\n?)(?:^- .*\n)+", re.M)
SETTING_BEFORE = re.compile(r"(?:tau|delta|tau_[hH]|threshold|p)\s*(?:=\s*|from\s+)?$")
COLUMN_ALIASES = {"llm_token_share": "share", "latency_(s)": "latency", "spec_acceptance_rate": "acceptance",
                  "acceptance_rate": "acceptance", "δ_accuracy_vs_llm_only": "accuracy_diff", "per-token_ratio": "per_token_ratio"}
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def column_key(header: str) -> str:
    """A header as a reference names it: without its interval notes ("accuracy ± se", "speedup [95% CI]")."""
    key = re.sub(r"\s*(±\s*se|\[[^\]]*\])\s*$", "", header.strip().lower()).replace(" ", "_")
    return COLUMN_ALIASES.get(key, key)


def parse_tables(text: str) -> dict[str, dict]:
    """`name -> {"rows": {(method, setting): {column: cell}}, "notes": [lines], "start": offset}`."""
    tables: dict[str, dict] = {}
    spans = [(m.start(), m.end(), m.group("name") or "results") for m in BLOCK.finditer(text)]
    title = None
    offset = 0
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        block = next((name for start, end, name in spans if start <= offset < end), None)
        if m := re.fullmatch(r"\*\*(\w+)\*\*.*", stripped):
            title = f"{block}/{m.group(1)}" if block else None
        elif m := re.fullmatch(r"<!-- table: ([\w-]+) -->", stripped):
            title = m.group(1)
        elif stripped.startswith("|") and title:
            cells = [c.strip() for c in stripped.strip("|").split("|")]
            table = tables.setdefault(title, {"rows": {}, "notes": [], "start": offset, "header": None})
            if table["header"] is None:
                table["header"] = [column_key(c) for c in cells]
            elif not set(stripped) <= set("|-: "):
                row = dict(zip(table["header"], cells))
                table["rows"][(row["method"], row.get("setting", ""))] = row
        elif stripped.startswith("- ") and title in tables:
            tables[title]["notes"].append(stripped)
        elif stripped and not stripped.startswith("|") and title in tables and not stripped.startswith("- "):
            title = None  # prose ends a table and its notes
        offset += len(line)
    return tables


def cell_value(tables: dict, ref: re.Match) -> float:
    """The number a reference names."""
    name = ref.group("table")
    candidates = {k: v for k, v in tables.items() if name is None or k == name or k.endswith("/" + name)}
    assert candidates, f"no table {name!r}"
    if ref.group("note"):
        values = set()
        for table in candidates.values():
            for note in table["notes"]:
                if m := re.search(rf"\b{re.escape(ref.group('note'))}\b\D*?(\d+(?:\.\d+)?)", note):
                    values.add(float(m.group(1)))
        assert len(values) == 1, f"note({ref.group('note')}) in {sorted(candidates)}: {values}"
        return values.pop()
    key = (ref.group("method"), ref.group("setting") or "")
    values = set()
    for table in candidates.values():
        if key in table["rows"]:
            cell = table["rows"][key].get(ref.group("column"))
            assert cell not in (None, "", "-"), f"{ref.group(0)}: no value in column {ref.group('column')!r}"
            number = re.match(r"[-+]?\d+(?:\.\d+)?", cell)  # the value, before "/ n", "± se" or "[low, high]"
            assert number, f"{ref.group(0)}: {cell!r} is not a number"
            values.add(float(number.group(0)))
    assert len(values) == 1, f"{ref.group(0)}: found {values or 'no row'} in {sorted(candidates)}"
    return values.pop()


def evaluate(expression: str, tables: dict) -> float:
    """An arithmetic expression over numbers and references."""
    refs: list[float] = []

    def substitute(m: re.Match) -> str:
        refs.append(cell_value(tables, m))
        return f"__ref{len(refs) - 1}"

    tree = ast.parse(REF.sub(substitute, expression.strip()), mode="eval")

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id.startswith("__ref"):
            return refs[int(node.id[5:])]
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise AssertionError(f"not arithmetic on table cells: {expression!r}")

    return value(tree)


def quoted_value(number: str, unit: str | None) -> tuple[float, float]:
    """The quoted number as the table's value (a percentage as a fraction) and its rounding slack."""
    decimals = len(number.split(".")[1]) if "." in number else 0
    value, slack = float(number.replace(",", "")), 0.5 * 10 ** -decimals + 1e-9
    return (value / 100, slack / 100) if unit == "%" else (value, slack)


def readings(text: str) -> str:
    """The page's prose: without generated blocks, tables, code blocks and headings."""
    text = BLOCK.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = TABLE_NOTES.sub(r"\1", text)  # a hand table's notes are its data, like its rows
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("|", "#", "Generated by")))


def page_marks(page: str) -> list[tuple[str, re.Match]]:
    text = (DOCS / page).read_text()
    return [(page, m) for m in MARK.finditer(readings(text)) if m.group("kind") == "="]


@pytest.mark.parametrize("page,mark", [pm for page in PAGES for pm in page_marks(page)],
                         ids=lambda x: x if isinstance(x, str) else x.group(0)[:60])
def test_each_figure_a_reading_quotes_is_its_tables(page, mark):
    tables = parse_tables((DOCS / page).read_text())
    quoted, slack = quoted_value(mark.group("number"), mark.group("unit"))
    actual = evaluate(mark.group("body"), tables)
    assert abs(quoted - actual) <= slack, f"{page}: {mark.group(0)} quotes {quoted} but the table gives {actual:.4g}"


@pytest.mark.parametrize("page", PAGES)
def test_every_speedup_and_table_fraction_in_a_reading_carries_its_source(page):
    prose = readings((DOCS / page).read_text())
    unmarked = []
    for m in MUST_MARK.finditer(prose):
        if SETTING_BEFORE.search(prose[max(0, m.start() - 12):m.start()]):
            continue
        after = prose[m.end():m.end() + 6]
        if not re.match(r"\s?<!--[=~]", after):
            unmarked.append(prose[max(0, m.start() - 40):m.end() + 10].replace("\n", " "))
    assert not unmarked, f"{page}: figures without a source mark: {unmarked}"


def test_marks_are_checked_on_a_page_whose_words_drifted():
    """A reading quoting a speedup its table does not show fails; an unmarked speedup fails."""
    page = ("<!-- results:begin -->\n**speculative**\n\n| method | setting | speedup |\n|---|---|---|\n"
            "| specdec |  | 0.81 |\n<!-- results:end -->\n\n")
    tables = parse_tables(page)
    good = next(MARK.finditer(page + "SpecDec runs at 0.81x<!--= specdec.speedup -->."))
    drifted = next(MARK.finditer(page + "SpecDec runs at 1.42x<!--= specdec.speedup -->."))
    assert evaluate(good.group("body"), tables) == pytest.approx(0.81)
    quoted, slack = quoted_value(drifted.group("number"), drifted.group("unit"))
    assert abs(quoted - evaluate(drifted.group("body"), tables)) > slack
    assert MUST_MARK.search(readings(page + "It runs 1.42x faster than LLM-only.\n"))


def test_a_hand_tables_notes_are_data_and_the_readings_below_them_are_checked():
    """The bullets right under a table are its notes (exempt, like its rows); bullets after prose are readings."""
    page = ("<!-- table: earlier -->\n| method | setting | accuracy |\n|---|---|---|\n| llm_only |  | 0.610 |\n\n"
            "- R-Stitch LLM token share: tau=0.02: 0.347\n\nReadings:\n\n- The LLM solves 0.610 of them.\n")
    prose = readings(page)
    assert "0.347" not in prose
    assert MUST_MARK.search(prose) and MUST_MARK.search(prose).group(0) == "0.610"
