"""What a run promises on bad input: a grading failure stays on its sample, parameters outside
their range and prompts past a model's context are one error line, run identity does not depend
on where the code or the models live (docs/reliability.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstitch.cli.run import compose_config
from rstitch.errors import ConfigError
from rstitch.runner import run_config


def write_problems(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_config(tiny_pair: dict, problems: Path, root: Path, *overrides: str) -> dict:
    return compose_config([f"pair.slm.path={tiny_pair['slm']}", f"pair.llm.path={tiny_pair['llm']}", "pair.name=tiny",
                           "dataset=math500", f"dataset.path={problems}", "max_new_tokens=8", "logger=none",
                           f"results_root={root}", *overrides])


def samples_under(root: Path) -> list[dict]:
    [path] = root.rglob("samples.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------- grading failures


def test_a_grading_exception_is_recorded_on_its_sample_and_the_run_goes_on(tmp_path, tiny_pair, monkeypatch):
    from rstitch.grading import verify

    real_grade = verify.grade

    def grade(response, gold, **kwargs):
        if gold == "boom":
            raise RecursionError("maximum recursion depth exceeded")
        return real_grade(response, gold, **kwargs)

    monkeypatch.setattr(verify, "grade", grade)
    problems = write_problems(tmp_path / "p.jsonl", [{"id": "a", "problem": "1+1?", "answer": "boom"},
                                                     {"id": "b", "problem": "2+2?", "answer": "4"}])
    summary = run_config(tiny_config(tiny_pair, problems, tmp_path / "runs", "method=slm_only"))
    by_id = {s["id"]: s for s in samples_under(tmp_path / "runs")}
    assert set(by_id) == {"a", "b"}
    assert by_id["a"]["correct"] is False and by_id["a"]["grading_error"].startswith("RecursionError")
    assert "grading_error" not in by_id["b"]
    assert summary["grading_errors"] == 1 and summary["n_samples"] == 2
