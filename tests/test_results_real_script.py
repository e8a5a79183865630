"""scripts/results_real.py renders the speedup of a run whose baseline finished after it."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "results_real.py"
COMMON = ["logger=none", "engine.num_threads=1", "dataset.limit=2", "max_new_tokens=16"]


@pytest.fixture(scope="module")
def results_real():
    spec = importlib.util.spec_from_file_location("results_real", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_finished_before_its_baseline_gets_its_speedup_when_rendered(tmp_path, results_real):
    from rstitch.cli.run import compose_config
    from rstitch.runner import run_config

    slm, llm = (compose_config([f"results_root={tmp_path}", *COMMON, f"method={m}"]) for m in ("slm_only", "llm_only"))
    run_config(slm)  # no llm_only yet: the stored summary has no speedup
    assert json.loads((results_real.run_dir(slm) / "summary.json").read_text())["speedup"] is None
    assert results_real.with_speedup(slm, results_real.saved_summary(slm))["speedup"] is None
    llm_summary = run_config(llm)
    rendered = results_real.with_speedup(slm, results_real.saved_summary(slm))
    stored = json.loads((results_real.run_dir(slm) / "summary.json").read_text())
    assert rendered["speedup"] == pytest.approx(llm_summary["latency_s"] / stored["latency_s"])
    assert "partial" not in rendered and rendered["n_samples"] == stored["n_samples"] == 2
