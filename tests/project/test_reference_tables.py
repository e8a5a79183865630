"""docs/reference.md's tables are the ones scripts/reference_tables.py generates from the code, and
the record fields they list (rstitch/results/schema.py) are every field a run writes."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rstitch.results.schema import RunSummary, SampleRecord

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_tables_are_the_ones_generated_from_the_code():
    script = load_script("reference_tables")
    text = script.DOC.read_text(encoding="utf-8")
    assert script.with_tables(text) == text, "docs/reference.md is stale: run python scripts/reference_tables.py"
    assert {name for _, name, _, _ in script.SECTION.findall(text)} == set(script.GENERATORS)
    assert "| `batched_forward` | false | run several sequences in one forward |" in text
    assert "| `_crop(n_keep)` | Keep only the first `n_keep` cached positions. | implements |" in text
    assert "| `tokens`, `tokens_slm`, `tokens_llm` | output tokens in total and per model |" in text


def test_a_stale_table_is_rewritten_and_the_check_fails(tmp_path, monkeypatch, capsys):
    script = load_script("reference_tables")
    text = script.DOC.read_text(encoding="utf-8")
    stale = text.replace("| `rollback(n)` |", "| `rollback(n, extra)` |")
    assert stale != text and script.with_tables(stale) == text
    doc = tmp_path / "reference.md"
    doc.write_text(stale, encoding="utf-8")
    monkeypatch.setattr(script, "DOC", doc)
    monkeypatch.setattr("sys.argv", ["reference_tables.py", "--check"])
    assert script.main() == 1 and "tables differ" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["reference_tables.py"])
    assert script.main() == 0 and doc.read_text(encoding="utf-8") == text


def test_a_field_without_a_description_joins_the_row_above():
    script = load_script("reference_tables")
    rows = script.sample_fields().splitlines()[2:]
    assert rows[0] == "| `id`, `sample_index`, `method` | the problem, which of its `n_samples`, the method |"
    listed = [name.strip(" `") for row in rows for name in row.split(" | ")[0].lstrip("| ").split(",")]
    assert listed == list(SampleRecord.__annotations__)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The samples and summaries of a batched R-Stitch run of the testbed and its LLM-only baseline."""
    from rstitch.cli.run import compose_config
    from rstitch.methods import build_method
    from rstitch.runner import run_config

    root = tmp_path_factory.mktemp("runs")
    run_config(compose_config(["method=rstitch", "batch_size=2", "baseline=auto", f"results_root={root}", "logger=none",
                               "dataset.limit=2", "max_new_tokens=16"]))
    runs = []
    for path in sorted(root.rglob("summary.json")):
        summary = json.loads(path.read_text())
        samples = [json.loads(line) for line in (path.parent / "samples.jsonl").read_text().splitlines()]
        own = build_method(**summary["config"]["method"]).summarize(samples)
        runs.append((summary, own, samples))
    return runs


def test_every_field_a_run_writes_is_declared(written):
    assert len(written) == 2
    for summary, own, samples in written:
        assert set(summary) - set(own) <= set(RunSummary.__annotations__), summary["method"]
        for sample in samples:
            assert set(sample) <= set(SampleRecord.__annotations__)
    assert all({"latency_estimated", "batch_wall_s", "latency_overhead_s"} <= set(samples[0]) for _, _, samples in written)
    rstitch = next(summary for summary, _, _ in written if summary["method"] == "rstitch")
    assert rstitch["speedup"] is not None and rstitch["token_ratio_ci"] is not None
