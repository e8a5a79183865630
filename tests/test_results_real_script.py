"""rstitch.results.lookup renders the speedup of a run whose baseline finished after it (a run
directory read without decoding; the results reports compute theirs from their own records)."""
from __future__ import annotations

import json

import pytest

from rstitch.results import lookup

COMMON = ["logger=none", "engine.num_threads=1", "dataset.limit=2", "max_new_tokens=16"]


def test_a_run_finished_before_its_baseline_gets_its_speedup_when_rendered(tmp_path):
    from rstitch.cli.run import compose_config
    from rstitch.runner import run_config

    slm, llm = (compose_config([f"results_root={tmp_path}", *COMMON, f"method={m}"]) for m in ("slm_only", "llm_only"))
    run_config(slm)  # no llm_only yet: the stored summary has no speedup
    assert json.loads((lookup.config_run_dir(slm) / "summary.json").read_text())["speedup"] is None
    assert lookup.with_speedup(slm, lookup.saved_summary(slm))["speedup"] is None
    llm_summary = run_config(llm)
    rendered = lookup.with_speedup(slm, lookup.saved_summary(slm))
    stored = json.loads((lookup.config_run_dir(slm) / "summary.json").read_text())
    assert rendered["speedup"] == pytest.approx(llm_summary["latency_s"] / stored["latency_s"])
    assert "partial" not in rendered and rendered["n_samples"] == stored["n_samples"] == 2
