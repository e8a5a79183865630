"""conf/dataset/*.yaml as the one statement of what each dataset is: the registry is read from
them, the docs table is made from them, and a run's key does not depend on them."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rstitch.data import DATASETS, load_dataset_records
from rstitch.data.datasets import _spec_from_source, dataset_configs
from rstitch.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
BENCHMARKS = ROOT.parent / "shared" / "benchmarks"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_yaml_is_a_registered_dataset_and_every_dataset_has_one():
    names = {path.stem for path in dataset_configs()}
    assert names == {spec.name for spec in DATASETS.values()}
    assert {"gsm8k", "testbed", "limo", "dapo_math"} <= names


@pytest.mark.parametrize("name", sorted({spec.name for spec in DATASETS.values()}))
def test_the_answer_type_in_the_yaml_is_the_one_its_records_carry(name):
    spec = DATASETS[name]
    files = [FIXTURES / f"{name}.jsonl", BENCHMARKS / f"{name}.jsonl", BENCHMARKS / f"{name}_math.jsonl"]
    found = [file for file in files if file.is_file()]
    if spec.generate is None and not found:
        pytest.skip(f"no local copy of {name}")
    records = load_dataset_records(name, path=str(found[0]) if found and spec.generate is None else None, limit=5)
    assert records and {r.metadata.get("answer_type", "math") for r in records} == {spec.source["answer_type"]}


def test_docs_table_is_the_one_generated_from_the_yamls():
    script = load_script("dataset_table")
    text = script.DOC.read_text(encoding="utf-8")
    assert script.with_table(text) == text, "run python scripts/dataset_table.py"
    assert "| gsm8k | openai/gsm8k main, test | 740312ad… | math |" in text


def test_a_yaml_with_an_unknown_key_or_function_is_one_error_naming_the_file():
    functions = {"normalize_gsm8k": lambda row, record_id: None}
    with pytest.raises(ConfigError, match=r"x\.yaml: source has no key revison; valid: hub_id"):
        _spec_from_source("x", {"normalizer": "normalize_gsm8k", "revison": "abc"}, functions, Path("x.yaml"))
    with pytest.raises(ConfigError, match=r"x\.yaml: unknown function normalize_gsm8;"):
        _spec_from_source("x", {"normalizer": "normalize_gsm8"}, functions, Path("x.yaml"))
    with pytest.raises(ConfigError, match=r"x\.yaml: no source.normalizer"):
        _spec_from_source("x", {"hub_id": "a/b"}, functions, Path("x.yaml"))


def test_the_run_key_leaves_the_source_out_and_an_overridden_source_is_refused():
    from rstitch.config_groups import compose_config
    from rstitch.results.keys import run_key

    cfg = compose_config(["logger=none", "dataset=aime25", f"dataset.path={FIXTURES / 'aime25.jsonl'}"])
    assert cfg["dataset"]["source"]["revision"] == DATASETS["aime25"].revision
    without = {**cfg, "dataset": {k: v for k, v in cfg["dataset"].items() if k != "source"}}
    assert run_key(cfg) == run_key(without)  # the keys runs had before the source was in the yaml
    sharded = {**cfg, "dataset": {**cfg["dataset"], "num_shards": 2}}
    assert "source" not in run_key(sharded)["dataset"]
    assert len(load_dataset_records(**cfg["dataset"])) == 3
    changed = {**cfg["dataset"], "source": {**cfg["dataset"]["source"], "revision": "0" * 40}}
    with pytest.raises(ConfigError, match=r"dataset.source.revision of 'aime25' differs from conf/dataset/aime25.yaml's"):
        load_dataset_records(**changed)
    described = {**cfg["dataset"], "source": {**cfg["dataset"]["source"], "description": "edited"}}
    assert len(load_dataset_records(**described)) == 3  # docs-only keys leave saved configs loadable
