"""`rstitch-report`: tables and figures of the runs under one or more results directories.

    rstitch-report runs/                                  # runs/report.html
    rstitch-report runs/ other_runs/                      # report.html in the current directory (git-ignored)
    rstitch-report runs/testbed -o out/report.md --latex out/tables.tex
    rstitch-report runs/ --entropy --entropy-samples 50   # also score traces with the SLM
    rstitch-report runs/ --wandb-project rstitch          # also log figures and tables to W&B
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rstitch.errors import ConfigError, exit_on_config_error

PROG = "rstitch-report"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="results roots or run directories")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="report file: .html (self-contained) or .md (figures in <name>_files/); default: "
                             "report.html in the results directory given, or in the current directory for several")
    parser.add_argument("--latex", type=Path, default=None, help="also write every table as LaTeX to this file")
    parser.add_argument("--latency", default="latency_s", choices=["latency_s", "latency_estimate_s", "latency_median_s"],
                        help="the latency of the accuracy-latency plane (default: mean wall clock)")
    parser.add_argument("--entropy", action="store_true",
                        help="score stored traces with the pair's SLM for the entropy and token-consistency figures")
    parser.add_argument("--entropy-samples", type=int, default=None, metavar="N", help="score the first N samples per run")
    parser.add_argument("--title", default="rstitch results")
    parser.add_argument("--wandb-project", default=None, help="log the figures and tables to one W&B run of this project")
    parser.add_argument("--wandb-entity", default=None)
    parser.add_argument("--wandb-mode", default="auto", choices=["auto", "online", "offline"],
                        help="auto: online when WANDB_API_KEY is set")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads for --entropy")
    args = parser.parse_args(argv)
    if args.output is None:  # beside the runs of the one results directory given, else here
        one_folder = len(args.results) == 1 and args.results[0].is_dir()
        args.output = (args.results[0] if one_folder else Path()) / "report.html"
    if args.entropy_samples is not None and args.entropy_samples < 1:
        parser.error(f"--entropy-samples must be >= 1, got {args.entropy_samples}")
    return args


@exit_on_config_error(PROG)
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from rstitch.analysis import load_runs, unfinished_run_dirs
    from rstitch.analysis.collect import older_grader_run_dirs, repeated_runs
    from rstitch.analysis.report import FORMATS, build_report, write_latex, write_report

    if args.output.suffix not in FORMATS:  # before the runs load (and the traces are scored)
        raise ConfigError(f"report file must end in {' or '.join(FORMATS)}, got '{args.output.name}'")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    runs = load_runs(args.results)
    report = build_report(runs, args.latency, args.entropy, args.entropy_samples, args.title)
    for left_out, kept in repeated_runs(args.results):
        print(f"{PROG}: {left_out} holds the same run (run key) as {kept}, measured again; the first root given wins, "
              f"so it is left out (pass only one of them to choose)", file=sys.stderr)
    unfinished = unfinished_run_dirs(args.results)
    if unfinished:
        print(f"{PROG}: left out {len(unfinished)} unfinished run(s) without summary.json, e.g. {unfinished[0]}",
              file=sys.stderr)
    stale = older_grader_run_dirs(args.results)
    if stale:
        print(f"{PROG}: {len(stale)} run(s) graded by an older grader, e.g. {stale[0]}; grade them again with "
              f"rstitch-regrade {' '.join(map(str, args.results))}", file=sys.stderr)
    written = write_report(report, args.output)
    if args.latex:
        written.append(write_latex(report, args.latex))
    if args.wandb_project:
        import wandb

        from rstitch.analysis.report import log_report
        from rstitch.logging import WandbLogger

        settings = WandbLogger(project=args.wandb_project, entity=args.wandb_entity, mode=args.wandb_mode)
        run = wandb.init(project=settings.project, entity=settings.entity, mode=settings.mode, job_type="report",
                         name=args.title, config={"runs": sorted(map(str, runs["run_dir"]))}, reinit="finish_previous")
        log_report(report, run)
        run.finish()
    print(f"{len(runs)} runs, {len(report.all_tables())} tables, {len(report.all_figures())} figures")
    print(f"report: {Path(written[0]).resolve()}")
    if args.latex:
        print(f"latex: {args.latex.resolve()}")


if __name__ == "__main__":
    main()
