"""The grader's version, recorded in every run summary (`grader_version`) so that a run graded by
an older grader can be found (`rstitch-report` flags it) and graded again (`rstitch-regrade`).

Bump it whenever a change to rstitch/grading can turn a verdict: extraction, normalization,
equivalence or a structured grader. Summaries written before versions were recorded count as 1.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GRADER_VERSION = 2
UNVERSIONED = 1  # the grader of every summary that records no version
SUMMARY_KEY = "grader_version"


def summary_grader_version(summary: Mapping[str, Any]) -> int:
    """The grader version a run summary was graded with."""
    version = summary.get(SUMMARY_KEY)
    return version if isinstance(version, int) and not isinstance(version, bool) else UNVERSIONED


def graded_by_older_grader(summary: Mapping[str, Any]) -> bool:
    return summary_grader_version(summary) < GRADER_VERSION
