"""Measure the testbed's properties through the framework (docs/testbed.md, "Measured properties").

    python scripts/measure_testbed.py --n 300 --write-doc
    python scripts/measure_testbed.py --n 300 --no-sweeps --family DIR   # a family from train_testbed.py --out DIR

Runs llm_only, slm_only, the rstitch tau sweep and the random p sweep on the test split (greedy,
batch 1, this machine; resumable run directories under --results-root), then measures on their
traces: accuracy gap, per-token latency ratio, output length ratio, PRM and judge ROC-AUC on step
correctness (labels from the exact step checker), and SLM token entropies.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rstitch.analysis.step_scores import auc_fields, judge_scores, labeled_steps, prm_scores, slm_entropies
from rstitch.analysis.tables import replace_marked_section
from rstitch.config_groups import compose_config
from rstitch.data import load_dataset_records
from rstitch.engines.cache import get_pair
from rstitch.errors import exit_on_config_error
from rstitch.results.keys import run_dir
from rstitch.runner import run_config
from rstitch.scorers import load_prm

TAUS = (0.001, 0.005, 0.01, 0.02, 0.03, 0.05)
PS = (0.1, 0.3, 0.5, 0.7, 0.9)
DOC = Path(__file__).resolve().parents[1] / "docs" / "testbed.md"


def evaluate(overrides: list[str]) -> tuple[dict, list[dict], dict]:
    cfg = compose_config(overrides)
    summary = run_config(cfg)
    samples = [json.loads(line) for line in (run_dir(cfg["results_root"], cfg) / "samples.jsonl").read_text().splitlines()]
    return summary, samples, cfg


def family_overrides(family: Path | None) -> list[str]:
    """Point the pair at a trained family's directory (slm/, llm/; its prm/ head is loaded directly)."""
    if family is None:
        return []
    files = {"slm": "config.json", "llm": "config.json", "prm": "prm_head.json"}
    missing = [name for name, file in files.items() if not (family / name / file).is_file()]
    if missing:
        raise SystemExit(f"error: --family {family}: no trained {', '.join(missing)} in it (expected DIR/slm, DIR/llm, DIR/prm)")
    return [f"pair.{m}.path={(family / m).resolve()}" for m in ("slm", "llm")]


@exit_on_config_error()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300, help="test problems")
    parser.add_argument("--results-root", default=None, help="default: runs/testbed-properties[-FAMILY]")
    parser.add_argument("--family", type=Path, default=None,
                        help="measure the family in this train_testbed.py --out directory instead of the shipped one")
    parser.add_argument("--judge-steps", type=int, default=None, help="SLM steps scored by the judge (default: all)")
    parser.add_argument("--sweep-n", type=int, default=None, help="test problems for the rstitch/random points (default: --n)")
    parser.add_argument("--no-sweeps", action="store_true", help="skip the rstitch/random points")
    parser.add_argument("--write-doc", action="store_true", help=f"replace the measured section of {DOC}")
    args = parser.parse_args()
    if args.family is not None and args.write_doc:
        parser.error("--write-doc describes the shipped family; drop it with --family")
    root = args.results_root or "runs/testbed-properties" + (f"-{args.family.name}" if args.family else "")
    fixed = [f"results_root={root}", "logger=none", "engine.num_threads=1", *family_overrides(args.family)]
    common = [f"dataset.limit={args.n}", f"dataset.n={args.n}", *fixed]
    sweep_n = args.sweep_n or args.n
    sweep = [f"dataset.limit={sweep_n}", f"dataset.n={sweep_n}", *fixed]

    llm_sum, llm_samples, cfg = evaluate(common + ["method=llm_only"])
    slm_sum, slm_samples, _ = evaluate(common + ["method=slm_only"])
    pair = get_pair(cfg["pair"], cfg["engine"])
    records = {r.id: r for r in load_dataset_records(**cfg["dataset"])}
    metadata = {k: r.metadata for k, r in records.items()}
    per_token = lambda ss: statistics.median(s["latency_s"] / max(1, s["tokens"]) for s in ss)  # noqa: E731
    both = {s["id"] for s in slm_samples if s["correct"]} & {s["id"] for s in llm_samples if s["correct"]}
    mean_tokens = lambda ss: statistics.fmean([s["tokens"] for s in ss if s["id"] in both] or [float("nan")])  # noqa: E731
    slm_steps, llm_steps = labeled_steps(slm_samples, metadata), labeled_steps(llm_samples, metadata)
    judged = slm_steps[: args.judge_steps]  # the first steps, whole problems but for the last
    prm = load_prm("testbed", **({"path": str((args.family / "prm").resolve()), "model": str((args.family / "llm").resolve())}
                                 if args.family else {}))
    props = {
        "n": args.n, "judge_steps": args.judge_steps,
        "params_slm": pair.slm.num_parameters, "params_llm": pair.llm.num_parameters, "params_prm": prm.num_parameters,
        "acc_llm": llm_sum["accuracy"], "acc_slm": slm_sum["accuracy"],
        "latency_llm_s": llm_sum["latency_s"], "latency_slm_s": slm_sum["latency_s"],
        "per_token_latency_ratio": per_token(llm_samples) / per_token(slm_samples),
        "tokens_ratio_both_solved": mean_tokens(slm_samples) / mean_tokens(llm_samples), "n_both_solved": len(both),
        **auc_fields("prm_auc_slm_steps", prm_scores(prm, slm_steps), slm_steps),
        **auc_fields("prm_auc_llm_steps", prm_scores(prm, llm_steps), llm_steps),
        "steps_slm": len(slm_steps), "wrong_steps_slm": sum(not y for *_, y in slm_steps),
        "steps_llm": len(llm_steps), "wrong_steps_llm": sum(not y for *_, y in llm_steps),
        **auc_fields("judge_auc_slm_steps", judge_scores(pair, judged), judged),
        "judged_steps": len(judged), "judged_wrong_steps": sum(not y for *_, y in judged),
        **slm_entropies(pair, cfg, slm_samples, {k: r.problem for k, r in records.items()}),
    }
    points = [("llm_only", "", llm_sum), ("slm_only", "", slm_sum)]
    if not args.no_sweeps:
        if sweep_n != args.n:  # baselines on the sweep's problems, for its speedups
            points = [(m, "", evaluate(sweep + [f"method={m}"])[0]) for m in ("llm_only", "slm_only")]
        points += [("rstitch", f"tau={t}", evaluate(sweep + ["method=rstitch", f"method.tau={t}"])[0]) for t in TAUS]
        points += [("random", f"p={p}", evaluate(sweep + ["method=random", f"method.p={p}"])[0]) for p in PS]
    report = render(props, points, sweep_n)
    print(report)
    if args.write_doc:
        replace_marked_section(DOC, "measured", report)


def render(p: dict, points: list[tuple[str, str, dict]], sweep_n: int) -> str:
    check = lambda ok: "yes" if ok else "**no**"  # noqa: E731
    auc = lambda k: f"{p[k]:.3f} ({p[k + '_ci95'][0]:.2f}-{p[k + '_ci95'][1]:.2f})"  # noqa: E731
    lines = [
        f"Measured by `python scripts/measure_testbed.py --n {p['n']} --sweep-n {sweep_n}"
        + (f" --judge-steps {p['judge_steps']}" if p.get("judge_steps") else "")
        + " --write-doc` on the test "
        f"split ({p['n']} problems, greedy, batch 1, one torch thread on a shared 2-core CPU, framework HF engine, fp32).",
        "",
        "| property | target | measured | met |",
        "|---|---|---|---|",
        f"| LLM-only accuracy | >= 0.80 | {p['acc_llm']:.3f} | {check(p['acc_llm'] >= 0.8)} |",
        f"| LLM - SLM accuracy | >= 0.20 | {p['acc_llm'] - p['acc_slm']:.3f} (SLM {p['acc_slm']:.3f}) | {check(p['acc_llm'] - p['acc_slm'] >= 0.2)} |",
        f"| parameters LLM / SLM | >= 10 | {p['params_llm'] / p['params_slm']:.1f} ({p['params_llm'] / 1e6:.2f}M / {p['params_slm'] / 1e6:.2f}M) | {check(p['params_llm'] / p['params_slm'] >= 10)} |",
        f"| median per-token latency LLM / SLM | >= 3 | {p['per_token_latency_ratio']:.2f} | {check(p['per_token_latency_ratio'] >= 3)} |",
        f"| SLM / LLM mean output tokens (both solved, n={p['n_both_solved']}) | <= 0.75 | {p['tokens_ratio_both_solved']:.3f} | {check(p['tokens_ratio_both_solved'] <= 0.75)} |",
        f"| PRM ROC-AUC, SLM steps ({p['steps_slm']}, {p['wrong_steps_slm']} wrong) | >= 0.85 | {auc('prm_auc_slm_steps')} | {check(p['prm_auc_slm_steps'] >= 0.85)} |",
        f"| PRM ROC-AUC, LLM steps ({p['steps_llm']}, {p['wrong_steps_llm']} wrong) | >= 0.85 | {auc('prm_auc_llm_steps')} | {check(p['prm_auc_llm_steps'] >= 0.85)} |",
        f"| judge ROC-AUC (LLM's expected 0-9 score), SLM steps ({p['judged_steps']}, {p['judged_wrong_steps']} wrong) | reported | {auc('judge_auc_slm_steps')} | |",
        f"| SLM mean token entropy (nats), traces ending correct / incorrect | reported | {p['mean_entropy_correct']:.4f} / {p['mean_entropy_incorrect']:.4f} | |",
        f"| fraction of SLM tokens with normalized entropy > 0.01 | reported | {p['frac_norm_entropy_gt_0.01']:.3f} | |",
        "",
        "ROC-AUCs are given with their 95% bootstrap interval over problems (`roc_auc_interval`); \"met\" reads the "
        "point estimate.",
        "",
        f"Accuracy-latency points on the first {sweep_n} test problems (mean latency per problem; speedup against `llm_only`):",
        "",
        "| method | setting | accuracy | latency (s) | speedup | LLM token share | tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, setting, s in points:
        speed = "-" if s.get("speedup") is None else f"{s['speedup']:.2f}"
        lines.append(f"| {method} | {setting} | {s['accuracy']:.3f} | {s['latency_s']:.3f} | {speed} | {s['llm_token_share']:.3f} | {s['tokens']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
