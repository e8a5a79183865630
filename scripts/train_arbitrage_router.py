"""Train Arbitrage's router: a small sequence classifier predicting whether the target model
would write a better step than the draft model (delta = PRM(target step) - PRM(draft step) > 0).

    python scripts/train_arbitrage_router.py                  # testbed assets -> assets/arbitrage_router
    python scripts/train_arbitrage_router.py --smoke          # whole pipeline on tiny random models, < 1 minute
    python scripts/train_arbitrage_router.py --data numina \\
        --slm deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B --llm deepseek-ai/DeepSeek-R1-Distill-Qwen-7B \\
        --prm skywork --prm-path Skywork/Skywork-o1-Open-PRM-Qwen-2.5-1.5B \\
        --init Qwen/Qwen2.5-0.5B --prompt r1 --device cuda --dtype bfloat16 --out runs/router

Pipeline:
  1. problems: the testbed's train split (held out: its validation split), or AI-MO/NuminaMath-CoT
     (train split; held out: its test split) as in the Arbitrage paper.
  2. paired steps: along each problem, draft and target both write the next step from the same
     prefix, cut as the step-level methods cut steps (separator, EOS, per-step cap, budget); the
     PRM scores both; the trajectory follows the oracle's choice at tau = 0 (`--follow`). This is
     `arbitrage_oracle` run on many problems at once (batched generation, one KV cache per batch).
  3. labels y = 1[delta > 0]; class-balanced downsampling of the training steps.
  4. router: `AutoModelForSequenceClassification` (num_labels=2) from `--init` (testbed: the SLM,
     which shares the tokenizer and already reads the task), fine-tuned with cross-entropy, AdamW,
     linear warmup then linear decay.
  5. held-out evaluation: Spearman rho between y_hat and delta on all held-out steps, and per-class
     accuracy at y_hat > 0.5 -> OUT/router_report.json.
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rstitch.config_groups import group_choices
from rstitch.engines import load_pair
from rstitch.errors import ConfigError, exit_on_config_error
from rstitch.scorers import load_prm
from rstitch.scorers.arbitrage_settings import ROUTER_TRAINING_SETTINGS, apply_router_training_settings
from rstitch.testbed import ASSETS_DIR, LLM_DIR, SLM_DIR
from rstitch.training.fit_arbitrage_router import (
    FitSettings,
    LabelSettings,
    balanced,
    encode,
    evaluate,
    load_router,
    paired_steps,
    predict,
    problems,
    train,
)
from rstitch.training.fit_rstitch_router import build_smoke_models
from rstitch.training.testbed_family import T0, log


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny random models and sizes, < 1 minute")
    p.add_argument("--data", choices=("testbed", "numina"), default="testbed")
    p.add_argument("--out", type=Path, default=None, help="router dir (default: assets/arbitrage_router; smoke: a temp dir)")
    p.add_argument("--slm", default=str(SLM_DIR))
    p.add_argument("--llm", default=str(LLM_DIR))
    p.add_argument("--prm", default="testbed", help="PRM name (rstitch.scorers.PRMS)")
    p.add_argument("--prm-path", default=None)
    p.add_argument("--init", default=None, help="router initialization (default: the SLM)")
    p.add_argument("--prompt", default="chat", choices=group_choices("prompt"), help="conf/prompt/<name>.yaml")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    # data
    p.add_argument("--n-train", type=int, default=400, help="training problems")
    p.add_argument("--n-eval", type=int, default=60, help="held-out problems")
    p.add_argument("--minutes-data", type=float, default=9.0, help="cap on the paired-step generation")
    p.add_argument("--max-new-tokens", type=int, default=400)
    p.add_argument("--max-step-tokens", type=int, default=120)
    p.add_argument("--max-steps", type=int, default=24)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--gen-batch-size", type=int, default=64, help="trajectories generated together")
    p.add_argument("--follow", choices=("oracle", "draft", "target"), default="oracle")
    # optimisation
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup-frac", type=float, default=0.1)
    p.add_argument("--max-length", type=int, default=4096, help="router inputs keep their last tokens")
    p.add_argument("--settings", choices=tuple(ROUTER_TRAINING_SETTINGS), default="testbed",
                   help="init, batch size, lr, epochs: paper (from the PRM, 1024, 1e-5, 3) or testbed; flags win")
    args = p.parse_args()
    try:
        apply_router_training_settings(args, {k: p.get_default(k) for k in vars(args)})
    except ConfigError as err:
        p.error(str(err))
    if args.smoke:
        args.n_train, args.n_eval, args.epochs = 5, 2, 2
        args.max_new_tokens, args.max_step_tokens, args.max_steps = 36, 12, 4
    return args


# ----------------------------------------------------------------------------- main


@exit_on_config_error()
def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    if args.smoke:
        paths = build_smoke_models(Path(tempfile.mkdtemp(prefix="router-smoke-models-")))
        args.slm, args.llm, args.prm_path = paths["slm"], paths["llm"], paths["prm"]
    out = args.out or (Path(tempfile.mkdtemp(prefix="router-smoke-")) if args.smoke else ASSETS_DIR / "arbitrage_router")
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    pair = load_pair({"path": args.slm}, {"path": args.llm}, dtype=args.dtype, device=args.device)
    prm_options = {"device": args.device, "dtype": args.dtype} if args.prm != "oracle" else {}
    prm = load_prm(args.prm, **({"path": args.prm_path} if args.prm_path else {}), **prm_options)
    log(f"pair {pair.slm.name} / {pair.llm.name}, PRM {prm.name}")

    labels = LabelSettings(args.prompt, args.max_new_tokens, args.max_step_tokens, args.max_steps, args.temperature,
                           args.gen_batch_size, args.follow, args.seed)
    log("paired steps: train")
    train_examples = paired_steps(labels, problems(args.data, args.n_train, args.seed, held_out=False), pair, prm, args.minutes_data)
    log("paired steps: held out")
    eval_examples = paired_steps(labels, problems(args.data, args.n_eval, args.seed, held_out=True), pair, prm, args.minutes_data / 4)
    chosen = balanced(train_examples, rng)
    log(f"{len(train_examples)} train steps ({np.mean([e.delta > 0 for e in train_examples]):.2f} positive) "
        f"-> {len(chosen)} balanced; {len(eval_examples)} held-out steps")
    if not chosen:
        raise SystemExit("no example of one class: generate more problems (--n-train)")

    model, tokenizer = load_router(args.init or args.slm, args.device)
    report["router_params"] = sum(p.numel() for p in model.parameters())
    log(f"router: {type(model).__name__}, {report['router_params'] / 1e6:.3f}M params")
    train_ids = encode(tokenizer, chosen, args.max_length)
    fit = FitSettings(args.epochs, args.batch_size, args.lr, args.warmup_frac, args.device, args.seed)
    report["train"] = train(model, train_ids, [int(e.delta > 0) for e in chosen], fit)
    report["train"].update(n_steps=len(train_examples), n_balanced=len(chosen))

    report["train_eval"] = evaluate(predict(model, train_ids, args.device), [e.delta for e in chosen])
    eval_ids = encode(tokenizer, eval_examples, args.max_length)
    report["held_out"] = evaluate(predict(model, eval_ids, args.device), [e.delta for e in eval_examples])
    log(f"held out: {report['held_out']}")

    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    report["minutes"] = round((time.time() - T0) / 60, 2)
    (out / "router_report.json").write_text(json.dumps(report, indent=2))
    log(f"saved router to {out}")


if __name__ == "__main__":
    main()
