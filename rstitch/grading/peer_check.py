"""Agreement with the answer-equivalence cases of established graders' test suites
(tests/fixtures/grading_peers.jsonl; docs/grading.md, "Agreement with peer graders")."""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstitch.grading.verify import grade

MATH_VERIFY_TIMEOUT_S = 5


@dataclass(frozen=True)
class PeerCase:
    id: str
    cls: str                  # the class of answers it stands for ("one answer in several boxes", ...)
    source: str               # the peer test file it is modelled on
    response: str
    gold: str
    expected: bool            # the peer test's verdict (for our own variants, the one we hold right)
    ours: bool | None = None  # our deliberate verdict where it differs from ``expected``
    why: str = ""
    multiple_choice: bool = False
    mv_targets: tuple[str, ...] = ("latex", "expr")  # the extraction targets the peer test gives math-verify
    mv_precision: int = 6

    @property
    def from_peer(self) -> bool:  # False for our own variants ("rstitch, a variant after ...")
        return not self.source.startswith("rstitch")

    @property
    def intended(self) -> bool:
        return self.expected if self.ours is None else self.ours


def load_cases(path: str | Path) -> list[PeerCase]:
    cases = []
    for line in filter(str.strip, Path(path).read_text().splitlines()):
        row: dict[str, Any] = json.loads(line)
        row["cls"] = row.pop("class")
        if "mv_targets" in row:
            row["mv_targets"] = tuple(row["mv_targets"])
        cases.append(PeerCase(**row))
    return cases


def our_verdict(case: PeerCase, timeout_s: float = 5.0) -> bool:
    """Our grader's verdict, with the runner's time limit unless told otherwise."""
    return grade(case.response, case.gold, multiple_choice=case.multiple_choice, timeout_s=timeout_s)


def math_verify_verdict(case: PeerCase) -> bool:
    """math-verify as the peer test calls it: ``parse`` with the test's extraction targets, then
    ``verify``; a gold without math delimiters is wrapped in ``$...$`` as the tests write it.
    Runs in this thread: math-verify's timeouts use ``signal.alarm`` (main thread only)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, StringExtractionConfig, parse, verify

    configs = {"latex": LatexExtractionConfig(boxed_match_priority=0), "expr": ExprExtractionConfig(),
               "string": StringExtractionConfig()}
    targets = [configs[name] for name in case.mv_targets]
    delimited = any(mark in case.gold for mark in ("$", "\\(", "\\[", "\\boxed"))
    gold = case.gold if delimited or case.multiple_choice else f"${case.gold}$"
    try:
        parsed_gold = parse(gold, targets, parsing_timeout=MATH_VERIFY_TIMEOUT_S)
        parsed_response = parse(case.response, targets, parsing_timeout=MATH_VERIFY_TIMEOUT_S)
        return bool(verify(parsed_gold, parsed_response, float_rounding=case.mv_precision,
                           timeout_seconds=MATH_VERIFY_TIMEOUT_S))
    except Exception:  # noqa: BLE001 - a crash or timeout is a wrong verdict, as in the peer's own use
        return False


@dataclass
class Agreement:
    """How often a grader's verdicts match the peers' expectations, overall and per class."""

    name: str
    verdicts: dict[str, bool] = field(default_factory=dict)  # case id -> verdict

    def agreeing(self, cases: Iterable[PeerCase]) -> int:
        return sum(self.verdicts[c.id] == c.expected for c in cases)

    def disagreements(self, cases: Iterable[PeerCase]) -> list[PeerCase]:
        return [c for c in cases if self.verdicts[c.id] != c.expected]


def report(cases: list[PeerCase], results: list[Agreement]) -> str:
    """A per-class table of agreement with the peers' expectations, then every case where our
    grader (the first result) differs from them, with the reason."""
    by_class: dict[str, list[PeerCase]] = defaultdict(list)
    for case in cases:
        by_class[case.cls].append(case)
    width = max(len(name) for name in by_class)
    header = f"{'class':<{width}}  {'cases':>5}  " + "  ".join(f"{r.name:>12}" for r in results)
    lines = [header]
    for name, members in by_class.items():
        cells = "  ".join(f"{r.agreeing(members):>12}" for r in results)
        lines.append(f"{name:<{width}}  {len(members):>5}  {cells}")
    for label, subset in (("all", cases), ("the peers' cases", [c for c in cases if c.from_peer])):
        total = "  ".join(f"{r.agreeing(subset):>5} ({r.agreeing(subset) / len(subset):5.1%})" for r in results)
        lines.append(f"{label:<{width}}  {len(subset):>5}  {total}")
    for other in results[1:]:
        lines.append(f"{other.name} differs from them on: {', '.join(c.id for c in other.disagreements(cases)) or 'none'}")
    ours = results[0]
    lines += ["", f"{ours.name} differs from the peers' expectation on {len(ours.disagreements(cases))} cases:"]
    for case in ours.disagreements(cases):
        reason = case.why if case.ours is not None and ours.verdicts[case.id] == case.ours else "NOT INTENDED"
        lines.append(f"  {case.id} [{case.source}] expected {case.expected}, got {ours.verdicts[case.id]}: {reason}")
    return "\n".join(lines)
