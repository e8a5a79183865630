"""Accuracy-latency points of the methods on the real pair (docs/results-real.md).

    python scripts/results_real.py                      # decode what is missing, then print the tables
    python scripts/results_real.py --write-doc          # ...and replace the generated section of the doc
    python scripts/results_real.py --engine llamacpp --gsm8k 100 --math500 50 --write-doc

Every point is a resumable run directory under --results-root (greedy, budget 512, batch 1), so
the hours this takes on a CPU can be spread over several sittings: a rerun decodes only what is
missing, and `--render-only` prints what is there without decoding (an unfinished run as the
first n problems it has saved, "n/N", without a speedup). Rows run in the order of ROWS
(cheapest first), one dataset after the other; `--block 1` decodes problem by problem instead
(every row's first problem, then every row's second, ...), so that a decode spread over sittings,
perhaps on machines of different speeds, times each problem's rows together
(rstitch.runner.run_in_blocks). Beside the table: the measured per-token latency of each model
(engine forward time per decode step), the SLM's mean normalized entropy on tokens of its wrong
answers against its right ones, and the LLM token share of R-Stitch per tau.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rstitch.analysis.tables import replace_marked_section
from rstitch.config_groups import compose_config
from rstitch.data import load_dataset_records
from rstitch.data.prompts import PromptFormat
from rstitch.engines import load_model
from rstitch.results.lookup import config_run_dir as run_dir
from rstitch.results.lookup import saved_summary, with_speedup
from rstitch.results.summary import plus_minus, with_interval
from rstitch.runner import run_in_blocks

DOC = Path(__file__).resolve().parents[1] / "docs" / "results-real.md"
BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
PAIR = "qwen2.5_coder_0.5b_1.5b"
TAUS = (0.02, 0.05)
# (method, {param: value}); baselines first, then the hybrids from cheapest to dearest.
ROWS: list[tuple[str, dict]] = [
    ("slm_only", {}), ("llm_only", {}),
    *[("rstitch", {"tau": t}) for t in TAUS],
    ("specdec", {}), ("easd", {"tau_h": 2.0}), ("specreason", {}), ("rsd", {}),
]


def common_overrides(args: argparse.Namespace, dataset: str, limit: int) -> list[str]:
    return [f"pair={PAIR}", f"engine={args.engine}", f"engine.num_threads={args.threads}", f"dataset={dataset}",
            f"dataset.path={BENCHMARKS / f'{dataset}.jsonl'}", f"dataset.limit={limit}", "max_new_tokens=512",
            f"results_root={args.results_root}", "logger=none"]


def row_config(common: list[str], method: str, params: dict) -> dict:
    return compose_config([*common, f"method={method}", *(f"method.{k}={v}" for k, v in params.items())])


def summaries(cfgs: list[dict], decode: bool, block: int | None) -> list[dict | None]:
    """Each run's summary with its speedup (None when it has not been run and `decode` is off),
    after decoding what is missing, `block` problems of every row at a time."""
    found = run_in_blocks(cfgs, block or cfgs[0]["dataset"]["limit"]) if decode else [saved_summary(c) for c in cfgs]
    return [with_speedup(cfg, summary) for cfg, summary in zip(cfgs, found)]


def slm_entropy_by_correctness(cfg: dict) -> dict[str, float]:
    """The SLM's mean normalized entropy over the tokens it wrote, on wrong and on right answers
    (teacher-forced over each slm_only output: one prefill per sample). Cached beside the run."""
    cache = run_dir(cfg) / "slm_entropy.json"
    samples = [json.loads(line) for line in (run_dir(cfg) / "samples.jsonl").read_text().splitlines() if line.strip()]
    if cache.is_file() and json.loads(cache.read_text()).get("n") == len(samples):
        return json.loads(cache.read_text())["by_correct"]
    slm = load_model(cfg["engine"]["name"], cfg["pair"]["slm"]["path"], name=cfg["pair"]["slm"]["name"],
                     **{k: v for k, v in cfg["engine"].items() if k not in ("name", "per_model")})
    problems = {r.id: r.problem for r in load_dataset_records(**cfg["dataset"])}
    prompt = PromptFormat(**cfg["prompt"])
    means: dict[str, list[float]] = {"wrong": [], "right": []}
    for sample in samples:
        output = sample["output_token_ids"]
        if not output:
            continue
        dists = slm.new_sequence(prompt.encode(slm.tokenizer, problems[sample["id"]])).score(output[:-1])
        means["right" if sample["correct"] else "wrong"].append(statistics.fmean(d.normalized_entropy for d in dists))
    by_correct = {k: statistics.fmean(v) for k, v in means.items() if v}
    by_correct.update({f"n_{k}": len(v) for k, v in means.items()})
    cache.write_text(json.dumps({"n": len(samples), "by_correct": by_correct}) + "\n")
    return by_correct


def per_token_ms(summary: dict, model: str) -> float | None:
    """Engine forward time per forward of one model over the run (decode-dominated at batch 1)."""
    seconds, calls = summary.get(f"forward_time_s_{model}"), summary.get(f"forward_calls_{model}")
    return None if not calls else 1000.0 * seconds / calls


def table(points: list[tuple[str, dict, dict | None]], n: int) -> list[str]:
    lines = ["| method | setting | n | accuracy ± se | Δ accuracy vs llm_only | latency (s) | speedup [95% CI] | token ratio | "
             "per-token ratio | tokens | SLM tokens | LLM tokens | LLM token share |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for method, params, s in points:
        setting = " ".join(f"{k}={v}" for k, v in params.items())
        if s is None:
            lines.append(f"| {method} | {setting} | 0/{n} | not run yet | | | | | | | | | |")
            continue
        accuracy, diff = plus_minus("accuracy", "{:.3f}", " ± ")(s), plus_minus("accuracy_diff", "{:+.3f}", " ± ")(s) or "-"
        speed, ratio = with_interval("speedup", "{:.2f}")(s) or "-", with_interval("token_ratio", "{:.2f}")(s) or "-"
        per_token = with_interval("per_token_latency_ratio", "{:.2f}")(s) or "-"
        lines.append(
            f"| {method} | {setting} | {s['n_samples']}/{n} | {accuracy} | {diff} | {s['latency_s']:.1f} | {speed} | {ratio} | "
            f"{per_token} | {s['tokens']:.1f} | {s['tokens_slm']:.1f} | {s['tokens_llm']:.1f} | "
            f"{s.get('llm_token_share', float('nan')):.3f} |"
        )
    return lines


def entropy_line(cfg: dict | None, summary: dict | None) -> str:
    if cfg is None or summary is None:
        return "not measured (the slm_only run is missing)"
    by = slm_entropy_by_correctness(cfg)
    return (f"wrong answers {by.get('wrong', float('nan')):.4f} ({by['n_wrong']} samples), "
            f"right answers {by.get('right', float('nan')):.4f} ({by['n_right']} samples)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="hf", help="hf | llamacpp | vllm")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gsm8k", type=int, default=20, help="first n GSM8K problems")
    parser.add_argument("--math500", type=int, default=10, help="first n MATH500 problems")
    parser.add_argument("--methods", default=None, help="comma list: only these rows")
    parser.add_argument("--block", type=int, default=None,
                        help="decode this many problems of every row at a time (1: problem by problem; default: a row at a time)")
    parser.add_argument("--results-root", default="runs/real-results")
    parser.add_argument("--render-only", action="store_true", help="decode nothing; tabulate the finished runs")
    parser.add_argument("--write-doc", action="store_true", help=f"replace the engine's generated section of {DOC}")
    args = parser.parse_args()
    rows = [r for r in ROWS if args.methods is None or r[0] in args.methods.split(",")]
    command = "python scripts/results_real.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k in ("engine", "threads", "gsm8k", "math500") and v is not None)
    lines = [f"Generated by `{command} --write-doc` (engine `{args.engine}`, {args.threads} threads): greedy, "
             "budget 512, batch 1, the pair's default prompt (chat template + Qwen math system prompt); latency is "
             "the mean wall clock per problem after warm-up, speedup is against `llm_only` on the same problems. "
             "± one standard error (Δ accuracy: paired with `llm_only` on the same problems); [ ] 95% paired bootstrap "
             "intervals over problems; speedup = per-token ratio / token ratio (docs/analysis.md)."]
    for dataset, n in (("gsm8k", args.gsm8k), ("math500", args.math500)):
        if n <= 0:
            continue
        common = common_overrides(args, dataset, n)
        cfgs = [row_config(common, method, params) for method, params in rows]
        configs = {method: cfg for (method, _), cfg in zip(rows, cfgs)}
        points = [(m, p, s) for (m, p), s in zip(rows, summaries(cfgs, not args.render_only, args.block))]
        lines += ["", f"**{dataset}** (first {n})", "", *table(points, n), ""]
        found = {m: s for m, p, s in points if s is not None and not p}
        llm, slm = found.get("llm_only"), found.get("slm_only")
        if llm and slm:
            ratio = per_token_ms(llm, "llm") / per_token_ms(slm, "slm")
            lines.append(f"- per-forward latency: LLM {per_token_ms(llm, 'llm'):.0f} ms, SLM {per_token_ms(slm, 'slm'):.0f} ms "
                         f"(ratio {ratio:.2f})")
        lines.append(f"- SLM mean normalized entropy per token: {entropy_line(configs.get('slm_only'), slm)}")
        shares = [f"tau={p['tau']}: {s['llm_token_share']:.3f}" for m, p, s in points if m == "rstitch" and s]
        if shares:
            lines.append(f"- R-Stitch LLM token share: {', '.join(shares)}")
    report = "\n".join(lines)
    print(report)
    if args.write_doc:
        replace_marked_section(DOC, f"results-{args.engine}", report)


if __name__ == "__main__":
    main()
