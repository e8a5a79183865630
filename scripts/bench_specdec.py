"""Wall time of our SpecDec against transformers' assisted generation, batch 1, greedy.

Both decode the same prompts with the same draft length k (transformers with a constant number
of assistant tokens and no confidence-based early stop, so both run the same algorithm), after a
warm-up, repeated with the two interleaved; the best time per prompt counts. Outputs must be
token-identical. Also times target-only greedy decoding (ours and transformers') for the speedup.

    python scripts/bench_specdec.py                       # the testbed pair (rstitch.testbed.ASSETS_DIR)
    python scripts/bench_specdec.py --slm PATH --llm PATH
    python scripts/bench_specdec.py --random              # tiny random models built on the spot
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rstitch.data.prompts import PromptFormat
from rstitch.engines import ModelPair, Sampler, load_pair
from rstitch.engines.hf_generate import hf_assisted_generate, hf_greedy_generate
from rstitch.errors import exit_on_config_error
from rstitch.methods import DecodeContext, build_method
from rstitch.testbed import ASSETS_DIR, generate_problems


def ours(pair: ModelPair, method: str, prompt_ids: list[int], max_new_tokens: int, **params) -> list[int]:
    ctx = DecodeContext(pair, Sampler(), max_new_tokens)
    return build_method(method, **params).decode(list(prompt_ids), ctx).token_ids


def random_pair(out_dir: Path) -> ModelPair:
    """A random 6-layer target and a draft made of its embeddings, first layer and head, sharing
    a character tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = sorted(set("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-*/=.,:?()\\{}\n"))
    specials = ["<|endoftext|>", "<|user|>", "<|assistant|>"]
    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(specials + chars)}, unk_token=specials[0]))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=specials[0], pad_token=specials[0],
                                        additional_special_tokens=specials[1:])
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    target = LlamaForCausalLM(config)
    with torch.no_grad():
        target.lm_head.weight.mul_(20.0)  # peaked distributions, like a trained model's
        # Damp what the deeper layers add to the residual stream: the one-layer draft then
        # agrees with the target on most tokens (acceptance ~0.7-0.9 at k=5), as a trained draft would.
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(0.05)
            layer.mlp.down_proj.weight.mul_(0.05)
    draft = LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 1}))
    draft.load_state_dict(target.state_dict(), strict=False)
    for name, model in (("slm", draft), ("llm", target)):
        model.save_pretrained(out_dir / name)
        tokenizer.save_pretrained(out_dir / name)
    return load_pair({"path": str(out_dir / "slm"), "name": "random-slm"}, {"path": str(out_dir / "llm"), "name": "random-llm"})


@dataclass
class Contender:
    run: Callable[[list[int]], list[int]]
    seconds: float = 0.0  # summed over prompts, best of the repeats per prompt
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)


def timed(run: Callable[[list[int]], list[int]], prompt: list[int]) -> tuple[float, list[int]]:
    start = time.perf_counter()
    tokens = run(prompt)
    return time.perf_counter() - start, tokens


def bench(pair: ModelPair, prompts: list[list[int]], k: int, max_new_tokens: int, repeats: int) -> dict[str, Contender]:
    contenders = {
        "ours_specdec": Contender(lambda p: ours(pair, "specdec", p, max_new_tokens, k=k)),
        "hf_assisted": Contender(lambda p: hf_assisted_generate(pair, p, k, max_new_tokens)),
        "ours_llm_only": Contender(lambda p: ours(pair, "llm_only", p, max_new_tokens)),
        "hf_greedy": Contender(lambda p: hf_greedy_generate(pair, p, max_new_tokens)),
    }
    for contender in contenders.values():  # warm-up
        contender.run(prompts[0])
    for prompt in prompts:
        best = {name: math.inf for name in contenders}
        last: dict[str, list[int]] = {}
        for _ in range(repeats):  # interleaved, so load changes hit every contender alike
            for name, contender in contenders.items():
                seconds, last[name] = timed(contender.run, prompt)
                best[name] = min(best[name], seconds)
        for name, contender in contenders.items():
            contender.seconds += best[name]
            contender.outputs.append(last[name])
    return contenders


def acceptance(pair: ModelPair, prompts: list[list[int]], k: int, max_new_tokens: int) -> dict:
    """SpecDec's pooled acceptance statistics on the prompts (an untimed extra pass)."""
    method = build_method("specdec", k=k)
    results = [method.decode(list(p), DecodeContext(pair, Sampler(), max_new_tokens)) for p in prompts]
    return method.summarize([{"tokens": len(r.token_ids), "stats": r.stats} for r in results])


def report(contenders: dict[str, Contender], label: str, k: int, spec: dict) -> None:
    reference = contenders["ours_llm_only"].outputs
    print(f"\n{label}: k={k}, {len(reference)} prompts, {contenders['ours_llm_only'].tokens} target tokens")
    for name, c in contenders.items():
        same = sum(a == b for a, b in zip(c.outputs, reference))
        print(f"  {name:14s} {c.seconds:8.3f} s  {c.tokens / c.seconds:8.1f} tok/s  "
              f"identical to ours llm_only: {same}/{len(reference)}")
    ratio = contenders["ours_specdec"].seconds / contenders["hf_assisted"].seconds
    speedup = contenders["ours_llm_only"].seconds / contenders["ours_specdec"].seconds
    print(f"  wall-time ratio ours/transformers (specdec vs assisted): {ratio:.3f}")
    print(f"  ours specdec speedup over ours llm_only: {speedup:.2f}x")
    per_position = ", ".join("-" if r is None else f"{r:.2f}" for r in spec["spec_acceptance_rate_per_position"])
    print(f"  acceptance rate {spec['spec_acceptance_rate']:.3f}, accepted per verification "
          f"{spec['spec_mean_accepted_length']:.2f}, tokens per target forward {spec['spec_tokens_per_target_forward']:.2f}, "
          f"per position [{per_position}]")


@exit_on_config_error()
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slm", default=str(ASSETS_DIR / "slm"))
    parser.add_argument("--llm", default=str(ASSETS_DIR / "llm"))
    parser.add_argument("--random", action="store_true", help="tiny random models built in a temp dir")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.random:
        pair = random_pair(Path(tempfile.mkdtemp(prefix="bench_specdec_")))
    else:
        if not Path(args.slm).is_dir() or not Path(args.llm).is_dir():
            sys.exit(f"model directories not found ({args.slm}, {args.llm}); pass --slm/--llm or --random")
        pair = load_pair({"path": args.slm}, {"path": args.llm})
    prompt_format = PromptFormat()
    prompts = [prompt_format.encode(pair.tokenizer, p.problem) for p in generate_problems("test", args.prompts)]
    contenders = bench(pair, prompts, args.k, args.max_new_tokens, args.repeats)
    spec = acceptance(pair, prompts, args.k, args.max_new_tokens)
    report(contenders, "random pair" if args.random else f"{args.slm} / {args.llm}", args.k, spec)


if __name__ == "__main__":
    main()
