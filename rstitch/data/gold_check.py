"""Each benchmark's own worked solutions graded against its own gold answers
(scripts/check_gold_grading.py, docs/grading.md): a sound grader accepts (nearly) all of them."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rstitch.data.datasets import Record, load_dataset_records
from rstitch.data.export import export_file_name
from rstitch.grading import extract_answer, is_equivalent

# dataset name -> the gold "response" to grade (its file in the benchmarks folder: export_file_name)
CASES: dict[str, Callable[[Record], str]] = {
    "math500": lambda r: r.metadata["solution"],
    "gsm8k": lambda r: r.metadata["solution"].replace("####", "The final answer is"),  # "#### 70,000" as a model says it
    "minerva": lambda r: r.metadata["solution"],
    "aime24": lambda r: r.metadata["solution"],
    "amc23": lambda r: f"\\boxed{{{r.answer}}}",  # no solutions in this file
}


@dataclass
class Miss:
    record_id: str
    extracted: str | None
    gold: str
    reason: str


@dataclass
class GoldCheck:
    dataset: str
    total: int = 0
    right: int = 0
    seconds: float = 0.0
    misses: list[Miss] = field(default_factory=list)

    @property
    def fraction_right(self) -> float:
        return self.right / self.total if self.total else 0.0


def check_dataset(name: str, benchmarks: Path, timeout_s: float = 5.0, fast_path: bool = True) -> GoldCheck:
    """Grade (as ``rstitch.grading.grade`` does) each gold solution of ``name`` against its answer."""
    gold_response = CASES[name]
    result = GoldCheck(name)
    start = time.perf_counter()
    for record in load_dataset_records(name, path=str(benchmarks / export_file_name(name))):
        extracted = extract_answer(gold_response(record))
        result.total += 1
        if extracted is None:
            result.misses.append(Miss(record.id, None, record.answer, "no answer found in the solution"))
        elif is_equivalent(extracted, record.answer, timeout_s=timeout_s, fast_path=fast_path):
            result.right += 1
        else:
            result.misses.append(Miss(record.id, extracted, record.answer, "extracted answer judged different"))
    result.seconds = time.perf_counter() - start
    return result


def check_all(benchmarks: Path, timeout_s: float = 5.0, fast_path: bool = True) -> list[GoldCheck]:
    return [check_dataset(name, benchmarks, timeout_s, fast_path) for name in CASES]


def report(results: list[GoldCheck]) -> str:
    lines = []
    for result in results:
        lines.append(f"{result.dataset}: {result.right}/{result.total} right ({100 * result.fraction_right:.1f}%) in {result.seconds:.1f}s")
        for miss in result.misses:
            lines.append(f"  {miss.record_id}: {miss.reason}: extracted {miss.extracted!r}, gold {miss.gold!r}")
    return "\n".join(lines)
