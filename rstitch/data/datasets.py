"""Benchmark registry and loaders: every dataset becomes a list of ``Record``.

Each ``DatasetSpec`` names where the data lives on the Hugging Face hub (id, config, split,
pinned revision) and how one raw row becomes a ``Record``. The same normalizer is applied
to a local JSONL/Parquet copy (``dataset.path=...``), so offline runs see identical records.
"""
from __future__ import annotations

import ast
import csv
import hashlib
import json
import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstitch.errors import ConfigError
from rstitch.grading.extract import last_boxed
from rstitch.registry import Registry

Row = Mapping[str, Any]


@dataclass
class Record:
    """One problem: the text shown to the model, its gold answer, and everything else."""

    id: str
    problem: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "problem": self.problem, "answer": self.answer, "metadata": dict(self.metadata)}


Normalizer = Callable[[Row, str], Record]


@dataclass(frozen=True)
class DatasetSpec:
    """Where a benchmark comes from and how its rows are normalized.

    Hub datasets set ``hf_id``/``split``/``revision``; generated ones set ``generate``, which
    receives the dataset's ``options`` (defaults here, overridable per call).
    """

    name: str
    normalize: Normalizer
    hf_id: str | None = None
    config: str | None = None
    split: str | None = None
    revision: str | None = None
    id_fields: tuple[str, ...] = ("id", "unique_id", "idx")
    generate: Callable[..., list[Row]] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    configs: tuple[str, ...] = ()  # several hub configs read in turn (MMLU-Redux: one per subject)
    packaged: Callable[[], list[Row] | None] | None = None  # an installed copy, read before the hub
    prepare: Callable[[list[Row]], list[Row]] | None = None  # on raw rows, before ids (e.g. add them)
    select: Callable[..., list[Record]] | None = None  # on records, with the dataset's options


# This module's datasets are registered below; the code, cross-domain and calibration sets of
# benchmarks.py (which imports this module) when the registry is first read.
DATASETS: Registry[DatasetSpec] = Registry("dataset", modules=("rstitch.data.benchmarks",), replace=True)


def register_dataset(spec: DatasetSpec, aliases: tuple[str, ...] = ()) -> DatasetSpec:
    """Add ``spec`` (and other names for it) to the registry; a later spec of the same name wins."""
    DATASETS.register(spec.name, spec, aliases)
    return spec


def get_dataset_spec(name: str) -> DatasetSpec:
    """The spec registered as ``name`` (or as an alias of it); ConfigError if there is none."""
    return DATASETS.get_entry(name)


def load_dataset_records(
    name: str,
    path: str | None = None,
    limit: int | None = None,
    ids: list[str] | None = None,
    shuffle_seed: int | None = None,
    revision: str | None = None,
    shard: int = 0,
    num_shards: int = 1,
    **options: Any,
) -> list[Record]:
    """Records of dataset ``name``, from the hub at its pinned revision or from ``path``.

    ``ids`` keeps only those records (in the order given), ``shuffle_seed`` shuffles
    deterministically, then ``limit`` keeps the first ones. Of that selection, shard ``shard`` of
    ``num_shards`` keeps every ``num_shards``-th record from position ``shard``: the shards are
    disjoint, cover the selection, and mix easy and hard problems when a benchmark is ordered by
    difficulty. ``options`` are dataset-specific (e.g. ``split`` and ``n`` for the testbed); an
    option set to None keeps its default.
    """
    spec = get_dataset_spec(name)
    _check_selection(limit, shuffle_seed)
    _check_shard(shard, num_shards)
    resolved = _resolve_options(spec, {k: v for k, v in options.items() if v is not None})
    rows = _read_rows(spec, path, revision, resolved)
    if spec.prepare is not None:
        rows = spec.prepare(rows)
    records = _unique([_to_record(spec, row, index) for index, row in enumerate(rows)], spec.name)
    if spec.select is not None:
        records = spec.select(records, **resolved)
    if ids is not None:
        records = _select_ids(records, ids, spec.name)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(records)
    if limit is not None:
        records = records[:limit]
    return _shard_of(records, shard, num_shards, spec.name)


def _shard_of(records: list[Record], shard: int, num_shards: int, dataset: str) -> list[Record]:
    if num_shards > max(1, len(records)):
        raise ConfigError(f"dataset.num_shards={num_shards} exceeds the {len(records)} records selected from '{dataset}'")
    return records[shard::num_shards]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_shard(shard: Any, num_shards: Any) -> None:
    if not _is_int(num_shards) or num_shards < 1:
        raise ConfigError(f"dataset.num_shards must be an integer >= 1, got {num_shards!r}")
    if not _is_int(shard) or not 0 <= shard < num_shards:
        raise ConfigError(f"dataset.shard must be an integer in [0, {num_shards - 1}] (dataset.num_shards={num_shards}), got {shard!r}")


def _check_selection(limit: Any, shuffle_seed: Any) -> None:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ConfigError(f"limit must be an integer >= 0 or None, got {limit!r}")
    if shuffle_seed is not None and (not isinstance(shuffle_seed, int) or isinstance(shuffle_seed, bool)):
        raise ConfigError(f"shuffle_seed must be an integer or None, got {shuffle_seed!r}")


# --------------------------------------------------------------------------- reading rows


def _resolve_options(spec: DatasetSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(given) - set(spec.options))
    if unknown:
        valid = ", ".join(sorted(spec.options)) or "none"
        raise ConfigError(f"dataset '{spec.name}' has no option {', '.join(unknown)}; valid options: {valid}")
    return {**spec.options, **given}


def _read_rows(spec: DatasetSpec, path: str | None, revision: str | None, options: Mapping[str, Any]) -> list[Row]:
    if path is not None:
        if spec.hf_id is not None and not Path(path).expanduser().exists():
            raise ConfigError(f"dataset file not found: {path}; {export_hint(spec, Path(path).expanduser())}")
        return read_rows_file(path)
    if spec.generate is not None:
        if revision is not None:
            raise ConfigError(f"dataset '{spec.name}' is generated locally; it has no revision")
        return spec.generate(**options)
    if spec.packaged is not None and revision is None:
        rows = spec.packaged()
        if rows is not None:
            return rows
    return _read_hub_rows(spec, revision or spec.revision)


def read_rows_file(path: str | Path) -> list[Row]:
    """Raw rows of a local ``.jsonl`` (one JSON object per line), ``.parquet`` or ``.csv``
    file (GPQA is published as CSV)."""
    file = Path(path).expanduser()
    if file.is_dir():
        raise ConfigError(f"dataset.path is a directory, not a file: {file}; name one of its .jsonl, .parquet or .csv files")
    if not file.is_file():
        raise ConfigError(f"dataset file not found: {file}")
    suffix = file.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _read_jsonl(file)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(file).to_pylist()
    if suffix == ".csv":
        try:
            with file.open(encoding="utf-8", newline="") as handle:
                return list(csv.DictReader(handle))
        except UnicodeDecodeError:
            raise ConfigError(f"{file}: not UTF-8 text") from None
    raise ConfigError(f"unsupported dataset file type '{suffix}' ({file}); valid: .jsonl, .json, .parquet, .csv")


def _read_jsonl(file: Path) -> list[Row]:
    rows: list[Row] = []
    with file.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ConfigError(f"{file}:{line_number}: not UTF-8 text (byte {err.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{file}:{line_number}: not a JSON object ({err.msg})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{file}:{line_number}: not a JSON object (a {type(row).__name__})")
            rows.append(row)
    return rows


def _read_hub_rows(spec: DatasetSpec, revision: str | None) -> list[Row]:
    if not spec.configs:
        return _read_hub_config(spec, spec.config, revision)
    rows: list[Row] = []
    for config in spec.configs:  # the config names the subject; rows do not carry it themselves
        rows += [{"subject": config, **row} for row in _read_hub_config(spec, config, revision)]
    return rows


def _read_hub_config(spec: DatasetSpec, config: str | None, revision: str | None) -> list[Row]:
    import datasets

    where = f"{spec.hf_id}" + (f" ({config})" if config else "") + f" split {spec.split} @ {revision}"
    offline = hub_offline()
    if not offline:
        _check_hub_reachable(spec, where, revision)
    try:
        table = datasets.load_dataset(spec.hf_id, config, split=spec.split, revision=revision)
    except Exception as err:  # noqa: BLE001 - network, auth (gated sets) and missing-revision errors alike
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"cannot load dataset '{spec.name}' from the hub: {where}: {reason}; {hub_hint(offline)}") from None
    return [dict(row) for row in table]


_REACHED: set[tuple[str, str | None]] = set()  # hub datasets probed in this process (MMLU-Redux reads 57 configs)
LOCAL_COPY_HINT = "pass dataset.path=<a local .jsonl copy> (scripts/export_benchmarks.py writes them, online, once)"
HUB_PROBE_TIMEOUT_S = 10.0


def export_hint(spec: DatasetSpec, missing: Path) -> str:
    """How to make the local copy of a hub benchmark that `missing` should have been (data/export.py)."""
    return (f"make it once, online, with: python scripts/export_benchmarks.py --out {missing.parent} {spec.name} "
            f"(it prints the file it writes: pass that as dataset.path); or drop dataset.path to read '{spec.name}' from the hub")


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as the hub client reads it (1, true, yes, on)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_hint(offline: bool) -> str:
    """What to do about a dataset the hub did not give, for the environment at hand."""
    if offline:
        return f"HF_HUB_OFFLINE is set and the hub cache has no copy: run once with network to cache it, or {LOCAL_COPY_HINT}"
    return f"{LOCAL_COPY_HINT}, or, without network, set HF_HUB_OFFLINE=1 to read the copy an earlier online run cached"


def _check_hub_reachable(spec: DatasetSpec, where: str, revision: str | None) -> None:
    """One request with a short timeout before `datasets` starts its own (five retries with
    backoff, each warning logged twice under Hydra): offline, one error line at once."""
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if (str(spec.hf_id), revision) in _REACHED:
        return
    try:
        huggingface_hub.dataset_info(str(spec.hf_id), revision=revision, timeout=HUB_PROBE_TIMEOUT_S)
        _REACHED.add((str(spec.hf_id), revision))
    except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError):
        return  # reachable: `datasets` says what is wrong (a gated set needs a token), or reads the cache
    except Exception as err:  # noqa: BLE001 - no network, proxy, DNS: all the same to the user
        raise ConfigError(f"cannot load dataset '{spec.name}' from the hub: {where}: the hub is unreachable "
                          f"({type(err).__name__}); {hub_hint(False)}") from None


# --------------------------------------------------------------------------- records


def _to_record(spec: DatasetSpec, row: Row, index: int) -> Record:
    record_id = _record_id(row, spec, index)
    record = spec.normalize(row, record_id)
    missing = "no answer" if not record.answer.strip() else "no problem text" if not record.problem.strip() else None
    if missing:
        raise ConfigError(f"dataset '{spec.name}' record '{record.id}' has {missing}: {_fields_note(spec, row, record_id)}")
    return record


class _ReadFields(dict):
    """A row that notes which fields a normalizer looks up."""

    def __init__(self, row: Row) -> None:
        super().__init__(row)
        self.read: dict[str, None] = {}

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.setdefault(str(key), None)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.setdefault(str(key), None)
        return super().__getitem__(key)


def _fields_note(spec: DatasetSpec, row: Row, record_id: str) -> str:
    """The fields `spec`'s normalizer reads (found by running it once more on the row) against the
    fields the record has: what a hand-made file got wrong."""
    probe = _ReadFields(row)
    try:
        spec.normalize(probe, record_id)
    except Exception:  # noqa: BLE001 - only the fields looked up so far are wanted
        pass
    expected = [k for k in probe.read if k not in spec.id_fields] or ["?"]
    how = " ".join((spec.normalize.__doc__ or "").replace("``", "").split()).split(". ")[0].rstrip(".")
    return (f"'{spec.name}' reads the fields {', '.join(expected)}{f' ({how})' if how else ''}; "
            f"this record has {', '.join(map(str, row)) or 'none'}")


def _record_id(row: Row, spec: DatasetSpec, index: int) -> str:
    for key in spec.id_fields:
        value = row.get(key)
        if value is not None and str(value).strip():
            return str(value).strip()
    return f"{spec.name}-{index}"


def _unique(records: list[Record], dataset: str) -> list[Record]:
    seen: set[str] = set()
    for record in records:
        if record.id in seen:
            raise ConfigError(f"dataset '{dataset}' has two records with id '{record.id}'")
        seen.add(record.id)
    return records


def _select_ids(records: list[Record], ids: list[str], dataset: str) -> list[Record]:
    by_id = {record.id: record for record in records}
    wanted = list(dict.fromkeys(str(i) for i in ids))  # Hydra may hand over ints; drop repeats
    missing = [i for i in wanted if i not in by_id]
    if missing:
        examples = ", ".join(list(by_id)[:5])
        raise ConfigError(
            f"dataset '{dataset}' has no record with id {', '.join(missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''}; valid ids look like: {examples}"
        )
    return [by_id[i] for i in wanted]


def answer_text(value: Any) -> str:
    """A gold answer as text: integral floats lose their ".0" (27.0 -> "27"), strings are kept
    as written (so AIME's "025" stays "025"), None becomes ""."""
    if value is None:
        return ""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _rest(row: Row, *used: str) -> dict[str, Any]:
    """Every field not already turned into id/problem/answer, for the record's metadata."""
    return {key: value for key, value in row.items() if key not in used}


def _first_text(row: Row, *keys: str) -> str:
    for key in keys:
        value = row.get(key)
        if value is not None and str(value).strip():
            return str(value).strip()
    return ""


# --------------------------------------------------------------------------- normalizers


def normalize_math500(row: Row, record_id: str) -> Record:
    return Record(record_id, _first_text(row, "problem"), answer_text(row.get("answer")), _rest(row, "problem", "answer", "unique_id"))


def normalize_gsm8k(row: Row, record_id: str) -> Record:
    """Gold = the text after "####" without thousands commas; the worked answer is kept whole
    in ``metadata["solution"]``."""
    worked = str(row.get("answer") or "")
    _, marker, final = worked.rpartition("####")
    answer = final.strip().replace(",", "") if marker else ""
    metadata = {"solution": worked, **_rest(row, "question", "answer")}
    return Record(record_id, _first_text(row, "question"), answer, metadata)


def normalize_competition(row: Row, record_id: str) -> Record:
    """AIME/AMC style rows: ``problem`` (or ``question``) and a short ``answer``."""
    problem = _first_text(row, "problem", "question")
    return Record(record_id, problem, answer_text(row.get("answer")), _rest(row, "problem", "question", "answer", "id"))


def normalize_minerva(row: Row, record_id: str) -> Record:
    """Gold = the ``answer`` field, else the last \\boxed{} of the worked ``solution``."""
    answer = answer_text(row.get("answer")) or (last_boxed(str(row.get("solution") or "")) or "")
    problem = _first_text(row, "problem", "question")
    return Record(record_id, problem, answer, _rest(row, "problem", "question", "answer", "idx"))


def normalize_olympiadbench(row: Row, record_id: str) -> Record:
    """Gold = the ``final_answer`` list, without $...$, joined with ", " (the list as given is
    kept in metadata); a shared ``context`` paragraph is put before the question. The ``error``
    field (an absolute tolerance, or one per answer part: "0.1", "1e-3,0.2") becomes
    ``metadata["tolerance"]``, which grading honours; its ``answer_type`` becomes
    ``olympiadbench_answer_type``."""
    answers = _as_list(row.get("final_answer"))
    context = _first_text(row, "context")
    question = _first_text(row, "question", "problem")
    problem = f"{context}\n\n{question}" if context else question
    metadata = {k: v for k, v in _rest(row, "question", "id", "answer_type").items() if v is not None}
    # Its own answer_type ("Numerical", "Expression", ...) is kept apart: the grader's key says math.
    metadata.update(answer_type="math", olympiadbench_answer_type=row.get("answer_type"))
    tolerance = _tolerances(row.get("error"), record_id)
    if tolerance:
        metadata["tolerance"] = tolerance
    return Record(record_id, problem, ", ".join(answers), metadata)


def _tolerances(error: Any, record_id: str) -> list[float | None]:
    """OlympiadBench's ``error``: one tolerance for every answer part, or one per part separated
    by commas, where an empty entry means that part is exact. None or "" means no tolerance."""
    if error is None or isinstance(error, bool):
        return []
    if isinstance(error, (int, float)):
        return [float(error)]
    entries = [entry.strip() for entry in str(error).split(",")]
    if not any(entries):
        return []
    try:
        return [float(entry) if entry else None for entry in entries]
    except ValueError:
        raise ConfigError(f"olympiadbench record {record_id}: error {error!r} is not a tolerance "
                          "(a number, or numbers separated by commas)") from None


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):  # some mirrors store the list as a Python literal
            value = ast.literal_eval(text)
        else:
            return [text] if text else []
    return [_without_dollars(str(item)) for item in value if item is not None and str(item).strip()]


_MATH_DOLLARS = re.compile(r"(?<!\\)\$+")  # $ and $$ math delimiters, not an escaped \$


def _without_dollars(answer: str) -> str:
    """"$8\\pi$" -> "8\\pi", and a multi-part "$x=1$, $y=2$" -> "x=1, y=2": every unescaped
    dollar sign of an answer is a math delimiter."""
    return _MATH_DOLLARS.sub("", answer).strip()


GPQA_LETTERS = "ABCD"


def normalize_gpqa(row: Row, record_id: str) -> Record:
    """The four options in an order fixed by the record id, rendered as "A) ..." lines;
    gold = the letter of the correct one."""
    correct = _first_text(row, "Correct Answer")
    options = [correct] + [_first_text(row, f"Incorrect Answer {i}") for i in (1, 2, 3)]
    order = list(range(len(options)))
    random.Random(_stable_seed(f"gpqa/{record_id}")).shuffle(order)
    choices = [options[i] for i in order]
    letter = GPQA_LETTERS[order.index(0)] if correct else ""
    lines = "\n".join(f"{label}) {choice}" for label, choice in zip(GPQA_LETTERS, choices))
    problem = f"{_first_text(row, 'Question')}\n\n{lines}"
    metadata = {
        "choices": choices,
        "correct_choice": correct,
        "multiple_choice": True,
        "answer_type": "multiple_choice",
        "subdomain": row.get("Subdomain"),
        "domain": row.get("High-level domain"),
        "explanation": row.get("Explanation"),
    }
    return Record(record_id, problem, letter, metadata)


def _stable_seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def normalize_testbed(row: Row, record_id: str) -> Record:
    return Record(record_id, _first_text(row, "problem"), answer_text(row.get("answer")), dict(row.get("metadata") or {}))


def generate_testbed(split: str, n: int, seed: int) -> list[Row]:
    from rstitch.testbed import generate_problems  # lazy: the testbed is optional at import time

    return [problem.to_record() for problem in generate_problems(split, n, seed=seed)]


# --------------------------------------------------------------------------- registry

# Revisions are hub commits, so a re-upload upstream cannot silently change a benchmark;
# pass revision=... to load another one.
register_dataset(DatasetSpec(
    name="math500", normalize=normalize_math500,
    hf_id="HuggingFaceH4/MATH-500", split="test", revision="6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be",
    description="500 MATH test problems (PRM800K split)",
))
register_dataset(DatasetSpec(
    name="gsm8k", normalize=normalize_gsm8k,
    hf_id="openai/gsm8k", config="main", split="test", revision="740312add88f781978c0658806c59bc2815b9866",
    description="1319 grade-school word problems",
))
register_dataset(DatasetSpec(
    name="aime24", normalize=normalize_competition,
    hf_id="HuggingFaceH4/aime_2024", split="train", revision="2fe88a2f1091d5048c0f36abc874fb997b3dd99a",
    description="AIME 2024 I and II (30 problems)",
))
register_dataset(DatasetSpec(
    name="aime25", normalize=normalize_competition,
    hf_id="math-ai/aime25", split="test", revision="563bb8404243c5f09de6ec262f2db674fe5bce9b",
    description="AIME 2025 I and II (30 problems)",
))
register_dataset(DatasetSpec(
    name="amc23", normalize=normalize_competition,
    hf_id="math-ai/amc23", split="test", revision="80815d37005feb82cd7f8fbc6901d5d3eff43057",
    description="AMC 2023 (40 problems)",
))
register_dataset(DatasetSpec(
    name="minerva", normalize=normalize_minerva,
    hf_id="math-ai/minervamath", split="test", revision="ee46ddc498933b1977577953250ca5c66be64f96",
    description="Minerva quantitative reasoning (272 problems)",
), aliases=("minerva_math",))
register_dataset(DatasetSpec(
    name="olympiadbench", normalize=normalize_olympiadbench,
    hf_id="Hothan/OlympiadBench", config="OE_TO_maths_en_COMP", split="train",
    revision="91184b52131e7fc9455fef848035173aea8cc01a",
    description="OlympiadBench open-ended English maths, text only (674 problems)",
))
register_dataset(DatasetSpec(
    name="gpqa_diamond", normalize=normalize_gpqa,
    hf_id="Idavidrein/gpqa", config="gpqa_diamond", split="train", revision="633f5ee89ab8ad4522a9f850766b73f62147ffdd",
    id_fields=("Record ID",),
    description="GPQA diamond, 198 four-way multiple-choice questions (gated: needs a hub token)",
))
register_dataset(DatasetSpec(
    name="testbed", normalize=normalize_testbed, generate=generate_testbed,
    options={"split": "test", "n": 300, "seed": 0},
    description="synthetic arithmetic task of rstitch.testbed",
))

