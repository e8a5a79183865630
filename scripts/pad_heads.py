"""Widen the attention heads of a Llama checkpoint without changing what it computes.

vLLM's CPU attention kernels take head sizes of 32, 64, 80, 96, 112, 128, ... only; the first
testbed models were trained with 16- and 28-dim heads. This pads every head to --head-dim:

* q and k: the rotary pairs (i, i + d/2) of the old head become pairs (i, i + D/2) of the new one,
  and rope_theta becomes theta ** (D / d), so that pair i keeps its frequency theta^(-2i/d);
  the extra pairs are zero. q is scaled by sqrt(D / d) to undo the 1/sqrt(head_dim) change.
* v and o: the old head's dims first, zeros after.

Logits agree with the original to float rounding (printed as a check).

    python scripts/pad_heads.py SRC_DIR DST_DIR --head-dim 32
"""
from __future__ import annotations

import argparse
import math
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification


def pad_qk(weight: torch.Tensor, heads: int, old: int, new: int) -> torch.Tensor:
    w = weight.view(heads, old, -1)
    out = w.new_zeros(heads, new, w.shape[-1])
    out[:, : old // 2] = w[:, : old // 2]
    out[:, new // 2 : new // 2 + old // 2] = w[:, old // 2 :]
    return out.reshape(heads * new, -1)


def pad_v(weight: torch.Tensor, heads: int, old: int, new: int) -> torch.Tensor:
    w = weight.view(heads, old, -1)
    out = w.new_zeros(heads, new, w.shape[-1])
    out[:, :old] = w
    return out.reshape(heads * new, -1)


def pad_o(weight: torch.Tensor, heads: int, old: int, new: int) -> torch.Tensor:
    w = weight.view(weight.shape[0], heads, old)
    out = w.new_zeros(weight.shape[0], heads, new)
    out[:, :, :old] = w
    return out.reshape(weight.shape[0], heads * new)


def auto_class(config):
    return AutoModelForTokenClassification if config.architectures[0].endswith("TokenClassification") else AutoModelForCausalLM


def pad_heads(src: Path, dst: Path, head_dim: int) -> None:
    config = AutoConfig.from_pretrained(src)
    old, heads, kv_heads = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    if head_dim < old:
        raise SystemExit(f"pad_heads: --head-dim {head_dim} is below the current {old}")
    model = auto_class(config).from_pretrained(src).eval()
    state = model.state_dict()
    for name, w in list(state.items()):
        if name.endswith("q_proj.weight"):
            state[name] = pad_qk(w, heads, old, head_dim) * math.sqrt(head_dim / old)
        elif name.endswith("k_proj.weight"):
            state[name] = pad_qk(w, kv_heads, old, head_dim)
        elif name.endswith("v_proj.weight"):
            state[name] = pad_v(w, kv_heads, old, head_dim)
        elif name.endswith("o_proj.weight"):
            state[name] = pad_o(w, heads, old, head_dim)
    rope = dict(config.rope_parameters)
    rope["rope_theta"] = rope["rope_theta"] ** (head_dim / old)
    config.head_dim, config.rope_parameters = head_dim, rope
    wide = auto_class(config).from_config(config).eval()
    wide.load_state_dict(state)
    ids = torch.randint(2, config.vocab_size, (1, 200))
    with torch.no_grad():
        diff = (model(ids).logits - wide(ids).logits).abs().max().item()
    print(f"{src} -> {dst}: head_dim {old} -> {head_dim}, rope_theta {rope['rope_theta']:.6g}, max |logit diff| {diff:.2e}")
    if dst.exists():
        shutil.rmtree(dst)
    wide.save_pretrained(dst, safe_serialization=True)
    for extra in src.iterdir():  # tokenizer files
        if extra.name not in ("config.json", "model.safetensors", "generation_config.json") and extra.is_file():
            shutil.copy(extra, dst / extra.name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--head-dim", type=int, default=32)
    args = parser.parse_args()
    pad_heads(args.src, args.dst, args.head_dim)
