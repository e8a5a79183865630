"""scripts/gpu_session.sh and its preflight (scripts/gpu_preflight.py) stop a GPU session in one
line naming what is wrong, before any section spends the session's time: a Python without the
session's packages, a package outside the project's range, no bundle, a bundle that does not
install, time limits that do not fit one command."""
from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import REPO

PREFLIGHT = REPO / "scripts" / "gpu_preflight.py"
SESSION = REPO / "scripts" / "gpu_session.sh"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python with nothing installed, as a machine that lacks every package."""
    root = tmp_path_factory.mktemp("bare")
    venv.create(root, with_pip=False)
    return str(root / "bin" / "python")


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUT")}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env={**clean, **env}, cwd=REPO)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_the_preflight_names_every_missing_package_in_one_line(bare_python):
    proc = run([bare_python, str(PREFLIGHT), "--device", "cuda"])
    line = one_line(proc.stdout + proc.stderr)
    assert proc.returncode == 2 and line.startswith("preflight: the GPU session cannot run: not installed: ")
    for name in ("packaging", "torch", "transformers", "tokenizers", "safetensors", "huggingface-hub", "hydra-core", "omegaconf",
                 "pandas", "numpy", "tqdm", "greenlet", "math-verify", "pyyaml", "pytest"):
        assert f" {name}," in line or f" {name} (" in line, name
    assert line.endswith("(carry them as wheels: scripts/gpu_session.sh prepare)")


def test_the_preflight_names_a_package_outside_the_projects_range(bare_python, tmp_path):
    """transformers older than pyproject's range (the GPU machine's own is): named with its version."""
    import packaging

    site = tmp_path / "site"
    site.mkdir()
    (site / "packaging").symlink_to(Path(packaging.__file__).parent)
    for name, version in (("packaging", packaging.__version__), ("transformers", "5.17.0")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / "transformers").mkdir()
    (site / "transformers" / "__init__.py").write_text('__version__ = "5.17.0"\n')
    proc = run([bare_python, str(PREFLIGHT)], PYTHONPATH=str(site))
    line = one_line(proc.stdout + proc.stderr)
    assert proc.returncode == 2
    assert "transformers 5.17.0 (needs " in line and ">=5.19" in line and "<5.25" in line
    assert "not installed: torch," in line and "packaging" not in line


@pytest.mark.slow  # imports torch, transformers and the session's modules (~10 s)
def test_the_preflight_passes_here_and_names_a_missing_bundle_path(tmp_path):
    proc = run([sys.executable, str(PREFLIGHT), "--device", "cpu"])
    assert proc.returncode == 0 and one_line(proc.stdout + proc.stderr).startswith("preflight: ok: torch ")
    proc = run([sys.executable, str(PREFLIGHT), "--device", "cpu", "--files", str(tmp_path / "tok")])
    assert proc.returncode == 2
    assert one_line(proc.stdout + proc.stderr) == f"preflight: the GPU session cannot run: {tmp_path / 'tok'} not found"


def test_a_session_without_a_bundle_stops_in_one_line(tmp_path):
    proc = run(["bash", str(SESSION), "run"], OUT=str(tmp_path / "out"), GPU_BUNDLE=str(tmp_path / "none"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert one_line(proc.stderr).startswith(f"gpu_session: no wheels in {tmp_path / 'none'}/whl: run 'bash scripts/gpu_session.sh prepare'")


def test_a_failed_install_stops_the_session(tmp_path):
    """`pip install --no-deps` of the bundle failing is fatal: nothing runs on a half-installed site."""
    (tmp_path / "whl").mkdir()
    (tmp_path / "whl" / "broken-1.0-py3-none-any.whl").write_text("not a wheel")
    proc = run(["bash", str(SESSION), "run"], OUT=str(tmp_path / "out"), GPU_BUNDLE=str(tmp_path), PYTHON=sys.executable)
    assert proc.returncode == 2 and "== preflight" not in proc.stdout
    assert one_line(proc.stderr).startswith("gpu_session: installing the bundled wheels failed (exit 1): ")


@pytest.mark.parametrize("env,sections,message", [
    ({"BENCH_S": "500"}, [], "the time limits of tests bench add up to 740 s, over SESSION_S=590 s"),
    ({"TESTS_S": "500"}, ["tests"], "the time limits of tests add up to 620 s, over SESSION_S=590 s"),
    ({}, ["bench", "lint"], "unknown section 'lint' (tests, bench)"),
])
def test_a_session_whose_limits_do_not_fit_one_command_does_not_start(tmp_path, env, sections, message):
    proc = run(["bash", str(SESSION), "run", *sections], OUT=str(tmp_path / "out"), **env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert message in one_line(proc.stderr)
