"""How well a score ranks right items above wrong ones (PRM, judge and router evaluations)."""
from __future__ import annotations

import random
import statistics
from collections.abc import Hashable, Sequence


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n in input order, tied values sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in order[i : j + 1]:
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Probability that a random positive outscores a random negative, ties counting half
    (rank-sum form, O(n log n)); nan without both classes."""
    n_pos = sum(bool(y) for y in labels)
    n_neg = len(labels) - n_pos
    if not n_pos or not n_neg:
        return float("nan")
    rank_sum = sum(rank for rank, y in zip(average_ranks(scores), labels) if y)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho: the Pearson correlation of the average ranks (ties share theirs); nan when
    either side is constant or has fewer than two values."""
    try:
        return statistics.correlation(average_ranks(a), average_ranks(b))
    except statistics.StatisticsError:
        return float("nan")


def roc_auc_interval(
    scores: Sequence[float], labels: Sequence[bool], groups: Sequence[Hashable],
    level: float = 0.95, n_boot: int = 2000, seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `roc_auc`, resampling whole groups (e.g. the steps of one
    problem: a model's wrong steps come clustered in the few problems it gets wrong, so resampling
    steps alone would claim far more certainty than the data hold). With only a handful of groups
    holding one class the interval is too narrow itself: resamples can only recombine those few.
    Resamples with one class only are skipped; (nan, nan) when the data have one class."""
    by_group: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    members = list(by_group.values())
    rng = random.Random(seed)
    aucs = []
    for _ in range(n_boot):
        rows = [i for _ in members for i in members[rng.randrange(len(members))]]
        auc = roc_auc([scores[i] for i in rows], [labels[i] for i in rows])
        if auc == auc:
            aucs.append(auc)
    if not aucs:
        return float("nan"), float("nan")
    aucs.sort()
    tail = (1 - level) / 2
    return aucs[int(tail * (len(aucs) - 1))], aucs[int(round((1 - tail) * (len(aucs) - 1)))]
