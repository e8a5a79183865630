"""How much llama.cpp's logits for one sequence change when its decode call also carries other
sequences' tokens (docs/batching.md, "Real pair on the llama.cpp engine").

    python scripts/llamacpp_batch_rounding.py --rows 8 --steps 32 --threads 2

For each of --steps greedy steps of the first GSM8K problem, the LLM's next-token logits are
computed with the sequence alone in its decode call and again with --rows - 1 other sequences
(other problems) in the same call; printed: the largest absolute logit difference, how often the
greedy token differs, and the smallest top-2 logit gap seen (a near-tie that rounding can flip).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rstitch.cli.run import compose_config
from rstitch.errors import exit_on_config_error
from rstitch.runner import get_pair

BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"


@exit_on_config_error()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default="llm", choices=["slm", "llm"])
    p.add_argument("--data", type=Path, default=BENCHMARKS / "gsm8k.jsonl")
    args = p.parse_args()
    cfg = compose_config(["pair=qwen2.5_coder_0.5b_1.5b", "engine=llamacpp", f"engine.num_threads={args.threads}",
                          "logger=none"])
    pair = get_pair(cfg["pair"], cfg["engine"])
    runner = getattr(pair, args.model)
    from rstitch.data.prompts import PromptFormat

    prompt = PromptFormat(**cfg["prompt"])
    with open(args.data) as f:
        questions = [json.loads(line)["question"] for _, line in zip(range(args.rows), f)]
    prompts = [prompt.encode(pair.tokenizer, q) for q in questions]
    ids = list(range(args.rows))  # sequence ids of the runner's context
    for seq_id, tokens in zip(ids, prompts):
        runner.decode_requests([(seq_id, 0, tokens[:-1], 1)])  # the prompt but its last token
    heads = [tokens[-1] for tokens in prompts]
    positions = [len(tokens) - 1 for tokens in prompts]
    worst, flips, gap = 0.0, 0, float("inf")
    for _ in range(args.steps):
        alone = runner.decode_requests([(ids[0], positions[0], [heads[0]], 1)])[0][0]
        runner._remove(ids[0], positions[0])
        together = runner.decode_requests([(i, pos, [h], 1) for i, pos, h in zip(ids, positions, heads)])
        worst = max(worst, float((alone - together[0][0]).abs().max()))
        top2 = alone.topk(2).values
        gap = min(gap, float(top2[0] - top2[1]))
        flips += int(alone.argmax() != together[0][0].argmax())
        heads = [int(rows[0].argmax()) for rows in together]
        positions = [pos + 1 for pos in positions]
    print(f"{runner.name} ({runner.identity.precision}), {args.rows} rows, {args.steps} steps: max |logit difference| {worst:.4g}, "
          f"greedy token differs at {flips} of {args.steps} steps, smallest top-2 gap {gap:.4g}")


if __name__ == "__main__":
    main()
