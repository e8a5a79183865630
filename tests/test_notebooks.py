"""The notebooks run top to bottom, headless, on a small testbed sweep (`analysis_sweep`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import test_analysis
from test_analysis import SWEEP_POINTS

pytestmark = pytest.mark.slow  # runs both notebooks in a kernel

analysis_sweep = test_analysis.analysis_sweep  # the sweep fixture, shared with test_analysis.py

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
KERNEL = "rstitch-test"


@pytest.fixture(scope="module")
def kernel_of_this_interpreter(tmp_path_factory, monkeypatch_module) -> str:
    """A kernelspec that runs ipykernel in the interpreter running the tests (not whichever
    `python3` kernel the machine has registered)."""
    spec_dir = tmp_path_factory.mktemp("jupyter") / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "rstitch tests", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch_module.setenv("JUPYTER_PATH", str(spec_dir.parents[1]))
    return KERNEL


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def run_notebook(name: str, results: Path, kernel: str, monkeypatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("RSTITCH_RESULTS", str(results))
    monkeypatch.setenv("RSTITCH_MAX_SAMPLES", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("RSTITCH_WANDB_PROJECT", raising=False)
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(notebook, kernel_name=kernel, timeout=300,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any failing cell
    return notebook


def outputs(notebook: nbformat.NotebookNode) -> tuple[int, str]:
    """(PNG images shown, all text and HTML output)."""
    images, text = 0, []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            images += "image/png" in data
            text += [output.get("text", ""), data.get("text/plain", ""), data.get("text/markdown", ""), data.get("text/html", "")]
    return images, "\n".join(text)


def test_pareto_notebook(analysis_sweep, kernel_of_this_interpreter, monkeypatch):
    notebook = run_notebook("pareto.ipynb", analysis_sweep, kernel_of_this_interpreter, monkeypatch)
    images, text = outputs(notebook)
    # One frontier and one acceptance figure (one group), and a per-problem figure per method but llm_only.
    methods = {p[0] for p in SWEEP_POINTS} - {"method=llm_only"}
    assert images == 2 + len(methods)
    assert "on_frontier" in text and "speedup_at_top" in text
    for table in ("Accuracy, latency and speedup", "Output tokens per problem", "Accuracy (%) per benchmark"):
        assert table in text


def test_entropy_notebook(analysis_sweep, kernel_of_this_interpreter, monkeypatch):
    notebook = run_notebook("entropy.ipynb", analysis_sweep, kernel_of_this_interpreter, monkeypatch)
    images, text = outputs(notebook)
    assert images == 2 + 1  # entropy of slm_only and llm_only traces; speedup vs consistency
    assert "mean_entropy" in text and "consistency" in text and "SLM" in text and "LLM" in text
