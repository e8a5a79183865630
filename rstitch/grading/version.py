"""The grader's version in every run summary, so that `rstitch-report` flags a run graded by an older
grader and `rstitch-regrade` grades it again. Bump it whenever a change to rstitch/grading can turn a
verdict: extraction, normalization, equivalence or a structured grader."""
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
