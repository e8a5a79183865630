"""The static KV budget checked in the run's plan, before any model loads: a pair, batch size and
longest sample that cannot fit the GPU's free memory are refused in one line naming what fits.
CUDA is faked (availability and free memory); the configs and tokenizer are real files."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from rstitch.cli.run import compose_config
from rstitch.engines import hf, hf_static
from rstitch.errors import ConfigError
from rstitch.runner import run

GIB = 1 << 30
TESTBED = Path(hf_static.__file__).resolve().parents[1] / "testbed" / "assets"
# The R-Stitch pair's shapes (Qwen2.5-Math 1.5B / DeepSeek-R1-Distill-Qwen-7B), 32k context
SHAPES = {
    "slm": {"hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12, "num_key_value_heads": 2,
            "num_hidden_layers": 28, "vocab_size": 151936, "tie_word_embeddings": True},
    "llm": {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
            "num_hidden_layers": 28, "vocab_size": 152064, "tie_word_embeddings": False},
}


class Loaded(Exception):
    """Raised in place of loading weights: the check let the run go on."""


@pytest.fixture
def pair_on_fake_gpu(tmp_path, monkeypatch):
    """Checkpoint directories of the 7B pair's shape (config.json and the testbed tokenizer, no
    weights) on a CUDA device with 80 GiB free; loading weights raises `Loaded`."""
    from transformers import Qwen2Config

    for role, shape in SHAPES.items():
        directory = tmp_path / role
        shutil.copytree(TESTBED / role, directory, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
        Qwen2Config(max_position_embeddings=32768, **shape).save_pretrained(directory)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * GIB, 80 * GIB))

    def no_weights(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr(hf, "load_causal_lm", no_weights)
    return tmp_path


def _config(root: Path, *overrides: str) -> dict:
    cfg = compose_config(["logger=none", f"results_root={root}", f"pair.slm.path={root / 'slm'}",
                          f"pair.llm.path={root / 'llm'}", "pair.device=cuda", "pair.dtype=bfloat16",
                          "dataset.limit=4", *overrides])
    cfg.pop("logger")
    cfg.pop("results_root")
    return cfg


def test_batch_32_at_32k_on_the_7b_pair_is_refused_in_one_line_before_loading(pair_on_fake_gpu):
    cfg = _config(pair_on_fake_gpu, "batch_size=32", "max_new_tokens=32000", "latency_dir=null")
    with pytest.raises(ConfigError) as refused:
        run(cfg, pair_on_fake_gpu / "run")  # `Loaded` instead would mean the check came after loading began
    message = str(refused.value)
    assert "\n" not in message
    # 56 GiB (7B) + 28 GiB (1.5B) of KV at 32 slots x 32768 positions: the issue's ~84 GiB
    assert "84.0 GiB of static KV cache for batch_size=32" in message and "(32 slots x 32768 positions)" in message
    fit_batch = int(re.search(r"batch_size=(\d+) fits at this length", message).group(1))
    fit_positions = int(re.search(r"batch_size=32 fits up to (\d+) positions", message).group(1))
    assert (fit_batch, fit_positions) == (16, 16383)
    # what it names runs on (to the loading of weights); one step more is refused
    for fits in (["batch_size=16", "max_new_tokens=32000"], ["batch_size=32", f"max_new_tokens={fit_positions - 100}"]):
        with pytest.raises(Loaded):
            run(_config(pair_on_fake_gpu, *fits, "latency_dir=null"), pair_on_fake_gpu / "fits")


def test_what_the_refusal_counts_weights_and_the_caches_grown_sizes():
    from transformers import Qwen2Config

    configs = {role: Qwen2Config(**shape) for role, shape in SHAPES.items()}
    models = {role: (config, torch.bfloat16, True) for role, config in configs.items()}
    weights = sum(hf_static.weight_bytes(c, torch.bfloat16) for c in configs.values())
    kv = sum(hf_static.kv_bytes(c, torch.bfloat16, 16, 8192) for c in configs.values())
    # batch 9 grows to 16 slots, 5000 positions (+ scratch) to 8192
    assert (hf_static.grown_slots(9), hf_static.grown_length(5000)) == (16, 8192)
    assert hf_static.grown_length(2047) == 2048 and hf_static.grown_length(2048) == 4096
    hf_static.check_static_memory(models, 9, 5000, weights + kv)
    with pytest.raises(ConfigError, match="batch_size=8 fits at this length, batch_size=9 fits up to 4095 positions"):
        hf_static.check_static_memory(models, 9, 5000, weights + kv - 1)
    with pytest.raises(ConfigError, match="no batch size fits at this length, no length fits at batch_size=1"):
        hf_static.check_static_memory(models, 1, 100, weights)
    # a model on the eager path brings its weights, not static slots
    eager_llm = {**models, "llm": (configs["llm"], torch.bfloat16, False)}
    hf_static.check_static_memory(eager_llm, 9, 5000, weights + hf_static.kv_bytes(configs["slm"], torch.bfloat16, 16, 8192))


def test_the_cpu_and_the_eager_path_are_not_checked(pair_on_fake_gpu):
    for overrides in (["pair.device=cpu", "pair.dtype=float32"], ["engine.compile=off"]):
        with pytest.raises(Loaded):
            run(_config(pair_on_fake_gpu, "batch_size=32", "max_new_tokens=32000", "latency_dir=null", *overrides),
                pair_on_fake_gpu / "run")
