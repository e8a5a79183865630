"""Reports (rstitch/analysis/record_reports.py): every committed report's page is what its records
generate (no decoding); every figure of a reading is computed from the records; a decode stops at
any problem and resumes from the folder alone, labelling its sittings (rstitch/cli/report_decode.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rstitch.analysis import record_reports as reports
from rstitch.cli import report_decode
from rstitch.errors import ConfigError

REPORTS = Path(__file__).resolve().parents[2] / "docs" / "reports"
COMMITTED = sorted(p.parent for p in REPORTS.glob(f"*/{reports.MANIFEST}"))
MAX_REPORT_BYTES = 1 << 20  # records stay small: compacted, gzipped
ROWS = [("llm_only", {}), ("slm_only", {}), ("rstitch", {"tau": 0.02})]


def tiny_spec(n: int = 3, tokens: int = 12) -> report_decode.ReportSpec:
    return report_decode.ReportSpec(
        title="tiny", description="Three testbed problems.", command="pytest", rows=ROWS,
        overrides=[f"dataset.limit={n}", f"max_new_tokens={tokens}", "engine.num_threads=1"],
        tables=[("token", ROWS)], columns=["n", "accuracy", "speedup", "tokens", "switches", "sittings"])


def stale_page(folder: Path) -> bool:
    """The report's README.md is not what its records generate."""
    return (folder / reports.PAGE).read_text() != reports.render_page(folder)


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_a_committed_report_regenerates_from_its_records(folder):
    assert (folder / reports.PAGE).read_text() == reports.render_page(folder), (
        f"{folder.name}/README.md is not what its records generate: python scripts/... --render-only")


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_a_committed_report_is_small_and_its_readings_compute_every_figure(folder):
    assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) < MAX_REPORT_BYTES
    readings = folder / reports.READINGS
    assert not readings.is_file() or reports.unchecked_figures(readings.read_text()) == []


def test_there_is_a_committed_report():
    assert any(f.name == "testbed" for f in COMMITTED)


@pytest.fixture(scope="module")
def decoded(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("report") / "tiny"
    assert report_decode.decode_report(folder, tiny_spec(), minutes=30) == 3
    return folder


def test_a_page_with_a_changed_figure_or_a_hand_figure_in_a_reading_fails(decoded, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(decoded, folder)
    (folder / reports.READINGS).write_text("LLM-only: {{ llm_only.accuracy :.3f }} over {{ problems }} problems.\n")
    page = reports.render_page(folder)
    assert "over 3 problems" in page
    (folder / reports.PAGE).write_text(page)
    assert not stale_page(folder)
    (folder / reports.PAGE).write_text(page.replace("over 3 problems", "over 4 problems"))
    assert stale_page(folder)
    for hand in ("LLM-only solves 0.610 of them.\n", "Δ -0.100 on GSM8K.\n", "It runs 1.42x faster.\n"):
        (folder / reports.READINGS).write_text(hand)
        with pytest.raises(ConfigError, match="not computed from the records"):
            reports.render_page(folder)
    assert reports.unchecked_figures("On GSM8K and MATH500 with the 0.5B: {{ problems }}.") == []
    (folder / reports.READINGS).write_text("{{ rstitch[tau=0.9].speedup :.2f }}\n")
    with pytest.raises(ConfigError, match="no run rstitch"):
        reports.render_page(folder)


def test_readings_compute_intervals_and_arithmetic_from_the_summaries(decoded):
    manifest = reports.load_manifest(decoded)
    summaries = reports.report_summaries(manifest, decoded)
    stitch = summaries["rstitch-tau=0.02"]
    text = reports.expand_readings(
        "{{ rstitch[tau=0.02].speedup :.2f }} [{{ rstitch[tau=0.02].speedup_ci[0] :.2f }}, "
        "{{ rstitch[tau=0.02].speedup_ci[1] :.2f }}], {{ 1 - rstitch[tau=0.02].llm_token_share :.0% }}",
        summaries, manifest, {})
    ci = stitch["speedup_ci"]
    assert text == f"{stitch['speedup']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}], {1 - stitch['llm_token_share']:.0%}"
    assert stitch["speedup"] == pytest.approx(summaries["llm_only"]["latency_s"] / stitch["latency_s"])


def test_a_decode_stops_between_problems_and_resumes_in_a_fresh_copy(decoded, tmp_path, monkeypatch):
    """Minutes run out after the first problem (a fake clock: each problem takes two minutes of a
    three-minute budget); a copy of the folder alone, elsewhere, finishes the decode as a second
    sitting, and its rows end as one sitting's."""
    clock = {"now": 0.0}
    real_decode = report_decode.decode_problem

    def two_minute_problem(*args, **kwargs):
        real_decode(*args, **kwargs)
        clock["now"] += 120.0

    monkeypatch.setattr(report_decode, "clock", lambda: clock["now"])
    monkeypatch.setattr(report_decode, "decode_problem", two_minute_problem)
    first = tmp_path / "machine-a" / "tiny"
    assert report_decode.decode_report(first, tiny_spec(), minutes=3) == 1
    assert len(reports.finished_problems(reports.load_manifest(first), first)) == 1
    clone = tmp_path / "machine-b" / "tiny"
    shutil.copytree(first, clone)
    shutil.rmtree(first)
    assert report_decode.decode_report(clone, tiny_spec(), minutes=30) == 2
    manifest = reports.load_manifest(clone)
    assert len(manifest["sittings"]) == 2
    for run in manifest["runs"]:
        resumed, whole = reports.read_records(clone, run), reports.read_records(decoded, run)
        assert [r["sitting"] for r in resumed] == [1, 2, 2]
        assert [(r["id"], r["response"], r["tokens"], r["correct"]) for r in resumed] == \
            [(r["id"], r["response"], r["tokens"], r["correct"]) for r in whole]
        assert "output_token_ids" not in resumed[0] and resumed[0]["response"]
    page = (clone / reports.PAGE).read_text()
    assert "2 sittings decoded these rows (they share machine, build and threads" in page


def test_a_killed_problem_keeps_the_rows_it_finished(decoded, tmp_path, monkeypatch):
    calls = []
    real_run = report_decode.decode_first

    def killed_on_the_second_row(cfg, problems):
        calls.append(cfg["method"]["name"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_run(cfg, problems)

    monkeypatch.setattr(report_decode, "decode_first", killed_on_the_second_row)
    folder = tmp_path / "tiny"
    with pytest.raises(KeyboardInterrupt):
        report_decode.decode_report(folder, tiny_spec(), minutes=30)
    assert len(reports.read_records(folder, "llm_only")) == 1 and reports.read_records(folder, "slm_only") == []
    monkeypatch.setattr(report_decode, "decode_first", real_run)
    assert report_decode.decode_report(folder, tiny_spec(), minutes=30) == 3
    assert [r["tokens"] for r in reports.read_records(folder, "llm_only")] == \
        [r["tokens"] for r in reports.read_records(decoded, "llm_only")]


def test_a_resume_with_other_settings_or_no_minutes_is_one_error_line(decoded, tmp_path):
    folder = tmp_path / "tiny"
    shutil.copytree(decoded, folder)
    with pytest.raises(ConfigError, match="was decoded with other overrides"):
        report_decode.decode_report(folder, tiny_spec(tokens=16), minutes=30)
    with pytest.raises(ConfigError, match="--minutes must be > 0"):
        report_decode.decode_report(folder, tiny_spec(), minutes=0)


def test_sittings_that_differ_are_named():
    manifest = {"sittings": [{"machine": "a", "commit": "x", "threads": 1}, {"machine": "b", "commit": "x", "threads": 2}]}
    assert "they differ in machine, threads" in reports.sittings_note(manifest)


def test_render_only_rewrites_the_words_and_the_page_and_refuses_other_settings(decoded, tmp_path):
    folder = tmp_path / "tiny"
    shutil.copytree(decoded, folder)
    spec = tiny_spec()
    spec.description = "Three testbed problems, described anew."
    report_decode.refresh_page(folder, spec)
    assert "described anew" in (folder / reports.PAGE).read_text()
    assert not stale_page(folder)
    with pytest.raises(ConfigError, match="other overrides"):
        report_decode.refresh_page(folder, tiny_spec(n=2))
    with pytest.raises(ConfigError, match="not a report yet"):
        report_decode.refresh_page(tmp_path / "none", spec)


def test_the_console_table_shows_the_token_reduction_beside_the_token_ratio():
    from rstitch.results.summary import format_table

    row = {"method": "rstitch", "run_tag": "t", "n_samples": 20, "token_ratio": 0.53, "token_reduction": 0.47}
    header, line = (x.split() for x in format_table(row).splitlines())
    assert header[header.index("tok_ratio") + 1] == "reduction_%"
    assert "47.0" in line and line.index("47.0") == line.index("0.53") + 1
