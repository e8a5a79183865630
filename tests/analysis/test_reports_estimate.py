"""Reports lead with the estimated speedup (rstitch/analysis/record_reports.py): where every record
of a report holds its latency model's estimate, the tables show `speedup_estimate` with its paired
interval before the CPU-time and wall speedups, and the page says why; a report decoded without a
latency model shows no estimate column. Read from the committed records: no decoding."""
from __future__ import annotations

import shutil
from pathlib import Path

from rstitch.analysis import record_reports as reports

REPORTS = Path(__file__).resolve().parents[2] / "docs" / "reports"
ESTIMATED, CPU, WALL = (reports.COLUMNS[c][0] for c in reports.SPEEDUP_COLUMNS)


def header(page: str) -> list[str]:
    line = next(line for line in page.splitlines() if line.startswith("| method |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_estimate_leads_every_speedup_wherever_the_report_lists_one():
    assert reports.table_columns(["n", "latency", "speedup", "cpu_speedup", "tokens"]) == [
        "n", "latency", "estimate_speedup", "cpu_speedup", "speedup", "tokens"]
    assert reports.table_columns(["n", "speedup", "tokens"]) == ["n", "estimate_speedup", "speedup", "tokens"]
    assert reports.table_columns(["n", "tokens"]) == ["n", "tokens"]


def test_the_testbed_report_shows_the_estimate_first_with_its_paired_interval():
    folder = REPORTS / "testbed"
    manifest = reports.load_manifest(folder)
    summaries = reports.report_summaries(manifest, folder)
    stitch = summaries["rstitch-tau=0.02"]
    low, high = stitch["speedup_estimate_ci"]
    assert low < stitch["speedup_estimate"] < high
    page = reports.render_page(folder)
    columns = header(page)
    assert columns.index(ESTIMATED) < columns.index(CPU) < columns.index(WALL)
    cell = f"{stitch['speedup_estimate']:.2f} [{low:.2f}, {high:.2f}]"
    row = next(line for line in page.splitlines() if line.startswith("| rstitch | tau=0.02 |"))
    assert row.split("|")[columns.index(ESTIMATED) + 1].strip() == cell
    assert reports.ESTIMATE_NOTE in page


def test_a_report_without_a_latency_model_shows_no_estimate():
    folder = REPORTS / "real-pair-hf-gsm8k"
    manifest = reports.load_manifest(folder)
    rows = [r for run in manifest["runs"] for r in reports.read_records(folder, run)]
    assert rows and all(r.get("latency_estimate_s") is None for r in rows)
    page = reports.render_page(folder)
    columns = header(page)
    assert ESTIMATED not in columns and columns.index(CPU) < columns.index(WALL)
    assert reports.ESTIMATE_NOTE not in page


def test_one_record_without_an_estimate_drops_the_estimate_of_its_run(tmp_path):
    folder = tmp_path / "testbed"
    shutil.copytree(REPORTS / "testbed", folder)
    rows = reports.read_records(folder, "rstitch-tau=0.02")
    rows[0].pop("latency_estimate_s")
    reports.write_records(folder, "rstitch-tau=0.02", rows)
    page = reports.render_page(folder)
    columns = header(page)
    cells = {line.split("|")[2].strip(): line.split("|")[columns.index(ESTIMATED) + 1].strip()
             for line in page.splitlines() if line.startswith("| rstitch | tau=0.0")}
    assert cells["tau=0.02"] == "-" and cells["tau=0.01"] != "-"
