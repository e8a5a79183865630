"""scripts/bench_judge.py times every judgement of a SpecReason decode, and only those: one timing
per drafted step of each problem (the warm-up decode's left out), CPU time within wall time."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rstitch.methods.steps import CostMeter

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_judge.py"


def bench_judge():
    spec = importlib.util.spec_from_file_location("bench_judge", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("context", ["chat", "reasoning"])
def test_each_judgement_is_timed_on_both_clocks(context, monkeypatch, tmp_path):
    for name in ("__init__", "judging"):  # restored after the test: instrument() replaces them
        monkeypatch.setattr(CostMeter, name, getattr(CostMeter, name))
    module = bench_judge()
    module.instrument()
    samples, times, _ = module.decode(context, 2, 7.0, tmp_path)
    assert [len(t) for t in times] == [s["stats"]["drafted_steps"] for s in samples] and sum(map(len, times)) > 0
    for sample, judged in zip(samples, times):
        wall = sum(w for w, _ in judged)
        assert all(0 < cpu <= w * 1.05 + 1e-3 for w, cpu in judged)  # one thread: its CPU time within the wall time
        assert sample["stats"]["judge_time_s"] <= wall + 1e-6  # the judge's forwards, inside the timed spans
    line = module.row(context, samples, times)
    assert line.startswith(f"| {context} | 2 | {sum(map(len, times))} | ") and line.count("|") == 12
