"""Direct tests of three rules the rest of the suite reaches only by accident: the top-p filter,
SpecReason's acceptance boundary, and resuming a half-filled run."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from rstitch import runner as runner_module
from rstitch.cli.run import compose_config
from rstitch.engines import Sampler
from rstitch.methods import build_method


def test_top_p_keeps_the_token_that_crosses_p_and_renormalizes_the_rest():
    probs = [0.5, 0.25, 0.125, 0.0625, 0.0625]  # exact in binary: no rounding at the cut
    logits = torch.tensor([math.log(p) for p in probs])
    # 0.5 < 0.6: the second token (0.25) brings the mass past p and is kept; the rest are dropped.
    kept = Sampler(temperature=1.0, top_p=0.6).probs_from_logits(logits)
    torch.testing.assert_close(kept, torch.tensor([2 / 3, 1 / 3, 0.0, 0.0, 0.0]), rtol=0, atol=1e-6)
    # The order is the probabilities', not the vocabulary's.
    shuffled = Sampler(temperature=1.0, top_p=0.8).probs_from_logits(logits[[3, 2, 0, 4, 1]])
    torch.testing.assert_close(shuffled, torch.tensor([0.0, 0.125, 0.5, 0.0, 0.25]) / 0.875, rtol=0, atol=1e-6)
    # top_p = 1 keeps everything; a tiny p keeps the most likely token alone.
    torch.testing.assert_close(Sampler(temperature=1.0, top_p=1.0).probs_from_logits(logits), torch.tensor(probs), rtol=0, atol=1e-6)
    torch.testing.assert_close(Sampler(temperature=1.0, top_p=0.01).probs_from_logits(logits),
                               torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("score,accepted", [(7.0, True), (7.0 - 1e-9, False), (7.5, True)])
def test_specreason_accepts_a_score_equal_to_the_threshold(score, accepted):
    method = build_method("specreason", threshold=7.0)
    method.judge = lambda run, steps: score  # the base model's score of the draft, fixed (judge_context=chat)
    method.judge_in_reasoning = lambda run, path, draft: score  # and on its own sequence (the default)
    verdict = method.verify(SimpleNamespace(), SimpleNamespace(step_texts=["a step"]), SimpleNamespace(text="the draft"))
    assert verdict.accept is accepted and verdict.score == score


def test_a_run_on_a_half_filled_store_decodes_only_the_missing_samples(tmp_path, monkeypatch):
    cfg = compose_config(["logger=none", f"results_root={tmp_path}", "engine.num_threads=1", "dataset.limit=4",
                          "max_new_tokens=12", "method=slm_only"])
    cfg.pop("logger")
    cfg.pop("results_root")
    run_dir = tmp_path / "run"
    runner_module.run(cfg, run_dir)
    samples = run_dir / "samples.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    first = {json.loads(line)["id"]: json.loads(line)["output_token_ids"] for line in lines}
    samples.write_text("".join(lines[:2]))  # interrupted after two samples
    kept = {json.loads(line)["id"] for line in lines[:2]}

    decoded = []
    real_decode = runner_module.timed_decode

    def counting_decode(method, prompt_ids, ctx):
        decoded.append(ctx.problem)
        return real_decode(method, prompt_ids, ctx)

    monkeypatch.setattr(runner_module, "timed_decode", counting_decode)
    summary = runner_module.run(cfg, run_dir)
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(decoded) == 2 and summary["decoded_samples"] == 2 and summary["n_samples"] == 4
    assert len(rows) == 4 and {r["id"] for r in rows[:2]} == kept  # the saved ones untouched, nothing twice
    assert {r["id"]: r["output_token_ids"] for r in rows} == first  # the rest decoded as the first time
