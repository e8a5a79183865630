"""How many problems a comparison needs (size `dataset.limit` before spending GPU hours); on the same problems
the problems two methods disagree on set the variance (McNemar), usually far less than independent samples'."""
from __future__ import annotations

import math

import pandas as pd

from rstitch.errors import ConfigError
from rstitch.results.uncertainty import z_value

ALPHA = 0.05  # two-sided
POWER = 0.8


def _check_share(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be a share in [0, 1], got {value}")


def _z_and_variance(accuracy: float, baseline_accuracy: float, alpha: float, power: float) -> tuple[float, float, float]:
    """z_a, z_b and the variance of two independent samples' difference, p1 q1 + p2 q2 (the arguments checked)."""
    _check_share("accuracy", accuracy)
    _check_share("baseline_accuracy", baseline_accuracy)
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ConfigError(f"alpha and power must lie in (0, 1), got {alpha} and {power}")
    variance = accuracy * (1 - accuracy) + baseline_accuracy * (1 - baseline_accuracy)
    return z_value(1 - alpha), z_value(2 * power - 1), variance  # two-sided alpha; one-sided power


def problems_needed(accuracy: float, baseline_accuracy: float, difference: float | None = None,
                    discordant: float | None = None, alpha: float = ALPHA, power: float = POWER) -> int:
    """Problems two methods need to detect an accuracy `difference` (default: the measured one) by a two-sided test at
    `alpha` with `power`, one sample per problem. Independent samples (Fleiss, no continuity correction):
    n = (z_a + z_b)^2 (p1 q1 + p2 q2) / d^2. Paired, with `discordant` psi, the share of problems exactly one
    solves (`discordant_share` of a pilot run; Connor 1987, McNemar): n = (z_a sqrt(psi) + z_b sqrt(psi - d^2))^2 / d^2."""
    z_a, z_b, variance = _z_and_variance(accuracy, baseline_accuracy, alpha, power)
    delta = abs(accuracy - baseline_accuracy if difference is None else difference)
    if delta == 0:
        raise ConfigError("a difference of 0 needs infinitely many problems; give the difference to detect")
    if discordant is None:
        return math.ceil((z_a + z_b) ** 2 * variance / delta**2)
    _check_share("discordant", discordant)
    if discordant < delta:
        raise ConfigError(f"a difference of {delta} needs at least that share of discordant problems, got {discordant}")
    return math.ceil((z_a * math.sqrt(discordant) + z_b * math.sqrt(discordant - delta**2)) ** 2 / delta**2)


def detectable_difference(n_problems: int, accuracy: float, baseline_accuracy: float,
                          alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest difference `n_problems` independent problems detect: (z_a + z_b) sqrt((p1 q1 + p2 q2) / n)."""
    if n_problems < 1:
        raise ConfigError(f"n_problems must be at least 1, got {n_problems}")
    z_a, z_b, variance = _z_and_variance(accuracy, baseline_accuracy, alpha, power)
    return (z_a + z_b) * math.sqrt(variance / n_problems)


def discordant_share(paired: pd.DataFrame) -> float:
    """The share of paired samples (`paired_with_baseline`) exactly one of the two got right (`problems_needed`)."""
    if paired.empty:
        raise ConfigError("no paired samples: the run and its baseline share no problem")
    return float((paired["correct"].astype(bool) != paired["baseline_correct"].astype(bool)).mean())
