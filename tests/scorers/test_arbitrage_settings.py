"""Arbitrage router training's settings presets, as the training script parses them."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_arbitrage_router.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("train_arbitrage_router", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # defines functions only; main() runs under __main__
    yield module
    sys.modules.pop(spec.name, None)


def parsed(script, monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["train_arbitrage_router.py", *argv])
    return script.parse_args()


def test_paper_training_settings_are_the_papers(script, monkeypatch):
    """--settings paper: the router starts from the PRM's checkpoint, batch 1024, lr 1e-5, 3 epochs
    (Arbitrage section 4, Table C.1)."""
    args = parsed(script, monkeypatch, "--settings", "paper", "--prm", "skywork", "--prm-path", "Skywork/PRM-1.5B")
    assert (args.init, args.batch_size, args.lr, args.epochs) == ("Skywork/PRM-1.5B", 1024, 1e-5, 3)
    testbed_prm = parsed(script, monkeypatch, "--settings", "paper")  # the testbed PRM is its LLM's weights
    assert testbed_prm.init == testbed_prm.llm and testbed_prm.batch_size == 1024


def test_testbed_settings_are_the_default_and_flags_win(script, monkeypatch):
    args = parsed(script, monkeypatch)
    assert (args.settings, args.init, args.batch_size, args.lr, args.epochs) == ("testbed", None, 16, 5e-4, 4)
    mixed = parsed(script, monkeypatch, "--settings", "paper", "--lr", "3e-5", "--init", "/my/router-init")
    assert (mixed.init, mixed.batch_size, mixed.lr, mixed.epochs) == ("/my/router-init", 1024, 3e-5, 3)


def test_paper_settings_without_a_prm_checkpoint_is_one_error_line(script, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parsed(script, monkeypatch, "--settings", "paper", "--prm", "skywork")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "starts the router from the PRM's checkpoint: give --prm-path (or --init)" in err
