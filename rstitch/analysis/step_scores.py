"""Step-level scores of testbed traces, whose every step the step checker labels exactly: ROC-AUCs of the PRM
and SpecReason's judge, and SLM entropies (scripts/measure_testbed.py, docs/testbed.md "Measured properties")."""
from __future__ import annotations

import statistics

from rstitch.data.prompts import PromptFormat
from rstitch.judge_prompt import judge_prompt
from rstitch.methods.specreason import digit_score, digit_token_ids
from rstitch.results.uncertainty import roc_auc, roc_auc_interval
from rstitch.testbed import check_steps, make_problem


def labeled_steps(samples: list[dict], records: dict[str, dict]) -> list[tuple[str, list[str], bool]]:
    """(problem, steps up to and including this one, correct) for every step of every trace."""
    out = []
    for s in samples:
        meta = records[s["id"]]
        problem = make_problem(meta["start"], meta["ops"])
        steps = [t for t in s["response"].split("\n\n") if t.strip()]
        for i, ok in enumerate(check_steps(problem, steps)):
            out.append((problem.problem, steps[: i + 1], ok))
    return out


def auc_fields(name: str, scores: list[float], steps: list[tuple[str, list[str], bool]]) -> dict:
    """ROC-AUC of `scores` on the steps' labels and its 95% interval over problems (a model's wrong
    steps cluster in the few problems it gets wrong: the interval shows how many it rests on)."""
    labels, problems = [y for *_, y in steps], [p for p, *_ in steps]
    return {name: roc_auc(scores, labels), f"{name}_ci95": list(roc_auc_interval(scores, labels, problems))}


def prm_scores(prm, steps: list[tuple[str, list[str], bool]]) -> list[float]:
    """The PRM's score of each labelled step (the last score of its prefix)."""
    scores = {}
    for problem, prefix, _ in steps:  # each distinct prefix scored once (two traces may share their first steps)
        key = (problem, tuple(prefix))
        if key not in scores:
            scores[key] = prm.score(problem, prefix)[-1]
    return [scores[(p, tuple(x))] for p, x, _ in steps]


def judge_scores(pair, steps: list[tuple[str, list[str], bool]]) -> list[float]:
    """SpecReason's judge (the pair's LLM) on each labelled step: its expected 0-9 score."""
    llm = pair.llm
    digits = digit_token_ids(llm)
    scores = []
    for problem, prefix, _ in steps:
        ids = llm.tokenizer.encode(judge_prompt(llm.tokenizer, problem, prefix, "\n\n"), add_special_tokens=False)
        scores.append(digit_score(llm.new_sequence(ids).next_distribution().logits, digits, "expected"))
    return scores


def slm_entropies(pair, cfg: dict, samples: list[dict], problems: dict[str, str]) -> dict:
    """The SLM's entropies over its own traces: mean per trace by outcome, share of tokens above 0.01 (normalized)."""
    prompt = PromptFormat(**cfg["prompt"])
    per_trace: dict[bool, list[float]] = {True: [], False: []}
    all_norm: list[float] = []
    for s in samples:
        seq = pair.slm.new_sequence(prompt.encode(pair.tokenizer, problems[s["id"]]))
        dists = seq.score(s["output_token_ids"])[:-1]
        per_trace[bool(s["correct"])].append(statistics.fmean(d.entropy for d in dists))
        all_norm.extend(d.normalized_entropy for d in dists)
    return {
        "mean_entropy_correct": statistics.fmean(per_trace[True]) if per_trace[True] else float("nan"),
        "mean_entropy_incorrect": statistics.fmean(per_trace[False]) if per_trace[False] else float("nan"),
        "frac_norm_entropy_gt_0.01": sum(h > 0.01 for h in all_norm) / len(all_norm),
    }
