"""Train the testbed model family: shared tokenizer, SLM, LLM (+ judge), PRM.

Deterministic (fixed seeds, step-count schedules):

    python scripts/train_testbed.py                      # full run into rstitch/testbed/assets
    python scripts/train_testbed.py --smoke --out /tmp/x # whole pipeline on tiny sizes, < 1 minute

Pipeline:
  1. tokenizer: byte-level BPE on the task corpus           -> OUT/tokenizer
  2. SLM: 2-layer Llama on prompt + concise solution + eos  -> OUT/slm
  3. sample the SLM on training problems (real, labelled mistakes for the judge and the PRM)
  4. LLM: deep Llama on prompt + verbose solution + eos, plus ~20% SpecReason judge
     examples (conversation + JUDGE_PREFIX -> one digit, 9 = correct step, 0 = wrong)  -> OUT/llm
  5. sample the LLM on training problems; solve greedily problems with operands a little past the
     training range, where it errs the way it errs on test problems (`stretch_samples`)
  6. PRM: the LLM read through its own predictions (`rstitch.scorers.likelihood_prm`): a logistic
     head on the lowest probability it gives a written digit or operator, fitted on step-checker
     labels of both models' solutions and of corrupted ones  -> OUT/prm (the head; it reads OUT/llm)
  7. validation: greedy accuracy / output length of SLM and LLM, judge and PRM ROC-AUC -> OUT/train_report.json

The phases are rstitch/training/testbed_family.py's `FamilyTrainer`; this script parses the
arguments and calls it.

``--steps-slm/llm`` fix the number of optimizer steps and the learning-rate schedule, so a run is
exactly reproducible (tests/training/test_testbed_train_smoke.py trains twice and compares the weights).
``--minutes-*`` are safety caps on each phase's wall time, set well above what the default step
counts take on a 2-core CPU; a phase that hits one stops early, undecayed, and the run then
depends on the machine's speed (``--schedule-by-time`` decays by the cap instead).
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch

from rstitch.errors import exit_on_config_error
from rstitch.testbed import ASSETS_DIR
from rstitch.training.testbed_family import FamilyTrainer


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="output dir (default: the package assets dir; with --smoke: a temp dir)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and steps, whole pipeline in < 1 minute")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads (default: all cores; on the idle 2-core machine 2 threads train the LLM 1.7x faster "
                        "than 1, but use 1 when another job shares the machine; bit-for-bit reproducibility is tested at 1 and was checked at 2)")
    p.add_argument("--data-seed", type=int, default=None, help="seed of the training-problem stream (default: --seed)")
    p.add_argument("--only", default="slm,llm,prm", help="comma list of phases to train (the others are loaded from --out)")
    p.add_argument("--init-llm", type=Path, default=None, help="start the LLM from this checkpoint instead of a fresh init")
    # model sizes
    p.add_argument("--slm-layers", type=int, default=2)
    p.add_argument("--slm-hidden", type=int, default=64)
    p.add_argument("--llm-layers", type=int, default=10)
    p.add_argument("--llm-hidden", type=int, default=112)
    # optimisation
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--steps-slm", type=int, default=1500)
    p.add_argument("--steps-llm", type=int, default=5500)
    p.add_argument("--minutes-slm", type=float, default=10.0)
    p.add_argument("--minutes-llm", type=float, default=75.0)
    p.add_argument("--schedule-by-time", action="store_true",
                   help="decay the learning rate by the time cap too when it is further along than the step count "
                        "(the run then depends on the machine's speed)")
    p.add_argument("--judge-frac", type=float, default=0.2, help="fraction of LLM examples in the judge format")
    p.add_argument("--stitch-frac", type=float, default=0.3,
                   help="fraction of SLM/LLM examples that continue a solution begun in the other model's style")
    p.add_argument("--tokenizer", type=Path, default=None, help="use this tokenizer instead of training one (with --init-*)")
    p.add_argument("--init-slm", type=Path, default=None, help="start the SLM from this checkpoint instead of a fresh init")
    p.add_argument("--sample-slm", type=int, default=8192, help="training problems sampled from the SLM for judge/PRM data")
    p.add_argument("--sample-llm", type=int, default=1024, help="training problems sampled from the LLM for PRM data")
    p.add_argument("--stretch-llm", type=int, default=1024,
                   help="greedy LLM solutions of training problems with operands up to 70, past the training range, for PRM data")
    p.add_argument("--prm-solutions", type=int, default=4096,
                   help="labelled solutions the PRM head is fitted on: half real samples of both models, half clean or corrupted")
    p.add_argument("--eval-n", type=int, default=200, help="validation problems for the final evaluation")
    p.add_argument("--max-new-concise", type=int, default=120)
    p.add_argument("--max-new-verbose", type=int, default=400)
    p.add_argument("--eval-every", type=int, default=0, help="quick validation eval every N steps (0: off)")
    args = p.parse_args()
    if (llm_frac_sum := args.judge_frac + args.stitch_frac) > 1:
        p.error(f"--judge-frac + --stitch-frac is {llm_frac_sum:g}; they share the LLM's examples and must sum to at most 1")

    if args.smoke:
        args.slm_hidden, args.llm_hidden, args.llm_layers = 32, 48, 3
        args.steps_slm, args.steps_llm = 12, 12
        args.sample_slm, args.sample_llm, args.stretch_llm, args.prm_solutions, args.eval_n = 16, 8, 8, 32, 8
        args.max_new_concise, args.max_new_verbose = 30, 40
        args.threads = 1
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="testbed-smoke-")) if args.smoke else ASSETS_DIR
    return args


@exit_on_config_error()
def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    FamilyTrainer(args).run()


if __name__ == "__main__":
    main()
