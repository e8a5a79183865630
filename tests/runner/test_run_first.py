"""Block-wise decoding for the results pages (cli/report_decode.decode_first): the runner's plan for
the first problems only, decoded without a summary; `runner.run_config` then finishes the run."""
from __future__ import annotations

import json

import pytest

from rstitch import runner
from rstitch.cli.report_decode import decode_first
from rstitch.config_groups import compose_config
from rstitch.errors import ConfigError
from rstitch.results.keys import (
    comparison_dir,
    comparison_key,
    identify,
    run_dir,
    run_key,
    run_name,
    run_tag,
    settings_tag,
)

COMMON = ["logger=none", "engine.num_threads=1", "dataset.limit=3", "max_new_tokens=12", "method=slm_only"]


def saved_ids(cfg: dict) -> list[str]:
    path = run_dir(cfg["results_root"], cfg) / "samples.jsonl"
    return [json.loads(line)["id"] for line in path.read_text().splitlines()] if path.is_file() else []


def test_first_decodes_only_the_first_problems_and_writes_no_summary(tmp_path):
    cfg = compose_config([f"results_root={tmp_path}", *COMMON])
    decode_first(cfg, 2)
    assert len(saved_ids(cfg)) == 2
    assert not (run_dir(tmp_path, cfg) / "summary.json").exists()
    summary = runner.run_config(cfg)  # finishes the run: the third problem, then the summary
    assert summary["n_samples"] == 3 and len(saved_ids(cfg)) == 3
    assert (run_dir(tmp_path, cfg) / "summary.json").is_file()


def test_a_plan_checks_everything_before_decoding_and_leaves_the_store_free(tmp_path):
    cfg = compose_config([f"results_root={tmp_path}", *COMMON])
    run = identify({k: v for k, v in cfg.items() if k not in ("results_root", "logger")}, tmp_path / "p")
    with pytest.raises(ConfigError, match="problems must be an integer >= 1"):
        runner.plan(run, problems=0)
    with runner.plan(run, problems=1) as planned:
        assert [(r.id, k) for r, k in planned.todo] == [(planned.records[0].id, 0)] and planned.planned == 1
        assert set(planned.fitted) == {planned.records[0].id} and not (run.run_dir / "samples.jsonl").exists()
    with runner.plan(run) as again:  # the first plan's store was closed: this one may open it
        assert len(again.todo) == 3
        runner.decode(again)
        summary = runner.finish(again)
    assert summary["n_samples"] == 3 and summary["run_tag"] == run.run_tag and (run.run_dir / "summary.json").is_file()



def test_an_identity_computed_once_is_the_one_the_key_functions_compute(tmp_path):
    cfg = compose_config([f"results_root={tmp_path}", *COMMON, "method=rstitch", "method.tau=0.5", "batch_size=2"])
    run_cfg = {k: v for k, v in cfg.items() if k not in ("results_root", "logger")}
    run = identify(run_cfg, comparison_dir(tmp_path, run_cfg))
    assert run.run_key == run_key(run_cfg) and run.comparison_key == comparison_key(run_cfg)
    assert (run.run_tag, run.setting_tag) == (run_tag(run_cfg), settings_tag(run_cfg))
    assert run.run_dir == run_dir(tmp_path, run_cfg) and run.name == run_name(run_cfg)
    assert run.run_tag.startswith("tau=0.5_") and "batch=2" in run.run_tag
