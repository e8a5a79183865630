"""`rstitch-regrade`: grade the saved samples of finished runs again with the current grader.

    rstitch-regrade runs/                 # every finished run under runs/ graded by an older grader
    rstitch-regrade runs/ --dry-run       # count the verdicts that would change, write nothing
    rstitch-regrade runs/testbed --force  # also runs already graded by the current grader
    rstitch-regrade runs/ --weak-code-sandbox  # code samples without bubblewrap (docs/sandbox.md)

Nothing is decoded: each saved response is graded against its saved gold with its dataset record's grading
metadata. samples.jsonl, then summary.json (which records the grader version), are each replaced whole under
the run's lock: a crash between them leaves the old version recorded, so the run is graded again next time.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstitch.errors import ConfigError, exit_on_config_error
from rstitch.grading import grade_sample
from rstitch.grading.sandbox import check_code_sandbox
from rstitch.grading.version import GRADER_VERSION, summary_grader_version
from rstitch.results.store import RUN_KEY_FILE, SAMPLES_FILE, SUMMARY_FILE, SampleStore, iter_samples, write_samples
from rstitch.results.summary import summarize_run

PROG = "rstitch-regrade"
# What a grader writes on a sample (grade_sample and the structured graders): replaced as a whole.
GRADE_KEYS = ("answer", "correct", "grading_error", "code", "cell_accuracy")
SPEEDUP_KEYS = ("speedup", "speedup_cpu", "speedup_estimate", "speedup_tokens_per_s")


@dataclass
class Regraded:
    method: str
    samples: int
    changed: int            # samples whose verdict flipped
    gained: int             # of those, wrong -> right
    accuracy_before: float | None
    accuracy_after: float | None
    version_before: int
    written: bool


def find_runs(roots: Sequence[str | Path]) -> tuple[list[Path], list[Path]]:
    """(finished run directories, unfinished ones) under `roots`: an unfinished one has no config yet (--force later)."""
    runs: dict[Path, bool] = {}  # run directory (each once, in the order found) -> finished
    for root in map(Path, roots):
        if not root.is_dir():
            raise ConfigError(f"no such results directory: {root}")
        for key_file in sorted(root.rglob(RUN_KEY_FILE)):
            run_dir = key_file.parent.resolve()
            if (run_dir / SAMPLES_FILE).is_file():
                runs[run_dir] = (run_dir / SUMMARY_FILE).is_file()
    if not runs:
        raise ConfigError(f"no runs ({RUN_KEY_FILE} and {SAMPLES_FILE}) under {', '.join(map(str, roots))}")
    return [d for d, finished in runs.items() if finished], [d for d, finished in runs.items() if not finished]


class RecordIndex:
    """The records of each run's selection by id, loaded once per dataset config; the first selection of code
    records checks the sandbox, as a decode of a code benchmark does."""

    def __init__(self, allow_weak_sandbox: bool = False) -> None:
        self._cache: dict[str, dict[str, Any]] = {}
        self._allow_weak_sandbox = allow_weak_sandbox
        self._sandbox_checked = False

    def records(self, dataset_cfg: dict[str, Any]) -> dict[str, Any]:
        key = json.dumps(dataset_cfg, sort_keys=True, default=str)
        if key not in self._cache:
            from rstitch.data import load_dataset_records  # lazy: the loaders import the hub client

            try:
                loaded = load_dataset_records(**dataset_cfg)
            except ConfigError:
                raise
            except Exception as err:  # noqa: BLE001 - one line naming the dataset, not a traceback
                raise ConfigError(f"cannot load dataset '{dataset_cfg.get('name')}' for its records' grading "
                                  f"metadata ({type(err).__name__}: {err})") from None
            if not self._sandbox_checked and any(r.metadata.get("answer_type") == "code" for r in loaded):
                check_code_sandbox(self._allow_weak_sandbox)
                self._sandbox_checked = True
            self._cache[key] = {record.id: record for record in loaded}
        return self._cache[key]


def regrade_samples(samples: list[dict[str, Any]], records: dict[str, Any], run_dir: Path) -> tuple[list[dict[str, Any]], int, int]:
    """The samples graded again, in their order, with (verdicts changed, of which now right)."""
    out, changed, gained = [], 0, 0
    for sample in samples:
        record = records.get(str(sample["id"]))
        if record is None:
            raise ConfigError(f"{run_dir}: sample {sample['id']!r} is not in its dataset selection; cannot regrade")
        metadata = record.metadata
        verdict = grade_sample(sample.get("response") or "", sample.get("gold", record.answer),
                               multiple_choice=bool(metadata.get("multiple_choice")), metadata=metadata)
        new = {k: v for k, v in sample.items() if k not in GRADE_KEYS}
        new.update(verdict)
        if bool(new.get("correct")) != bool(sample.get("correct")):
            changed += 1
            gained += bool(new.get("correct"))
        out.append(new)
    return out, changed, gained


def regrade_run(run_dir: Path, index: RecordIndex, force: bool = False, dry_run: bool = False) -> Regraded | None:
    """Grade one finished run again; None when its summary already records the current grader."""
    from rstitch.methods import build_method  # lazy: the method registry imports the engines

    old = json.loads((run_dir / SUMMARY_FILE).read_text())
    version = summary_grader_version(old)
    if version == GRADER_VERSION and not force:
        return None
    config = old.get("config")
    if not isinstance(config, dict):
        raise ConfigError(f"{run_dir / SUMMARY_FILE} has no resolved config; cannot regrade it")
    records = index.records(config["dataset"])
    run_key = json.loads((run_dir / RUN_KEY_FILE).read_text())
    with SampleStore(run_dir, run_key) as store:  # the run's lock: a run still decoding is waited for
        samples, changed, gained = regrade_samples(list(iter_samples(run_dir / SAMPLES_FILE)), records, run_dir)
        # The comparison root is <results_root>/<pair>/<dataset>, as for a run of rstitch-run.
        new = summarize_run(config, build_method(**config["method"]), samples, run_dir.parent.parent)
        for key in SPEEDUP_KEYS:  # latencies did not change: a speedup whose baseline is not at hand stands
            if new.get(key) is None and old.get(key) is not None:
                new[key] = old[key]
        summary = {**{k: v for k, v in old.items() if k not in new}, **new}  # e.g. merged_from
        if not dry_run:
            write_samples(run_dir, samples)  # first the samples; the summary, with the version, last
            store.write_summary(summary)
    return Regraded(old.get("method", config["method"]["name"]), len(samples), changed, gained,
                    old.get("accuracy"), summary.get("accuracy"), version, not dry_run)


def regrade(roots: Sequence[str | Path], force: bool = False, dry_run: bool = False,
            weak_code_sandbox: bool = False) -> tuple[list[Regraded], list[Path], int]:
    """(the runs graded again, the unfinished runs left alone, the runs already current)."""
    finished, unfinished = find_runs(roots)
    index = RecordIndex(allow_weak_sandbox=weak_code_sandbox)
    done, current = [], 0
    for run_dir in finished:
        result = regrade_run(run_dir, index, force=force, dry_run=dry_run)
        if result is None:
            current += 1
        else:
            done.append(result)
            print(f"{'regraded' if result.written else 'would regrade'} {run_dir} (grader {result.version_before} -> "
                  f"{GRADER_VERSION}): {result.changed} of {result.samples} verdicts changed (+{result.gained} right, "
                  f"-{result.changed - result.gained}), accuracy {_fmt(result.accuracy_before)} -> {_fmt(result.accuracy_after)}",
                  flush=True)
    return done, unfinished, current


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def method_table(results: list[Regraded]) -> str:
    """Verdicts changed per method, over all runs graded again."""
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for r in results:
        rows[r.method] = [total + add for total, add in zip(rows[r.method], (1, r.samples, r.changed, r.gained))]
    lines = [f"{'method':<20} {'runs':>5} {'samples':>8} {'changed':>8} {'to right':>9} {'to wrong':>9}"]
    for method, (runs, samples, changed, gained) in sorted(rows.items()):
        lines.append(f"{method:<20} {runs:>5} {samples:>8} {changed:>8} {gained:>9} {changed - gained:>9}")
    return "\n".join(lines)


@exit_on_config_error(PROG)
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="results roots or run directories")
    parser.add_argument("--force", action="store_true", help="also grade runs already graded by the current grader")
    parser.add_argument("--dry-run", action="store_true", help="count the changes, write nothing")
    parser.add_argument("--weak-code-sandbox", action="store_true",
                        help="grade code samples even without bubblewrap's empty root (programs can read the host's files)")
    args = parser.parse_args(argv)
    results, unfinished, current = regrade(args.results, force=args.force, dry_run=args.dry_run,
                                          weak_code_sandbox=args.weak_code_sandbox)
    if unfinished:
        print(f"{PROG}: left out {len(unfinished)} unfinished run(s) without {SUMMARY_FILE}, e.g. {unfinished[0]}; "
              f"once resumed to the end, grade them again with {PROG} --force", file=sys.stderr)
    if results:
        print(method_table(results))
    print(f"{len(results)} run(s) {'would be ' if args.dry_run else ''}graded again with grader {GRADER_VERSION}; "
          f"{current} already current")


if __name__ == "__main__":
    main()
