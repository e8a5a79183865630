"""Scoring models (PRMs, the judge, the Arbitrage router) under `engine.compile`: the static decoder
(engines/hf_static.py) is built for causal LMs that keep a KV cache; a bare backbone with a value
head, a token or sequence classifier, and remote code without cache objects take the eager path.
On CUDA `auto` resolves to graphs, the default of every GPU run; here `auto` is made to resolve to
the same static path without capture, the part of it a CPU runs."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import rstitch.engines.hf as hf_engine
from rstitch.engines import load_scoring_model
from rstitch.scorers.arbitrage_router import ArbitrageRouter
from rstitch.scorers.hf_prm import QwenMathPRM, SkyworkPRM
from rstitch.scorers.judge_prm import LLMJudgePRM
from rstitch.scorers.likelihood_prm import LikelihoodHead, TestbedPRM, save_prm

PROBLEM = "What is 3 + 4 * 2?"
STEPS = ["4 * 2 = 8", "3 + 8 = 11", "so the answer is 11"]
HISTORY = [(0, "4 * 2 = 8"), (1, "3 + 8 = 11")]


def tiny(cls_name: str, tok: Any, **extra: Any) -> Any:
    import transformers

    torch.manual_seed(3)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=None, **extra,
    )
    return getattr(transformers, cls_name)(config).eval()


def saved(path: Path, model: Any, tok: Any) -> str:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def scorer_dirs(tiny_pair, tmp_path_factory) -> dict[str, str]:
    """One tiny checkpoint per kind of scoring model, in the layout its loader reads."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("scorers")
    tok = AutoTokenizer.from_pretrained(tiny_pair["tokenizer"])
    dirs = {}
    save_prm(root / "testbed", tiny("LlamaForCausalLM", tok), tok, LikelihoodHead(weight=[0.5, 0.25], bias=2.0))
    dirs["testbed"] = str(root / "testbed")
    # Skywork: a causal LM checkpoint plus the value head its own code attaches.
    dirs["skywork"] = saved(root / "skywork", tiny("LlamaForCausalLM", tok), tok)
    weights = load_file(root / "skywork" / "model.safetensors")
    save_file({**weights, "v_head.summary.weight": torch.randn(1, 32), "v_head.summary.bias": torch.randn(1)},
              root / "skywork" / "model.safetensors", metadata={"format": "pt"})
    marked = AutoTokenizer.from_pretrained(tiny_pair["tokenizer"])
    marked.add_tokens(["<extra_0>"], special_tokens=True)
    dirs["qwen_math_prm"] = saved(root / "qwen", tiny("LlamaForTokenClassification", marked, num_labels=2), marked)
    judged = AutoTokenizer.from_pretrained(tiny_pair["tokenizer"])
    judged.add_tokens(["Yes", "No"])
    judge = tiny("LlamaForCausalLM", judged)
    with torch.no_grad():
        judge.lm_head.weight.mul_(30.0)  # answers far from 1/2
    dirs["llm_judge"] = saved(root / "judge", judge, judged)
    dirs["router"] = saved(root / "router", tiny("LlamaForSequenceClassification", tok, num_labels=2), tok)
    return dirs


# name -> (build the scorer from the checkpoint directories, read its outputs, whether it is a
# causal LM keeping a cache)
SCORERS: dict[str, tuple[Callable[[dict[str, str]], Any], Callable[[Any], list[float]], bool]] = {
    "testbed": (lambda d: TestbedPRM(d["testbed"]), lambda s: s.score(PROBLEM, STEPS), True),
    "skywork": (lambda d: SkyworkPRM(d["skywork"], dtype="float32"), lambda s: s.score(PROBLEM, STEPS), False),
    "qwen_math_prm": (lambda d: QwenMathPRM(d["qwen_math_prm"], dtype="float32",
                                            auto_class="AutoModelForTokenClassification"),
                      lambda s: s.score(PROBLEM, STEPS), False),
    "qwen_math_prm_cached": (lambda d: QwenMathPRM(d["qwen_math_prm"], dtype="float32", use_cache=True,
                                                   auto_class="AutoModelForTokenClassification"),
                             lambda s: s.score(PROBLEM, STEPS), False),
    "llm_judge": (lambda d: LLMJudgePRM(d["llm_judge"]), lambda s: s.score(PROBLEM, STEPS), True),
    "router": (lambda d: ArbitrageRouter(d["router"]),
               lambda s: [s.predict(PROBLEM, HISTORY, "so 11"), s.predict(PROBLEM, [*HISTORY, (0, "so 11")], "done")],
               False),
}


def auto_resolves_to_static(monkeypatch) -> None:
    """`engine.compile=auto` as on CUDA (graphs there): the static decoder, without capture."""
    resolve = hf_engine.resolve_mode
    monkeypatch.setattr(hf_engine, "resolve_mode", lambda value, device: resolve("static" if value == "auto" else value, device))


def scorer_runner(scorer: Any) -> Any:
    return scorer.scorer.runner


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_every_scorer_loads_and_scores_where_auto_builds_the_static_decoder(name, scorer_dirs, monkeypatch):
    build, read, causal_with_cache = SCORERS[name]
    eager = build(scorer_dirs)
    assert scorer_runner(eager).static is None  # CPU: auto is the eager path
    expected = read(eager)
    auto_resolves_to_static(monkeypatch)
    scorer = build(scorer_dirs)
    # Causal LMs with a cache (the judge, the testbed PRM) run the run's decode path; the rest eagerly.
    assert (scorer_runner(scorer).static is not None) == causal_with_cache
    assert read(scorer) == pytest.approx(expected, abs=1e-4)
    assert read(scorer) == pytest.approx(expected, abs=1e-4)  # again: the shared prefix reused


@pytest.mark.parametrize("kind,options,static", [
    ("testbed", {}, True),
    ("skywork", {"auto_class": "AutoModel", "needs": ("hidden_states",)}, False),
    ("qwen_math_prm", {"auto_class": "AutoModelForTokenClassification", "use_cache": False}, False),
    ("qwen_math_prm", {"auto_class": "AutoModelForTokenClassification"}, False),
    ("router", {"auto_class": "AutoModelForSequenceClassification"}, False),
    ("llm_judge", {"use_cache": False}, False),
])
def test_an_explicit_static_setting_reaches_only_causal_lms_that_keep_a_cache(kind, options, static, scorer_dirs):
    options = dict(options)
    needs = options.pop("needs", ())
    runner = load_scoring_model("hf", scorer_dirs[kind], "a scorer", needs, compile="static", **options)
    assert (runner.static is not None) == static
    seq = runner.new_sequence([5, 6, 7], want_hidden=True)
    rows = seq.score([8, 9])
    assert len(rows) == 3 and all(torch.isfinite(d.logits).all() for d in rows)
