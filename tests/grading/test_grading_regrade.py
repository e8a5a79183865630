"""`rstitch-regrade`: a finished run's saved samples graded again with the current grader, with no
decoding; samples.jsonl and summary.json replaced whole; the grader version recorded; the report
flags runs of an older grader."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rstitch.cli import regrade as regrade_cli
from rstitch.errors import ConfigError
from rstitch.grading.version import GRADER_VERSION, SUMMARY_KEY
from rstitch.results.keys import run_key, run_tag
from rstitch.results.store import SUMMARY_FILE, SampleStore

REPO = Path(__file__).resolve().parents[2]


def _cost() -> dict:
    return {m: {"forward_time_s": 0.1, "forward_calls": 3, "prefill_tokens": 5, "decode_steps": 10} for m in ("slm", "llm")}


def _sample(record, response: str, correct: bool, latency: float = 1.0) -> dict:
    return {"id": record.id, "sample_index": 0, "method": "llm_only", "response": response, "answer": None,
            "correct": correct, "gold": record.answer, "latency_s": latency, "tokens": 10, "tokens_slm": 0,
            "tokens_llm": 10, "discarded_tokens": 0, "switches": 0, "finished_by_eos": True, "cost": _cost(), "flops": 1.0}


@pytest.fixture(scope="module")
def config():
    from rstitch.cli.run import compose_config

    return compose_config(["method=llm_only", "dataset.limit=4"])


@pytest.fixture(scope="module")
def records(config):
    from rstitch.data import load_dataset_records

    return load_dataset_records(**config["dataset"])


def write_old_run(root: Path, config: dict, records) -> Path:
    """A finished run as an older grader left it: the first two answers are stated in ways the old
    grader misread (a final-answer statement after an intermediate box; a LaTeX span in prose),
    the third is wrong either way, the fourth right either way; the summary records no version."""
    from rstitch.methods import build_method
    from rstitch.results.summary import summarize_run

    run_dir = root / config["pair"]["name"] / config["dataset"]["name"] / "llm_only" / run_tag(config)
    a, b, c, d = records
    samples = [
        _sample(a, f"first \\boxed{{7}} then more. Final Answer: The final answer is ${a.answer}$.", False),
        _sample(b, f"So the total is ${b.answer}$ in the end.", False, latency=3.0),
        _sample(c, "\\boxed{-1}", False),
        _sample(d, f"\\boxed{{{d.answer}}}", True),
    ]
    with SampleStore(run_dir, run_key(config)) as store:
        for sample in samples:
            store.append(sample)
        summary = summarize_run(config, build_method(**config["method"]), samples, run_dir.parent.parent)
        summary.pop(SUMMARY_KEY)
        summary["merged_from"] = ["shard0", "shard1"]  # a key summarize_run does not write: kept
        store.write_summary(summary)
    return run_dir


def read_run(run_dir: Path) -> tuple[list[dict], dict]:
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    return samples, json.loads((run_dir / SUMMARY_FILE).read_text())


def test_regrade_rewrites_verdicts_and_summary_and_records_the_version(tmp_path, config, records, capsys):
    run_dir = write_old_run(tmp_path, config, records)
    before, old_summary = read_run(run_dir)
    assert old_summary["accuracy"] == 0.25

    regrade_cli.main([str(tmp_path)])
    out = capsys.readouterr().out
    samples, summary = read_run(run_dir)
    assert [s["correct"] for s in samples] == [True, True, False, True]
    assert [s["answer"] for s in samples] == [records[0].answer, records[1].answer, "-1", records[3].answer]
    assert summary["accuracy"] == 0.75 and summary[SUMMARY_KEY] == GRADER_VERSION
    assert summary["merged_from"] == ["shard0", "shard1"]
    assert summary["latency_s"] == old_summary["latency_s"] and summary["config"] == old_summary["config"]
    for old, new in zip(before, samples):  # only the grader's keys change
        assert {k: v for k, v in new.items() if k not in ("answer", "correct")} == \
               {k: v for k, v in old.items() if k not in ("answer", "correct")}
    assert "2 of 4 verdicts changed (+2 right, -0)" in out and "accuracy 0.250 -> 0.750" in out
    assert "llm_only" in out.splitlines()[-2]  # the per-method table

    mtime = (run_dir / SUMMARY_FILE).stat().st_mtime_ns
    regrade_cli.main([str(tmp_path)])  # graded by the current grader: left alone
    assert (run_dir / SUMMARY_FILE).stat().st_mtime_ns == mtime
    assert "0 run(s) graded again with grader" in capsys.readouterr().out
    regrade_cli.main([str(tmp_path), "--force"])
    assert read_run(run_dir) == (samples, summary)  # grading again changes nothing


def test_dry_run_counts_and_writes_nothing(tmp_path, config, records, capsys):
    run_dir = write_old_run(tmp_path, config, records)
    files = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    regrade_cli.main([str(tmp_path), "--dry-run"])
    assert "would regrade" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == files


def test_a_crash_leaves_each_file_old_or_new_and_the_next_regrade_finishes(tmp_path, config, records, monkeypatch):
    run_dir = write_old_run(tmp_path, config, records)
    old_samples, old_summary = read_run(run_dir)

    real_replace = os.replace

    def crash_on_samples(src, dst):
        if str(dst).endswith("samples.jsonl"):
            raise KeyboardInterrupt  # killed while replacing the samples
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_samples)
    with pytest.raises(KeyboardInterrupt):
        regrade_cli.main([str(tmp_path)])
    assert read_run(run_dir) == (old_samples, old_summary)  # both old

    monkeypatch.setattr(os, "replace", real_replace)
    monkeypatch.setattr(SampleStore, "write_summary", lambda self, summary: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        regrade_cli.main([str(tmp_path)])
    samples, summary = read_run(run_dir)
    assert [s["correct"] for s in samples] == [True, True, False, True] and summary == old_summary  # new, old
    assert SUMMARY_KEY not in summary  # so the next regrade does this run again

    monkeypatch.undo()
    regrade_cli.main([str(tmp_path)])
    samples, summary = read_run(run_dir)
    assert summary[SUMMARY_KEY] == GRADER_VERSION and summary["accuracy"] == 0.75


def test_bad_input_is_one_error_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    missing = subprocess.run([sys.executable, "-m", "rstitch.cli.regrade", str(tmp_path / "nope")],
                             capture_output=True, text=True, env=env, timeout=120)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [f"rstitch-regrade: error: no such results directory: {tmp_path / 'nope'}"]
    empty = subprocess.run([sys.executable, "-m", "rstitch.cli.regrade", str(tmp_path)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert empty.returncode == 2 and empty.stderr.startswith("rstitch-regrade: error: no runs")


def test_report_flags_runs_of_an_older_grader(tmp_path, config, records):
    from rstitch.analysis.collect import older_grader_run_dirs

    run_dir = write_old_run(tmp_path, config, records)
    assert older_grader_run_dirs(tmp_path) == [run_dir.resolve()]
    regrade_cli.main([str(tmp_path)])
    assert older_grader_run_dirs(tmp_path) == []


def test_regrading_code_samples_checks_the_sandbox_as_a_decode_does(monkeypatch):
    """Regrading a code run runs model-written programs: without the empty root it is refused
    unless the user opts into the weaker sandbox, as `rstitch-run` refuses a code benchmark."""
    from rstitch.grading import sandbox

    monkeypatch.setattr(sandbox, "bubblewrap", lambda: None)
    humaneval = {"name": "humaneval", "path": str(Path(__file__).parents[1] / "fixtures" / "humaneval.jsonl")}
    with pytest.raises(ConfigError, match="weak_code_sandbox=true"):
        regrade_cli.RecordIndex().records(humaneval)
    assert regrade_cli.RecordIndex(allow_weak_sandbox=True).records(humaneval)
