"""Write docs/datasets.md's table of datasets from conf/dataset/*.yaml (`--check`: only say whether
the committed table is the generated one). Run it after adding or changing a dataset's yaml."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rstitch.data import DATASETS, DatasetSpec

DOC = Path(__file__).resolve().parents[1] / "docs" / "datasets.md"
BEGIN = "<!-- dataset table: generated from conf/dataset by scripts/dataset_table.py -->"
END = "<!-- end of dataset table -->"


def where(spec: DatasetSpec) -> str:
    if spec.hf_id is None:
        return "generated here"
    config = f" {spec.config}" if spec.config else f" ({len(spec.configs)} configs)" if spec.configs else ""
    return f"{spec.hf_id}{config}, {spec.split}"


def row(spec: DatasetSpec) -> str:
    source = spec.source
    revision = "–" if spec.revision is None else spec.revision[:8] + ("…" if len(spec.revision) > 8 else "")
    names = " / ".join([spec.name, *source.get("aliases", ())])
    cells = [names, where(spec), revision, source.get("answer_type", ""), source.get("description", ""), source.get("fields", "–")]
    return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"


def table() -> str:
    specs = sorted({spec.name: spec for spec in DATASETS.values()}.values(), key=lambda s: s.name)
    lines = ["| name / aliases | hub id, config, split | revision | answer type | what | fields read |", "|---|---|---|---|---|---|"]
    return "\n".join([BEGIN, *lines, *map(row, specs), END])


def with_table(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + table() + text[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/datasets.md's table is not the generated one")
    args = parser.parse_args()
    text = DOC.read_text(encoding="utf-8")
    if args.check:
        same = with_table(text) == text
        print("docs/datasets.md: table is up to date" if same else "docs/datasets.md: table differs; run python scripts/dataset_table.py")
        return 0 if same else 1
    DOC.write_text(with_table(text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
