"""Write docs/reference.md's generated tables (each between `<!-- generated: NAME -->` and `<!-- end -->`)
from the code that defines them: the engine's `Capabilities`, the `Sequence` and `ModelRunner` calls
with their docstrings' first sentences, and the fields of samples.jsonl and summary.json
(rstitch/results/schema.py). `--check`: only say whether the doc is up to date. Run it after
changing any of them."""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_type_hints

from rstitch.engines.base import Capabilities, ModelRunner, Sequence
from rstitch.results.schema import Comparison, RunSummary, SampleRecord

DOC = Path(__file__).resolve().parents[1] / "docs" / "reference.md"
SECTION = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end -->)", re.S)


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |" for line in [header, *rows]]
    return "\n".join([lines[0], "|" + "---|" * len(header), *lines[1:]]) + "\n"


def first_sentence(doc: str | None) -> str:
    paragraph = " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())
    return re.split(r"(?<=\.)\s+(?=[A-Z`])", paragraph)[0]


def call(name: str, function: Callable[..., Any]) -> str:
    params = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    shown = [p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in params]
    return f"`{name}({', '.join(shown)})`"


def calls(cls: type) -> str:
    """The documented public instance methods `cls` defines, and the abstract ones a backend implements
    (the class hooks have their table in docs/adding-an-engine.md)."""
    rows = []
    for name, member in vars(cls).items():
        abstract = getattr(member, "__isabstractmethod__", False)
        if not inspect.isfunction(member) or not member.__doc__ or (name.startswith("_") and not abstract):
            continue
        rows.append((call(name, member), first_sentence(member.__doc__), "implements" if abstract else ""))
    return table(("call", "what", "a backend"), rows)


def capabilities() -> str:
    rows = [(f"`{f.name}`", str(f.default).lower(), Capabilities.DESCRIPTIONS[f.name]) for f in dataclasses.fields(Capabilities)]
    return table(("capability", "default", "an engine with it can"), rows)


def fields(names: list[str], hints: dict[str, Any]) -> str:
    """One row per described field, with the undescribed fields below it."""
    rows: list[tuple[list[str], str]] = []
    for name in names:
        description = getattr(hints[name], "__metadata__", None)
        if description:
            rows.append(([name], description[0]))
        else:
            rows[-1][0].append(name)
    return table(("field", "meaning"), [(", ".join(f"`{n}`" for n in group), text) for group, text in rows])


def sample_fields() -> str:
    return fields(list(SampleRecord.__annotations__), get_type_hints(SampleRecord, include_extras=True))


def summary_fields() -> str:
    hints = get_type_hints(RunSummary, include_extras=True)
    own = [name for name in hints if name not in Comparison.__annotations__]
    return fields([*own, *Comparison.__annotations__], hints)


GENERATORS: dict[str, Callable[[], str]] = {
    "capabilities": capabilities,
    "sequence": lambda: calls(Sequence),
    "model-runner": lambda: calls(ModelRunner),
    "samples": sample_fields,
    "summary": summary_fields,
}


def with_tables(text: str) -> str:
    """`text` with every generated section rewritten; an unknown section name is a KeyError."""
    return SECTION.sub(lambda m: m.group(1) + GENERATORS[m.group(2)]() + m.group(4), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/reference.md's tables are not the generated ones")
    args = parser.parse_args()
    text = DOC.read_text(encoding="utf-8")
    if args.check:
        same = with_tables(text) == text
        print("docs/reference.md: tables are up to date" if same else "docs/reference.md: tables differ; run python scripts/reference_tables.py")
        return 0 if same else 1
    DOC.write_text(with_tables(text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
