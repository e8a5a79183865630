"""A bad input to a command or script is one error line and exit status 2, never a traceback
(rstitch/errors.py `exit_on_config_error`)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rstitch.errors import ConfigError, exit_on_config_error

ROOT = Path(__file__).resolve().parents[2]
# Scripts that call nothing raising a ConfigError: tables regenerated from the repository's own
# files, the GPU machine's import check (its own one-line verdicts), and a benchmark of
# `rstitch-run` subprocesses (which print their own error lines).
NO_CONFIG_ERRORS = {"dataset_table.py", "reference_tables.py", "gpu_preflight.py", "bench_contention.py"}


def test_a_config_error_is_one_line_on_stderr_and_exit_2(capsys):
    @exit_on_config_error("tool")
    def main() -> None:
        raise ConfigError("model path not found: /nope")

    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2 and exit_info.value.__suppress_context__  # no chained traceback
    assert capsys.readouterr().err == "tool: error: model path not found: /nope\n"


def test_other_errors_pass_through():
    with pytest.raises(KeyError), exit_on_config_error("tool"):
        raise KeyError("a bug, with its traceback")


def handles_config_errors(path: Path) -> bool:
    """True when the script's `main` is decorated with exit_on_config_error."""
    tree = ast.parse(path.read_text())
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    return any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "exit_on_config_error" for d in main.decorator_list)


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "scripts").glob("*.py") if p.name not in NO_CONFIG_ERRORS), ids=lambda p: p.name)
def test_every_script_that_meets_config_errors_turns_config_errors_into_one_line(path):
    assert handles_config_errors(path), f"{path.name}: wrap main with @exit_on_config_error()"


@pytest.mark.parametrize("script", ["train_router.py", "train_arbitrage_router.py"])
def test_a_missing_model_is_one_line_from_the_training_scripts(script, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--slm", str(tmp_path / "nope"), "--llm", str(tmp_path / "nope"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"{script}: error: model path not found: {tmp_path / 'nope'}"
    assert "Traceback" not in proc.stderr
