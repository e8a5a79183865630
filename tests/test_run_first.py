"""rstitch.runner.run_config with `first`: decodes only the first problems and writes no summary
(cli/report_decode.py decodes reports a problem at a time this way); a call without it finishes the run."""
from __future__ import annotations

import json

from rstitch import runner
from rstitch.config_groups import compose_config
from rstitch.results.keys import run_dir

COMMON = ["logger=none", "engine.num_threads=1", "dataset.limit=3", "max_new_tokens=12", "method=slm_only"]


def saved_ids(cfg: dict) -> list[str]:
    path = run_dir(cfg["results_root"], cfg) / "samples.jsonl"
    return [json.loads(line)["id"] for line in path.read_text().splitlines()] if path.is_file() else []


def test_first_decodes_only_the_first_problems_and_writes_no_summary(tmp_path):
    cfg = compose_config([f"results_root={tmp_path}", *COMMON])
    assert runner.run_config(cfg, first=2) is None
    assert len(saved_ids(cfg)) == 2
    assert not (run_dir(tmp_path, cfg) / "summary.json").exists()
    summary = runner.run_config(cfg)  # finishes the run: the third problem, then the summary
    assert summary["n_samples"] == 3 and len(saved_ids(cfg)) == 3
    assert (run_dir(tmp_path, cfg) / "summary.json").is_file()
