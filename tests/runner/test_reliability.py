"""What a run promises on bad input: a grading failure stays on its sample, parameters outside
their range and prompts past a model's context are one error line, run identity does not depend
on where the code or the models live (docs/reliability.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstitch.cli.run import compose_config
from rstitch.errors import ConfigError
from rstitch.runner import run_config
from rstitch.testbed import ASSETS_DIR


def write_problems(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_config(tiny_pair: dict, problems: Path, root: Path, *overrides: str) -> dict:
    return compose_config([f"pair.slm.path={tiny_pair['slm']}", f"pair.llm.path={tiny_pair['llm']}", "pair.name=tiny",
                           "dataset=math500", f"dataset.path={problems}", "max_new_tokens=8", "logger=none",
                           f"results_root={root}", *overrides])


def samples_under(root: Path) -> list[dict]:
    [path] = root.rglob("samples.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------- grading failures


def test_a_grading_exception_is_recorded_on_its_sample_and_the_run_goes_on(tmp_path, tiny_pair, monkeypatch):
    from rstitch.grading import verify

    real_grade = verify._grade_found  # what grade_sample compares the extracted answer with

    def grade(found, gold, *args, **kwargs):
        if gold == "boom":
            raise RecursionError("maximum recursion depth exceeded")
        return real_grade(found, gold, *args, **kwargs)

    monkeypatch.setattr(verify, "_grade_found", grade)
    problems = write_problems(tmp_path / "p.jsonl", [{"id": "a", "problem": "1+1?", "answer": "boom"},
                                                     {"id": "b", "problem": "2+2?", "answer": "4"}])
    summary = run_config(tiny_config(tiny_pair, problems, tmp_path / "runs", "method=slm_only"))
    by_id = {s["id"]: s for s in samples_under(tmp_path / "runs")}
    assert set(by_id) == {"a", "b"}
    assert by_id["a"]["correct"] is False and by_id["a"]["grading_error"].startswith("RecursionError")
    assert "grading_error" not in by_id["b"]
    assert summary["grading_errors"] == 1 and summary["n_samples"] == 2


# --------------------------------------------------------------------------- parameters

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "method,params,needle",
    [
        ("rstitch", {"tau": NAN}, "method.tau of 'rstitch' must be a finite number"),
        ("rstitch", {"tau": INF}, "method.tau of 'rstitch' must be a finite number"),
        ("rstitch_plus", {"tau": NAN, "router": str(ASSETS_DIR / "rstitch_router")}, "method.tau of 'rstitch_plus' must be a finite number"),
        ("random", {"p": NAN}, "method.p of 'random' must be a finite number"),
        ("random", {"p": 1.5}, "method.p of 'random' must be in [0.0, 1.0]"),
        ("random", {"seed": 0.5}, "method.seed of 'random' must be an integer >= 0"),
        ("rsd", {"alpha": -1.0}, "method.alpha of 'rsd' must be >= 0.0"),
        ("specreason", {"threshold": NAN}, "method.threshold of 'specreason' must be a finite number"),
        ("easd", {"tau_o": INF}, "method.tau_o of 'easd' must be a finite number"),
        ("arbitrage_oracle", {"tau": NAN}, "method.tau of 'arbitrage_oracle' must be a number"),
    ],
)
def test_non_finite_or_out_of_range_parameters_are_one_line(method, params, needle):
    from rstitch.methods import build_method

    with pytest.raises(ConfigError) as err:
        build_method(method, **params)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("tau", [-1.0, 2.0])
def test_rstitch_keeps_its_documented_sentinels(tau):
    from rstitch.methods import build_method

    assert build_method("rstitch", tau=tau).tau == tau  # < 0: all LLM, >= 1: SLM only (docs/reliability.md)


@pytest.mark.parametrize(
    "options,needle",
    [
        ({"temperature": NAN}, "decoding.temperature must be a finite number >= 0"),
        ({"temperature": INF}, "decoding.temperature must be a finite number >= 0"),
        ({"top_p": NAN}, "decoding.top_p must be a number in (0, 1]"),
        ({"seed": 1.5}, "decoding.seed must be an integer"),
    ],
)
def test_decoding_parameters_are_finite_and_in_range(options, needle):
    from rstitch.engines import Sampler

    with pytest.raises(ConfigError, match=None) as err:
        Sampler(**options)
    assert needle in str(err.value)


def test_missing_engine_backend_is_one_line_before_any_model_loads(tiny_pair, monkeypatch):
    from rstitch import engines

    monkeypatch.setattr(engines.engine_class("vllm"), "backend", ("no_such_backend_pkg", "pip install -e '.[vllm]'"))
    with pytest.raises(ConfigError, match="engine 'vllm' needs the 'no_such_backend_pkg' package, which is not installed"):
        engines.load_pair({"path": tiny_pair["slm"]}, {"path": tiny_pair["llm"]}, engine="vllm")


# --------------------------------------------------------------------------- run identity


def _replace_prefix(node, old: str, new: str):
    if isinstance(node, dict):
        return {k: _replace_prefix(v, old, new) for k, v in node.items()}
    return new + node[len(old):] if isinstance(node, str) and node.startswith(old) else node


@pytest.mark.parametrize("method", ["rstitch", "rstitch_plus", "rsd"])
def test_the_same_config_from_two_clones_has_the_same_run_key(tmp_path, method):
    import shutil

    from rstitch.results.keys import run_key, run_tag

    here = compose_config([f"method={method}"])
    clone_assets = tmp_path / "elsewhere" / "rstitch" / "testbed" / "assets"
    shutil.copytree(ASSETS_DIR, clone_assets)
    there = _replace_prefix(here, str(ASSETS_DIR), str(clone_assets))
    assert there != here  # the configs do name different places
    assert run_key(there) == run_key(here) and run_tag(there) == run_tag(here)
    assert str(ASSETS_DIR) not in json.dumps(run_key(here)) and str(tmp_path) not in json.dumps(run_key(there))


def test_run_directory_names_are_short_and_flat():
    from rstitch.results.keys import run_tag

    tag = run_tag(compose_config(["method=rstitch_plus", "method.router=${testbed_asset:rstitch_router}/"]))
    assert "/" not in tag and len(tag) <= 120
    assert "router=rstitch_router" in tag  # a local path appears by its name
    assert run_tag(compose_config(["method=rstitch_plus"])) == tag  # a trailing slash does not matter


def test_a_local_dataset_file_is_keyed_by_name_and_content(tmp_path):
    from rstitch.results.keys import comparison_key

    rows = [{"id": "a", "problem": "1+1?", "answer": "2"}]
    one, two = tmp_path / "one" / "p.jsonl", tmp_path / "two" / "p.jsonl"
    for path in (one, two):
        path.parent.mkdir()
        write_problems(path, rows)
    key = lambda path: comparison_key(compose_config(["dataset=math500", f"dataset.path={path}"]))  # noqa: E731
    assert key(one) == key(two)
    write_problems(two, rows * 2)
    assert key(one) != key(two)


# --------------------------------------------------------------------------- context windows

# The tiny models have 2048 positions and a one-character-per-token tokenizer.
LONG_PROBLEM = "1+" * 1100


def overflow_problems(tmp_path: Path, long_problem: str = LONG_PROBLEM) -> Path:
    return write_problems(tmp_path / "p.jsonl", [{"id": "short", "problem": "1+1?", "answer": "2"},
                                                 {"id": "long", "problem": long_problem, "answer": "2"}])


def test_a_prompt_past_the_context_is_one_line_naming_the_problem(tmp_path, tiny_pair):
    cfg = tiny_config(tiny_pair, overflow_problems(tmp_path), tmp_path / "runs", "method=llm_only")
    with pytest.raises(ConfigError) as err:
        run_config(cfg)
    assert "problem 'long'" in str(err.value) and "2048-token context" in str(err.value)
    assert not list((tmp_path / "runs").rglob("samples.jsonl"))  # nothing decoded before the check


def test_skipped_overflows_are_counted_in_the_summary(tmp_path, tiny_pair):
    cfg = tiny_config(tiny_pair, overflow_problems(tmp_path), tmp_path / "runs", "method=llm_only", "on_overflow=skip")
    summary = run_config(cfg)
    assert [s["id"] for s in samples_under(tmp_path / "runs")] == ["short"]
    assert summary["skipped_context_overflow"] == 1 and summary["n_samples"] == 1


def test_truncate_cuts_the_budget_to_the_room_left(tmp_path, tiny_pair):
    fits_barely = "1+" * 1010  # about 2030 prompt tokens: room for a few of the 8 new tokens
    cfg = tiny_config(tiny_pair, overflow_problems(tmp_path, fits_barely), tmp_path / "runs", "method=llm_only",
                      "on_overflow=truncate", "max_new_tokens=40")
    run_config(cfg)
    by_id = {s["id"]: s for s in samples_under(tmp_path / "runs")}
    assert "max_new_tokens" not in by_id["short"]
    assert 1 <= by_id["long"]["max_new_tokens"] < 40 and by_id["long"]["tokens"] <= by_id["long"]["max_new_tokens"]


def test_a_huge_problem_fails_fast_without_tokenizing(tmp_path, tiny_pair):
    import time

    cfg = tiny_config(tiny_pair, overflow_problems(tmp_path, "x" * (10 << 20)), tmp_path / "runs", "method=llm_only")
    start = time.process_time()  # CPU time: the work done, whatever else the machine runs
    with pytest.raises(ConfigError, match="problem 'long': a prompt far longer"):
        run_config(cfg)
    assert time.process_time() - start < 30  # reading the file and loading the pair; tokenizing would take minutes


def test_unknown_overflow_policy_is_one_line(tmp_path, tiny_pair):
    cfg = tiny_config(tiny_pair, overflow_problems(tmp_path), tmp_path / "runs", "on_overflow=drop")
    with pytest.raises(ConfigError, match="on_overflow must be one of error, skip, truncate"):
        run_config(cfg)


# --------------------------------------------------------------------------- loading models


def test_pickled_weights_load_only_when_a_config_allows_them(tmp_path, tiny_pair):
    import shutil

    import torch
    from safetensors.torch import load_file

    from rstitch.engines.hf import HFModelRunner

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_pair["slm"], pickled)
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")  # the same weights, pickled
    (pickled / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="cannot load model"):
        HFModelRunner(str(pickled))
    assert HFModelRunner(str(pickled), use_safetensors=False).num_parameters > 0


def test_remote_code_is_off_unless_a_config_sets_it_and_then_warns(tiny_pair, caplog):
    import inspect

    from rstitch.engines.hf import HFModelRunner
    from rstitch.scorers.hf_prm import QwenMathPRM

    assert inspect.signature(QwenMathPRM).parameters["trust_remote_code"].default is False
    assert compose_config(["method=rsd", "prm=qwen2.5_math_prm_7b"])["method"]["prm"]["trust_remote_code"] is True
    with caplog.at_level("WARNING"):
        HFModelRunner(tiny_pair["slm"], revision="main")
    assert "trust_remote_code" not in caplog.text
    with caplog.at_level("WARNING"):
        HFModelRunner(tiny_pair["slm"], trust_remote_code=True)
    assert f"trust_remote_code is set for '{tiny_pair['slm']}'" in caplog.text


def test_home_relative_model_paths_are_expanded(tmp_path, tiny_pair, monkeypatch):
    import shutil

    from rstitch.engines import load_pair

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(tiny_pair["slm"], tmp_path / "slm")
    pair = load_pair({"path": "~/slm"}, {"path": tiny_pair["llm"]})
    assert pair.slm.path == str(tmp_path / "slm")


@pytest.mark.parametrize("path", ["./no/such/model", "no/such/model", "~/no_such_model", "models/"])
def test_a_path_that_does_not_exist_is_one_line_at_once(tiny_pair, path):
    import time

    from rstitch.engines import load_pair

    start = time.process_time()  # CPU time: no model is read, whatever else the machine runs
    with pytest.raises(ConfigError, match=f"model path not found: {path}"):
        load_pair({"path": path}, {"path": tiny_pair["llm"]})
    assert time.process_time() - start < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("offline", [True, False])
def test_an_unreachable_hub_model_is_one_line_naming_the_way_out(tmp_path, tiny_pair, problems_file, offline):
    import os
    import subprocess
    import sys
    import time

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update({"WANDB_MODE": "offline", "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9"})
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    cmd = [sys.executable, "-m", "rstitch.cli.run", f"results_root={tmp_path / 'runs'}", "logger=none", "pair.name=tiny",
           "pair.slm.path=nobody/no-such-model", f"pair.llm.path={tiny_pair['llm']}", "dataset=math500",
           f"dataset.path={problems_file}"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "nobody/no-such-model" in lines[0] and "local model directory" in lines[0]
    # The advice fits the environment: set HF_HUB_OFFLINE=1 only when it is not set already.
    assert ("HF_HUB_OFFLINE is set" in lines[0] and "set HF_HUB_OFFLINE=1" not in lines[0]) if offline else "HF_HUB_OFFLINE=1" in lines[0]
    assert time.monotonic() - start < 60
