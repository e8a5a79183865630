"""Datasets as ``Record`` lists: each one's identity is its conf/dataset/<name>.yaml ``source``
(docs/adding-a-dataset.md). A local JSONL/Parquet/CSV copy (``dataset.path=...``) goes through
the same normalizer as the hub's rows, so offline runs see identical records."""
from __future__ import annotations

import csv
import json
import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rstitch import hub
from rstitch.configs import CONF_DIR
from rstitch.errors import ConfigError
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
DEFAULT_ID_FIELDS = ("id", "unique_id", "idx")
FUNCTION_ROLES = ("normalizer", "generate", "packaged", "prepare", "select")
# The source keys that decide which records a dataset gives; the others (answer_type, description,
# fields) describe it for the docs, so editing them leaves saved runs loadable.
RECORD_KEYS = ("hub_id", "config", "configs", "split", "revision", "id_fields", "options", *FUNCTION_ROLES)
SOURCE_KEYS = (*RECORD_KEYS, "aliases", "answer_type", "description", "fields")


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset's ``source`` block with its functions looked up (``generate`` receives ``options``)."""

    name: str
    normalize: Normalizer
    hf_id: str | None = None
    config: str | None = None
    split: str | None = None
    revision: str | None = None
    id_fields: tuple[str, ...] = DEFAULT_ID_FIELDS
    generate: Callable[..., list[Row]] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    configs: tuple[str, ...] = ()  # several hub configs read in turn (MMLU-Redux: one per subject)
    packaged: Callable[[], list[Row] | None] | None = None  # an installed copy, read before the hub
    prepare: Callable[[list[Row]], list[Row]] | None = None  # on raw rows, before ids (e.g. add them)
    select: Callable[..., list[Record]] | None = None  # on records, with the dataset's options
    source: Mapping[str, Any] = field(default_factory=dict)  # the yaml's block as written


# Filled from the yamls when the registry is first read, by rstitch/data/normalizers.py.
DATASETS: Registry[DatasetSpec] = Registry("dataset", modules=("rstitch.data.normalizers",), replace=True)
get_dataset_spec = DATASETS.get_entry  # the spec registered as a name (or alias); ConfigError if there is none


def dataset_configs() -> list[Path]:
    """Every conf/dataset yaml with a ``source``: the ``dataset=`` choices, then those in
    subfolders (data a method is fitted on, never evaluated)."""
    folder = CONF_DIR / "dataset"
    return sorted(folder.glob("*.yaml")) + sorted(folder.glob("*/*.yaml"))


def register_configured(*functions: Callable[..., Any]) -> None:
    """Register the dataset of every conf/dataset yaml; each names its functions among ``functions``."""
    by_name = {function.__name__: function for function in functions}
    for path in dataset_configs():
        config = OmegaConf.to_container(OmegaConf.load(path))
        assert isinstance(config, dict), path
        source = config.get("source")
        if not isinstance(source, dict):
            raise ConfigError(f"{path}: no `source` block (docs/adding-a-dataset.md)")
        spec = _spec_from_source(str(config["name"]), source, by_name, path)
        DATASETS.register(spec.name, spec, tuple(source.get("aliases") or ()))


def _spec_from_source(name: str, source: dict[str, Any], functions: Mapping[str, Callable[..., Any]], path: Path) -> DatasetSpec:
    unknown = sorted(set(source) - set(SOURCE_KEYS))
    if unknown:
        raise ConfigError(f"{path}: source has no key {', '.join(unknown)}; valid: {', '.join(SOURCE_KEYS)}")
    named = {role: source[role] for role in FUNCTION_ROLES if source.get(role) is not None}
    missing = sorted(str(f) for f in named.values() if f not in functions)
    if missing or "normalizer" not in named:
        raise ConfigError(f"{path}: {'no source.normalizer' if not missing else 'unknown function ' + ', '.join(missing)}; "
                          f"the functions of rstitch/data/normalizers.py: {', '.join(sorted(functions))}")
    found = {role: functions[function] for role, function in named.items()}
    return DatasetSpec(
        name=name, normalize=found.pop("normalizer"), hf_id=source.get("hub_id"), config=source.get("config"),
        split=source.get("split"), revision=source.get("revision"), id_fields=tuple(source.get("id_fields", DEFAULT_ID_FIELDS)),
        options=dict(source.get("options") or {}), configs=tuple(source.get("configs") or ()), source=source, **found)


def load_dataset_records(name: str, path: str | None = None, limit: int | None = None, ids: list[str] | None = None,
                         shuffle_seed: int | None = None, revision: str | None = None, shard: int = 0, num_shards: int = 1,
                         source: Mapping[str, Any] | None = None, **options: Any) -> list[Record]:
    """Records of dataset ``name``, from the hub at its pinned revision or from ``path``: ``ids``
    (in that order), shuffled by ``shuffle_seed``, the first ``limit``, then every ``num_shards``-th
    from ``shard`` (strided, so shards mix easy and hard problems of a benchmark ordered by
    difficulty). ``options`` set to None keep their defaults; ``source`` is a run config's copy."""
    spec = get_dataset_spec(name)
    _check_source(spec, source)
    _check_selection(limit, shuffle_seed, shard, num_shards)
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
    if num_shards > max(1, len(records)):
        raise ConfigError(f"dataset.num_shards={num_shards} exceeds the {len(records)} records selected from '{spec.name}'")
    return records[shard::num_shards]


def _check_source(spec: DatasetSpec, source: Mapping[str, Any] | None) -> None:
    """A run config's copy of the source must still give the records the yaml gives: an override
    of it, or a config saved before the yaml changed, is one error line, not other records."""
    changed = [key for key in RECORD_KEYS if source is not None and source.get(key) != spec.source.get(key)]
    if changed:
        raise ConfigError(f"dataset.source.{changed[0]} of '{spec.name}' differs from conf/dataset/{spec.name}.yaml's; "
                          "the source is fixed by the dataset's name: pass +dataset.revision=<commit> for another "
                          "revision, or dataset.path= for a local copy")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_selection(limit: Any, shuffle_seed: Any, shard: Any, num_shards: Any) -> None:
    if limit is not None and (not _is_int(limit) or limit < 0):
        raise ConfigError(f"limit must be an integer >= 0 or None, got {limit!r}")
    if shuffle_seed is not None and not _is_int(shuffle_seed):
        raise ConfigError(f"shuffle_seed must be an integer or None, got {shuffle_seed!r}")
    if not _is_int(num_shards) or num_shards < 1:
        raise ConfigError(f"dataset.num_shards must be an integer >= 1, got {num_shards!r}")
    if not _is_int(shard) or not 0 <= shard < num_shards:
        raise ConfigError(f"dataset.shard must be an integer in [0, {num_shards - 1}] (dataset.num_shards={num_shards}), got {shard!r}")


def _resolve_options(spec: DatasetSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(given) - set(spec.options))
    if unknown:
        valid = ", ".join(sorted(spec.options)) or "none"
        raise ConfigError(f"dataset '{spec.name}' has no option {', '.join(unknown)}; valid options: {valid}")
    return {**spec.options, **given}


def _read_rows(spec: DatasetSpec, path: str | None, revision: str | None, options: Mapping[str, Any]) -> list[Row]:
    if path is not None:
        missing = Path(path).expanduser()
        if spec.hf_id is not None and not missing.exists():  # how to make the local copy it should have been
            raise ConfigError(f"dataset file not found: {path}; make it once, online, with: python scripts/export_benchmarks.py "
                              f"--out {missing.parent} {spec.name} (it prints the file it writes: pass that as dataset.path); "
                              f"or drop dataset.path to read '{spec.name}' from the hub")
        return read_rows_file(path)
    if spec.generate is not None:
        if revision is not None:
            raise ConfigError(f"dataset '{spec.name}' is generated locally; it has no revision")
        return spec.generate(**options)
    if spec.packaged is not None and revision is None:
        rows = spec.packaged()
        if rows is not None:
            return rows
    return read_hub_rows(spec, revision or spec.revision)


def read_rows_file(path: str | Path) -> list[Row]:
    """Raw rows of a local ``.jsonl`` (one JSON object per line), ``.parquet`` or ``.csv`` (GPQA's) file."""
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


def read_hub_rows(spec: DatasetSpec, revision: str | None) -> list[Row]:
    """The raw rows of ``spec`` on the hub at ``revision`` (each config in turn, if several)."""
    rows: list[Row] = []
    for config in spec.configs or (spec.config,):
        read = hub.read_dataset(spec.name, str(spec.hf_id), config, str(spec.split), revision)
        rows += [{"subject": config, **row} for row in read] if spec.configs else read  # rows do not carry their config
    return rows


def _to_record(spec: DatasetSpec, row: Row, index: int) -> Record:
    record_id = first_text(row, *spec.id_fields) or f"{spec.name}-{index}"
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


def first_text(row: Row, *keys: str) -> str:
    """The first of ``keys`` whose value in ``row`` is non-blank text, stripped; "" if none is."""
    for key in keys:
        value = row.get(key)
        if value is not None and str(value).strip():
            return str(value).strip()
    return ""


def _unique(records: list[Record], dataset: str) -> list[Record]:
    repeated = [record_id for record_id, count in Counter(record.id for record in records).items() if count > 1]
    if repeated:
        raise ConfigError(f"dataset '{dataset}' has two records with id '{repeated[0]}'")
    return records


def _select_ids(records: list[Record], ids: list[str], dataset: str) -> list[Record]:
    by_id = {record.id: record for record in records}
    wanted = list(dict.fromkeys(str(i) for i in ids))  # Hydra may hand over ints; drop repeats
    missing = [i for i in wanted if i not in by_id]
    if missing:
        raise ConfigError(f"dataset '{dataset}' has no record with id {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; "
                          f"valid ids look like: {', '.join(list(by_id)[:5])}")
    return [by_id[i] for i in wanted]
