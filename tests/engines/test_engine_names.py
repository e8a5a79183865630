"""Engines own what is theirs (docs/adding-an-engine.md): no code outside rstitch/engines/ names an
engine. What differs between engines is asked of the engine's class (engines.engine_class), so an
engine is added without touching the runner, the run keys, the judge or the scorers."""
from __future__ import annotations

import ast
import re

import pytest
import yaml

from rstitch.configs import CONF_DIR
from rstitch.engines import ENGINES, default_engine, engine_class, engines_with, judge_engine
from rstitch.results.keys import engine_key

from conftest import REPO

PACKAGE = REPO / "rstitch"


def engine_names() -> set[str]:
    """Every engine, from the registry and from the engine configs (the file and its `name`)."""
    configs = sorted((CONF_DIR / "engine").glob("*.yaml"))
    return set(ENGINES) | {c.stem for c in configs} | {yaml.safe_load(c.read_text())["name"] for c in configs}


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings (prose may say "the HF engine")."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def named_engines(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, literal) of each string literal, f-string parts included, that holds an engine name as a word."""
    tree = ast.parse(source)
    skip = docstrings(tree)
    word = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, sorted(names))) + r")(?![\w-])")
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and word.search(node.value)]


def test_the_engine_names_come_from_the_registry_and_the_configs():
    names = engine_names()
    assert {"hf", "llamacpp", "vllm"} <= names  # the check below would pass vacuously without them
    configs = sorted((CONF_DIR / "engine").glob("*.yaml"))
    assert set(ENGINES) == {c.stem for c in configs}
    assert all(yaml.safe_load(c.read_text())["name"] == c.stem for c in configs)  # the file's name is the engine's


def test_no_code_outside_the_engines_names_an_engine():
    names = engine_names()
    hits = [f"{path.relative_to(REPO)}:{line}: {text!r}"
            for path in sorted(PACKAGE.rglob("*.py")) if "engines" not in path.relative_to(PACKAGE).parts
            for line, text in named_engines(path.read_text(), names)]
    assert not hits, "engine names outside rstitch/engines/ (ask the engine's class instead):\n" + "\n".join(hits)


@pytest.mark.parametrize("source,found", [
    ('engine = "hf"', True),
    ('x = {"vllm": 1}', True),
    ('f"engine \'{e}\' is not llamacpp"', True),
    ('"""The HF engine: hf."""', False),  # a docstring
    ('x = "hf_prm"', False),
    ('x = "hf-graphs"', False),
])
def test_the_check_finds_a_name_in_any_literal_but_a_docstring(source, found):
    assert bool(named_engines(source, {"hf", "vllm", "llamacpp"})) == found


def test_a_judge_takes_the_runs_engine_when_it_gives_exact_distributions():
    exact = engines_with("exact_distributions")
    assert exact and exact[0] == default_engine()
    for name in ENGINES:
        expected = name if engine_class(name).capabilities.exact_distributions else exact[0]
        assert judge_engine(name) == expected


@pytest.mark.parametrize("engine,device,compile_setting,key", [
    ("hf", "cpu", "auto", None), ("hf", "cpu", "off", None), ("hf", "cpu", "static", "static"),
    ("hf", "cuda", "auto", "graphs"), ("hf", "cuda", False, None), ("hf", "cuda", True, "graphs"),
    ("hf", "cuda", "inductor", "inductor"),
    ("vllm", "cpu", None, None), ("vllm", "cuda", None, "graphs"),  # the key vLLM's GPU runs always had
    ("llamacpp", "cpu", None, None),
])
def test_the_engine_class_says_what_a_run_key_records_of_its_decode_path(engine, device, compile_setting, key):
    options = {"name": engine, "num_threads": None, **({} if compile_setting is None else {"compile": compile_setting})}
    recorded = engine_key(options, {"device": device})
    assert recorded == {**{k: v for k, v in options.items() if k != "compile"}, **({} if key is None else {"compile": key})}


def test_an_engine_config_without_a_name_is_keyed_as_the_default_engine():
    """Configs stored before engines were named: the key they had, the default engine's."""
    assert engine_key({"compile": "auto"}, {"device": "cuda"}) == {"compile": "graphs"}
    assert engine_key({"compile": "auto"}, {"device": "cpu"}) == {}


def test_only_the_engines_that_size_torch_threads_set_them():
    assert engine_class("hf").default_threads({"num_threads": None}, "cuda", 10**9, cpus=8) == 1
    assert engine_class("hf").default_threads({"num_threads": 4}, "cpu", 10**9, cpus=8) is None
    for name in set(ENGINES) - {"hf"}:
        assert engine_class(name).default_threads({"num_threads": None}, "cpu", 10**9, cpus=8) is None
