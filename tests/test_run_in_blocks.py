"""rstitch.runner.run_in_blocks: runs decoded a block of problems at a time (every row's first
problems, then every row's next ones) end as the same runs decoded one after the other, and a
call with `first` decodes only those problems and writes no summary."""
from __future__ import annotations

import json

import pytest

from rstitch import runner
from rstitch.config_groups import compose_config
from rstitch.errors import ConfigError
from rstitch.results.lookup import config_run_dir

COMMON = ["logger=none", "engine.num_threads=1", "dataset.limit=3", "max_new_tokens=12"]
METHODS = ("slm_only", "llm_only", "rstitch")


def configs(root) -> list[dict]:
    return [compose_config([f"results_root={root}", *COMMON, f"method={m}"]) for m in METHODS]


def saved_ids(cfg: dict) -> list[str]:
    path = config_run_dir(cfg) / "samples.jsonl"
    return [json.loads(line)["id"] for line in path.read_text().splitlines()] if path.is_file() else []


def test_first_decodes_only_the_first_problems_and_writes_no_summary(tmp_path):
    cfg = configs(tmp_path)[0]
    assert runner.run_config(cfg, first=2) is None
    assert len(saved_ids(cfg)) == 2
    assert not (config_run_dir(cfg) / "summary.json").exists()
    summary = runner.run_config(cfg)  # finishes the run: the third problem, then the summary
    assert summary["n_samples"] == 3 and len(saved_ids(cfg)) == 3
    assert (config_run_dir(cfg) / "summary.json").is_file()


def test_blocks_interleave_the_rows_and_end_as_runs_decoded_one_after_the_other(tmp_path, monkeypatch):
    calls: list[tuple[str, int | None, int]] = []
    real_run = runner.run

    def spy(cfg, run_dir, logger=None, results_root=None, first=None):
        calls.append((cfg["method"]["name"], first, len(saved_ids({**cfg, "results_root": tmp_path / "blocks"}))))
        return real_run(cfg, run_dir, logger=logger, results_root=results_root, first=first)

    monkeypatch.setattr(runner, "run", spy)
    blocked = runner.run_in_blocks(configs(tmp_path / "blocks"), block=2)
    # every row's first two problems, then every row's third, then a pass that only summarizes,
    # the baseline first (the others' summaries read its summary)
    summarize = ["llm_only", "slm_only", "rstitch"]
    assert calls == [(m, 2, 0) for m in METHODS] + [(m, 4, 2) for m in METHODS] + [(m, None, 3) for m in summarize]
    monkeypatch.setattr(runner, "run", real_run)
    plain = [runner.run_config(cfg) for cfg in configs(tmp_path / "plain")]
    for b, p in zip(blocked, plain):
        for key in ("n_samples", "accuracy", "tokens", "tokens_slm", "tokens_llm", "switches"):
            assert b[key] == p[key], key
    # every summary was written after its baseline had all its problems: the speedup is filled and paired on all 3
    assert all(s["speedup"] is not None and s["speedup_ci"] is not None and s["paired_problems"] == 3 for s in blocked)


@pytest.mark.parametrize("block", [0, -1, 1.5, True])
def test_a_block_that_is_not_a_count_is_one_error_line(tmp_path, block):
    with pytest.raises(ConfigError, match="block must be an integer >= 1"):
        runner.run_in_blocks(configs(tmp_path), block=block)
