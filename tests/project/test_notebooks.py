"""The notebooks run top to bottom, headless, on a small testbed sweep (`analysis_sweep`)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import test_analysis
from test_analysis import SWEEP_POINTS

pytestmark = pytest.mark.slow  # runs both notebooks in a kernel

analysis_sweep = test_analysis.analysis_sweep  # the sweep fixture, shared with test_analysis.py

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
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


def run_notebook(name: str, results: Path, kernel: str, out_dir: Path) -> nbformat.NotebookNode:
    """The command of docs/analysis.md, `jupyter nbconvert --to notebook --execute`, with the
    kernel of this interpreter and the output written to `out_dir`."""
    env = {**os.environ, "RSTITCH_RESULTS": str(results), "RSTITCH_MAX_SAMPLES": "2", "OMP_NUM_THREADS": "1"}
    env.pop("RSTITCH_WANDB_PROJECT", None)
    command = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", str(NOTEBOOKS / name),
               "--output-dir", str(out_dir), f"--ExecutePreprocessor.kernel_name={kernel}", "--ExecutePreprocessor.timeout=300"]
    proc = subprocess.run(command, cwd=NOTEBOOKS, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]  # a failing cell: its traceback
    return nbformat.read(out_dir / name, as_version=4)  # in another folder nbconvert keeps the name


def outputs(notebook: nbformat.NotebookNode) -> tuple[int, str]:
    """(PNG images shown, all text and HTML output)."""
    images, text = 0, []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            images += "image/png" in data
            text += [output.get("text", ""), data.get("text/plain", ""), data.get("text/markdown", ""), data.get("text/html", "")]
    return images, "\n".join(text)


def test_pareto_notebook(analysis_sweep, kernel_of_this_interpreter, tmp_path):
    results = tmp_path / "runs"
    shutil.copytree(analysis_sweep, results)
    for path in results.rglob("summary.json"):  # one run flagged, as a loaded machine records it; the others quiet
        summary = json.loads(path.read_text())
        flagged = summary["config"]["method"].get("tau") == 0.05
        path.write_text(json.dumps({**summary, "contention": "load 7.0 on 2 CPUs" if flagged else None}))
    notebook = run_notebook("pareto.ipynb", results, kernel_of_this_interpreter, tmp_path / "out")
    images, text = outputs(notebook)
    # One frontier, one speedup and one acceptance figure (one group), and a per-problem figure per method but llm_only.
    methods = {p[0] for p in SWEEP_POINTS} - {"method=llm_only"}
    assert images == 3 + len(methods)
    assert "on_frontier" in text and "speedup_at_top" in text
    # error bars' intervals beside each run; on a CPU the CPU-time speedup leads, as in the console table
    for column in ("accuracy_ci_low", "latency_ci_high", "speedup_cpu", "contention"):
        assert column in text, column
    # the speedup the console table leads with (results/summary.py): the latency model's estimate where the runs have one
    summaries = [json.loads(p.read_text()) for p in results.rglob("summary.json")]
    estimated = any(s.get("speedup_estimate") is not None for s in summaries)
    lead = ("**latency model's estimate** (`speedup_estimate`), then CPU time of the decodes (`speedup_cpu`)" if estimated
            else "**CPU time of the decodes** (`speedup_cpu`)")
    assert f"Speedups over `llm_only` below: {lead}, then wall clock (`speedup`)" in text
    assert "Latency measured under contention in 1 of" in text and "rstitch tau=0.05" in text and "load 7.0 on 2 CPUs" in text
    for table in ("Accuracy, latency and speedup", "Output tokens per problem", "Accuracy (%) per benchmark"):
        assert table in text


def test_entropy_notebook(analysis_sweep, kernel_of_this_interpreter, tmp_path):
    notebook = run_notebook("entropy.ipynb", analysis_sweep, kernel_of_this_interpreter, tmp_path)
    images, text = outputs(notebook)
    assert images == 2 + 1  # entropy of slm_only and llm_only traces; speedup vs consistency
    assert "mean_entropy" in text and "consistency" in text and "SLM" in text and "LLM" in text
    assert "Warning" not in text  # headless, without ipywidgets: no TqdmWarning from the libraries' tqdm.auto
