"""Per-sample results, appended as each sample finishes, and resumable after a kill."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rstitch.errors import ConfigError

SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"
RUN_KEY_FILE = "run_key.json"
_HELD: set[str] = set()  # run directories whose lock this process holds


def sample_key(record: dict[str, Any]) -> tuple[str, int]:
    return str(record["id"]), int(record.get("sample_index", 0))


class SampleStore:
    """`samples.jsonl` in a run directory: one JSON line per finished (problem, sample)."""

    def __init__(self, run_dir: str | os.PathLike, run_key: dict[str, Any]):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / SAMPLES_FILE
        self._lock = self._acquire()
        try:
            self._claim(run_key)
        except ConfigError:
            self.close()
            raise
        self._repair_tail()
        self.records: dict[tuple[str, int], dict[str, Any]] = {}
        for record in iter_samples(self.path) if self.path.exists() else ():
            self.records.setdefault(sample_key(record), record)

    def _acquire(self):
        """One process per run directory (sweep points sharing a baseline would decode it twice); a
        second waits, then resumes. The OS drops the lock of a killed holder."""
        key = str(self.dir.resolve())
        if key in _HELD:  # waiting on our own lock would never end
            raise RuntimeError(f"{self.dir} is already open in this process; close that store first")
        lock = open(self.dir / ".lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process to finish {self.dir}", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        _HELD.add(key)
        return lock

    def close(self) -> None:
        """Release the run directory to other processes."""
        if not self._lock.closed:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            _HELD.discard(str(self.dir.resolve()))

    def __enter__(self) -> SampleStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_lock", None) is not None:
            self.close()

    def _claim(self, run_key: dict[str, Any]) -> None:
        """A run directory belongs to one configuration: refuse to mix results of another."""
        key_path = self.dir / RUN_KEY_FILE
        if key_path.exists():
            existing = json.loads(key_path.read_text())
            if existing != run_key:
                changed = sorted(k for k in set(existing) | set(run_key) if existing.get(k) != run_key.get(k))
                raise ConfigError(f"{self.dir} holds results of another configuration (differs in: {', '.join(changed)})")
        else:
            atomic_write(key_path, json.dumps(run_key, indent=1, sort_keys=True))

    def _repair_tail(self) -> None:
        """Drop a line cut short by a kill mid-write, so the file stays valid JSONL."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def done(self, problem_id: str, sample_index: int) -> bool:
        return (str(problem_id), sample_index) in self.records

    def append(self, record: dict[str, Any]) -> None:
        key = sample_key(record)
        if key in self.records:
            raise ValueError(f"sample {key} already recorded in {self.path}")
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.records[key] = record

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write(self.dir / SUMMARY_FILE, json.dumps(summary, indent=1, sort_keys=True, default=str))


def iter_samples(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The records of a samples.jsonl file; a line that is not JSON is one error line naming it."""
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{number}: not a JSON sample ({err.msg})") from None


def write_samples(run_dir: str | os.PathLike, samples: list[dict[str, Any]]) -> None:
    """Replace a run's samples.jsonl at once (a merge of shards)."""
    atomic_write(Path(run_dir) / SAMPLES_FILE, "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples))


def atomic_write(path: Path, text: str) -> None:
    """Readers see the old file or the whole new one, with the old one's mode (a new one's: the umask's)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one writer per process: sweep jobs may share a file
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        shutil.copymode(path, tmp)
    os.replace(tmp, path)


def run_summaries(root: str | os.PathLike) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(run directory, summary) of every readable summary.json under `root`."""
    for path in Path(root).rglob(SUMMARY_FILE):
        try:
            yield path.parent, json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
