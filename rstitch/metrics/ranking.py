"""How well a score ranks right items above wrong ones (PRM, judge and router evaluations)."""
from __future__ import annotations

from typing import Sequence


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Probability that a random positive outscores a random negative, ties counting half
    (rank-sum form, O(n log n)); nan without both classes."""
    n_pos = sum(bool(y) for y in labels)
    n_neg = len(labels) - n_pos
    if not n_pos or not n_neg:
        return float("nan")
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    rank_sum, i = 0.0, 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        mid_rank = (i + j) / 2 + 1  # tied scores share their average rank
        rank_sum += mid_rank * sum(bool(labels[k]) for k in order[i : j + 1])
        i = j + 1
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
