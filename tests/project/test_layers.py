"""The layer contract (pyproject.toml [tool.importlinter]) and docs/architecture.md name the same
layers in the same order, and no function of rstitch/ or scripts/ is longer than 80 lines."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest needs tomli below 3.11, so it is installed
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 80


def contract_layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [{name.strip() for name in line.split("|")} for line in layers["layers"]]


def documented_layers() -> list[set[str]]:
    """The fenced block under '## Layers' in docs/architecture.md: one layer per line, siblings
    separated by `|`, each name the package or module below rstitch/."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Layers", 1)[1]
    block = section.split("```", 2)[1]
    rows = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()[1:]]
    return [{name.strip() for name in row.split("|")} for row in rows if row]


def test_the_documented_layers_are_the_contract_s():
    assert documented_layers() == contract_layers()


def test_the_contract_covers_every_package_and_module():
    named = set().union(*contract_layers())
    present = {p.stem if p.is_file() else p.name for p in (ROOT / "rstitch").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert present - {"conf"} == named


def long_functions(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_80_lines():
    paths = sorted([*(ROOT / "rstitch").rglob("*.py"), *(ROOT / "scripts").glob("*.py")])
    assert long_functions(paths) == []


def test_the_length_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def f():\n{body}\n")
    (tmp_path / "short.py").write_text(f"def g():\n{body[:-len(body.splitlines()[-1]) - 1]}\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert long_functions([tmp_path / "long.py", tmp_path / "short.py"]) == [f"long.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    finally:
        ROOT = saved
