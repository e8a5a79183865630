"""What a new user meets first: latencies that say what they were measured under (and flag
contention), a fresh clone without benchmark files, reports over several roots, one error line
for a command that cannot run, notebooks on small or empty roots, one W&B run per run directory,
and hub messages that fit the environment."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rstitch.engines.base import default_torch_threads as default_threads
from rstitch.errors import ConfigError
from rstitch.results import measurement
from rstitch.results.measurement import contention, contention_notes, summarize_measurement

from conftest import REPO

# --------------------------------------------------------------------------- measurement


def test_contention_rule_on_given_numbers():
    # The README sweep beside another job: load 5.7 on 2 CPUs, the decode got a third of a core.
    reason = contention("cpu", cpus=2, threads=1, load_1m=5.7, cpu_per_wall=0.35)
    assert "load average 5.7 on 2 CPUs" in reason and "0.35 CPU-seconds per wall-clock second" in reason
    # One thread beside one other job on two cores: each has its core.
    assert contention("cpu", cpus=2, threads=1, load_1m=2.1, cpu_per_wall=0.97) is None
    # Torch's default threads on every core while another job runs.
    assert contention("cpu", cpus=2, threads=2, load_1m=3.2, cpu_per_wall=1.6) == "load average 3.2 on 2 CPUs"
    assert contention("cpu", cpus=2, threads=4, load_1m=None, cpu_per_wall=None) == "4 threads on 2 CPUs"
    # On a GPU the CPU waits on the device: CPU time per wall second says nothing there.
    assert contention("cuda:0", cpus=16, threads=1, load_1m=3.0, cpu_per_wall=0.1) is None


def test_default_threads_do_not_oversubscribe():
    assert default_threads("cpu", 1_757_392, cpus=16, torch_default=8) == 1  # the testbed: fastest on one thread
    assert default_threads("cpu", 1_500_000_000, cpus=2, torch_default=8) == 2  # capped at the CPUs this process may use
    assert default_threads("cpu", 1_500_000_000, cpus=16, torch_default=8) == 8
    assert default_threads("cuda", 7_000_000_000, cpus=16, torch_default=8) == 1


def sample(load: float, cpu_s: float, wall_s: float, threads: int = 1) -> dict:
    return {"measurement": {"threads": threads, "device": "cpu", "cpus": 2, "load_1m": load, "cpu_s": cpu_s,
                            "cpu_per_wall": cpu_s / wall_s}}


def test_summary_aggregates_the_samples_and_names_contention():
    quiet = summarize_measurement([sample(1.0, 0.95, 1.0), sample(1.2, 1.9, 2.0)])
    assert quiet["contention"] is None
    assert quiet["measurement"]["cpu_per_wall"] == pytest.approx(2.85 / 3.0)
    assert quiet["measurement"]["load_1m"] == pytest.approx(1.1) and quiet["measurement"]["contended_samples"] == 0
    busy = summarize_measurement([sample(1.0, 0.95, 1.0), sample(6.0, 0.5, 2.0)])
    assert busy["measurement"]["contended_samples"] == 1
    assert "CPU-seconds per wall-clock second" in busy["contention"]  # 1.45 of 3 wall seconds
    assert summarize_measurement([{"latency_s": 1.0}]) == {"measurement": None, "contention": None}  # older runs


def test_console_notes_flag_each_contended_run_and_say_what_to_do():
    runs = [{"method": "llm_only", "run_tag": "ab12", "contention": "load average 5.7 on 2 CPUs"},
            {"method": "rstitch", "run_tag": "tau=0.02_cd34", "contention": None}]
    notes = contention_notes(runs)
    assert notes[0] == "! llm_only ab12: latency measured under contention (load average 5.7 on 2 CPUs)"
    assert len(notes) == 2 and "engine.num_threads" in notes[1] and "quiet" in notes[1]
    assert contention_notes(runs[1:]) == []


def test_report_text_names_contended_runs():
    import pandas as pd

    from rstitch.analysis.report import contention_text

    runs = pd.DataFrame([{"method": "rstitch", "setting": "tau=0.02", "group": "testbed / testbed / budget 16",
                          "contention": "load average 5.7 on 2 CPUs"},
                         {"method": "llm_only", "setting": "", "group": "testbed / testbed / budget 16", "contention": None}])
    text = contention_text(runs)
    assert text.startswith("Latency measured under contention in 1 of 2 runs: rstitch tau=0.02")
    assert "engine.num_threads" in text
    assert contention_text(runs.iloc[1:]) == ""


@pytest.fixture(scope="module")
def testbed_root(tmp_path_factory) -> Path:
    """A results root with a finished llm_only and rstitch run of two testbed problems."""
    from rstitch.cli.run import compose_config
    from rstitch.runner import run_config

    root = tmp_path_factory.mktemp("testbed_root")
    for method in ("method=llm_only", "method=rstitch"):
        run_config(compose_config([method, f"results_root={root}", "logger=none", "dataset.limit=2", "max_new_tokens=16"]))
    return root


def test_every_sample_and_summary_records_its_measurement(testbed_root):
    [summary_file] = (testbed_root / "testbed" / "testbed" / "rstitch").rglob("summary.json")
    summary = json.loads(summary_file.read_text())
    # engine.num_threads null: one thread for the testbed on a CPU
    assert summary["measurement"]["threads"] == 1 and summary["measurement"]["device"] == "cpu"
    assert summary["measurement"]["samples"] == summary["n_samples"] == 2
    assert "contention" in summary and "latency_s" in summary and "speedup" in summary
    for line in (summary_file.parent / "samples.jsonl").read_text().splitlines():
        measured = json.loads(line)["measurement"]
        assert measured["threads"] == 1 and measured["cpus"] == measurement.available_cpus()
        assert measured["cpu_s"] > 0 and measured["cpu_per_wall"] > 0


# --------------------------------------------------------------------------- benchmarks in a fresh clone


def pytest_on_real_files(benchmarks: Path, require: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "RSTITCH_BENCHMARKS": str(benchmarks)}
    env.pop("RSTITCH_REQUIRE_BENCHMARKS", None)
    if require:
        env["RSTITCH_REQUIRE_BENCHMARKS"] = "1"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs", "tests/data/test_datasets.py",
               "-k", "test_real_files_load_completely_with_unique_ids_and_answers"]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_tests_on_real_records_skip_without_them_and_fail_where_required(tmp_path):
    skipped = pytest_on_real_files(tmp_path / "absent", require=False)
    assert skipped.returncode == 0 and skipped.stdout.count("SKIPPED [1]") == 5, skipped.stdout[-2000:]
    assert "scripts/export_benchmarks.py" in skipped.stdout and "RSTITCH_BENCHMARKS" in skipped.stdout
    required = pytest_on_real_files(tmp_path / "absent", require=True)
    assert required.returncode == 1 and required.stdout.count("\nFAILED ") == 5, required.stdout[-2000:]


def test_ci_requires_the_benchmark_records():
    assert "export RSTITCH_REQUIRE_BENCHMARKS=1" in (REPO / ".ci" / "run").read_text()


def test_export_writes_the_hub_rows_that_load_as_the_same_records(tmp_path, monkeypatch):
    from rstitch.data import datasets, export, load_dataset_records

    rows = [{"question": "Janet has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
            {"question": "What is 1,000 + 1?", "answer": "#### 1,001"}]
    asked = []
    monkeypatch.setattr(export, "read_hub_rows", lambda spec, revision: asked.append((spec.hf_id, revision)) or rows)
    provenance = export.export_dataset("gsm8k", tmp_path)
    assert asked == [("openai/gsm8k", datasets.get_dataset_spec("gsm8k").revision)]  # the pinned revision
    assert provenance["file"] == "gsm8k.jsonl" and provenance["records"] == 2
    records = load_dataset_records("gsm8k", path=str(tmp_path / "gsm8k.jsonl"))
    assert [r.answer for r in records] == ["7", "1001"]
    assert json.loads((tmp_path / export.PROVENANCE_FILE).read_text())["sha256"] == provenance["sha256"]
    assert export.export_file_name("minerva") == "minerva_math.jsonl"  # the name the tests read
    with pytest.raises(ConfigError, match="not read from the hub"):
        export.export_dataset("testbed", tmp_path)


# --------------------------------------------------------------------------- reports over several roots


def test_roots_sharing_a_run_count_it_once(testbed_root, tmp_path):
    from rstitch.analysis import load_runs
    from rstitch.analysis.collect import repeated_runs
    from rstitch.analysis.report import build_report

    copy = tmp_path / "copy"
    shutil.copytree(testbed_root, copy)
    runs = load_runs([testbed_root, copy])
    assert sorted(runs["method"]) == ["llm_only", "rstitch"]
    assert all(str(testbed_root) in d for d in runs["run_dir"])  # the first root given wins
    build_report(runs)  # pairs samples with the one llm_only run
    assert repeated_runs([testbed_root, copy]) == []  # a copy is the same run

    # The same run measured again elsewhere: still once, and listed as left out.
    [samples] = (copy / "testbed" / "testbed" / "llm_only").rglob("samples.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    samples.write_text("".join(json.dumps({**r, "latency_s": r["latency_s"] * 2}) + "\n" for r in rows))
    assert sorted(load_runs([testbed_root, copy])["method"]) == ["llm_only", "rstitch"]
    [(left_out, kept)] = repeated_runs([testbed_root, copy])
    assert left_out == samples.parent.resolve() and str(testbed_root.resolve()) in str(kept)


def test_a_baseline_clash_names_its_directories(testbed_root, tmp_path):
    from rstitch.analysis import load_runs, load_samples, paired_with_baseline

    copy = tmp_path / "other"
    shutil.copytree(testbed_root, copy)
    [key_file] = (copy / "testbed" / "testbed" / "llm_only").rglob("run_key.json")
    key_file.write_text(json.dumps({**json.loads(key_file.read_text()), "method_weights": {"changed": 1}}))
    samples = load_samples(load_runs([testbed_root, copy]))
    with pytest.raises(ConfigError) as err:
        paired_with_baseline(samples)
    assert str(key_file.parent.resolve()) in str(err.value) and "llm_only" in str(err.value)


@pytest.mark.slow
def test_report_over_two_roots_sharing_runs(testbed_root, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(testbed_root, copy)
    proc = subprocess.run([sys.executable, "-m", "rstitch.cli.report", str(testbed_root), str(copy), "-o", str(tmp_path / "r.md")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("2 runs")


# --------------------------------------------------------------------------- one error line


def rstitch_run(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", **(env or {})}
    command = [sys.executable, "-m", "rstitch.cli.run", *args]
    if not any(a.startswith("results_root=") for a in args):
        command.append(f"results_root={tmp_path / 'runs'}")
    return subprocess.run(command + ["logger=none"], capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=600)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("rstitch-run: error: ")
    return lines[0]


def no_run_directory(tmp_path: Path) -> bool:
    root = tmp_path / "runs"
    return not root.exists() or not any(root.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [
    (["pair.device=cuda", "dataset.limit=1"], "set pair.device=cpu"),
    (["-m", "hydra/launcher=slurm", "method.tau=0.01"], "hydra/launcher=local"),
    (["method.tau=0.01,0.02"], "add -m"),
    (["method.taux=0.1"], "unknown key 'method.taux'"),
    (["experiment=rstitch_testbed_tau"], "run it with -m"),
    (["dataset=math500", "dataset.path=."], "dataset.path is a directory"),
])
def test_command_that_cannot_run_is_one_line_and_leaves_no_run_directory(tmp_path, args, needle):
    if "pair.device=cuda" in args:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this torch has CUDA")
    system = "" if "hydra/launcher=slurm" in args else os.pathsep + "/usr/bin:/bin"  # a machine without Slurm's commands
    proc = rstitch_run(tmp_path, *args, env={"PATH": os.path.dirname(sys.executable) + system})
    assert needle in one_error_line(proc)
    assert no_run_directory(tmp_path)


@pytest.mark.slow
def test_results_root_no_directory_can_be_made_in(tmp_path):
    if not Path("/proc/self").exists():
        pytest.skip("needs /proc")
    assert "results_root '/proc/x' cannot be created" in one_error_line(rstitch_run(tmp_path, "results_root=/proc/x"))


def test_a_sweep_value_is_told_apart_from_lists_and_quoted_text():
    from rstitch.cli.preflight import check_sweep_needs_multirun, grid_points, parsed_overrides

    def is_sweep(value: str) -> bool:  # as Hydra reads `key=<value>`: a comma list or a sweep function
        return parsed_overrides([f"key={value}"])[0].is_sweep_override()

    assert is_sweep("0.01,0.02") and is_sweep("range(1,3)") and is_sweep("rstitch,llm_only")
    assert not is_sweep("[a,b]") and not is_sweep("'a,b'") and not is_sweep("0.01") and not is_sweep("{a: 1, b: 2}")
    assert grid_points({"method": "rstitch", "method.tau": "0.1,0.2,0.3", "max_new_tokens": "128,256"}) == 6
    assert grid_points(None) == 1
    assert grid_points({"method.tau": "range(1,4)"}) == 3  # Hydra's own grammar: a sweep function counts its values
    with pytest.raises(ConfigError, match=r"cannot parse the overrides method.tau=\[0.1: .*\[0.1"):
        check_sweep_needs_multirun(["method.tau=[0.1"], multirun=False)


# --------------------------------------------------------------------------- hub messages


@pytest.mark.slow
def test_offline_dataset_message_fits_the_environment(tmp_path):
    line = one_error_line(rstitch_run(tmp_path, "dataset=math500", "dataset.limit=1"))
    assert "HF_HUB_OFFLINE is set" in line and "set HF_HUB_OFFLINE=1" not in line and "dataset.path=" in line
    # Without HF_HUB_OFFLINE, a hub that cannot be reached: one probe, one line (no retries and their warnings).
    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_DATASETS_OFFLINE": "0"}
    line = one_error_line(rstitch_run(tmp_path, "dataset=math500", "dataset.limit=1", env=env))
    assert "the hub is unreachable" in line and "set HF_HUB_OFFLINE=1" in line and "dataset.path=" in line
    assert no_run_directory(tmp_path)


@pytest.mark.slow
def test_offline_model_message_does_not_advise_what_is_set(tmp_path):
    line = one_error_line(rstitch_run(tmp_path, "pair=l1_short_r1_7b", "pair.device=cpu", "pair.dtype=float32"))
    assert "HF_HUB_OFFLINE is set" in line and "set HF_HUB_OFFLINE=1" not in line


def test_unreachable_hub_is_one_probe_not_the_loaders_retries(monkeypatch):
    import datasets as hf_datasets
    import huggingface_hub
    from huggingface_hub import constants

    from rstitch.data import load_dataset_records

    probes = []

    def unreachable(repo_id, **kwargs):
        probes.append((repo_id, kwargs.get("timeout")))
        raise ConnectionError("no network")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "dataset_info", unreachable)
    monkeypatch.setattr(hf_datasets, "load_dataset", lambda *a, **k: pytest.fail("the loader would retry"))
    with pytest.raises(ConfigError) as err:
        load_dataset_records("math500", limit=1)
    assert probes == [("HuggingFaceH4/MATH-500", 10.0)]
    assert "dataset.path=" in str(err.value) and "\n" not in str(err.value)


def test_a_directory_as_dataset_path_says_so(tmp_path):
    from rstitch.data import load_dataset_records

    with pytest.raises(ConfigError, match="dataset.path is a directory"):
        load_dataset_records("math500", path=str(tmp_path))


# --------------------------------------------------------------------------- W&B and the sweep table


def offline_run_ids(root: Path) -> list[str]:
    return sorted(p.name.rsplit("-", 1)[1] for p in (root / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_sweep_logs_one_wandb_run_per_run_directory_and_lists_the_baseline(tmp_path):
    env = {"WANDB_MODE": "offline"}
    sweep = ["-m", "method.tau=0.01,0.02", "baseline=auto", "dataset.limit=1", "max_new_tokens=8", f"logger.dir={tmp_path}"]
    command = [sys.executable, "-m", "rstitch.cli.run", *sweep, f"results_root={tmp_path / 'runs'}", "logger=wandb"]
    first = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert not [line for line in first.stderr.splitlines() if line.startswith("wandb:")], first.stderr[-3000:]
    run_dirs = sorted(p.parent for p in (tmp_path / "runs").rglob("wandb_run.json"))
    assert len(run_dirs) == 3  # llm_only (once, although both points resume it) and the two rstitch runs
    logged = {json.loads((d / "wandb_run.json").read_text())["id"] for d in run_dirs}
    assert len(logged) == 3 and logged <= set(offline_run_ids(tmp_path))
    assert offline_run_ids(tmp_path).count(next(iter(logged))) == 1
    # The final sweep table (the default launcher) holds the llm_only row beside the two points.
    table = first.stdout.rsplit("  method", 1)[1].split("\nsweep: ")[0]
    assert table.count("\nllm_only") == 1 and table.count("\n rstitch") == 2, first.stdout[-3000:]

    again = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [i for i in offline_run_ids(tmp_path) if i in logged] == sorted(logged)  # no run logged twice


# --------------------------------------------------------------------------- notebooks


@pytest.mark.slow
@pytest.mark.parametrize("notebook", ["pareto.ipynb", "entropy.ipynb"])
def test_notebooks_run_on_one_run_without_a_baseline_and_on_an_empty_root(notebook, testbed_root, tmp_path, monkeypatch):
    from test_notebooks import outputs, run_notebook

    one = tmp_path / "one" / "testbed" / "testbed" / "rstitch"
    shutil.copytree(testbed_root / "testbed" / "testbed" / "rstitch", one)
    empty = tmp_path / "empty"
    empty.mkdir()
    kernel = _kernel(tmp_path, monkeypatch)
    _, text = outputs(run_notebook(notebook, tmp_path / "one", kernel, tmp_path / "out_one"))
    assert "rstitch" in text
    _, text = outputs(run_notebook(notebook, empty, kernel, tmp_path / "out_empty"))
    assert "Nothing to analyse" in text and "no finished runs" in text


def _kernel(tmp_path: Path, monkeypatch) -> str:
    """A kernelspec running ipykernel in this interpreter (as tests/project/test_notebooks.py registers one)."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "rstitch-first-use"
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "rstitch", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(spec_dir.parents[1]))
    return spec_dir.name


def test_executed_notebook_copies_are_ignored():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", "notebooks/pareto.nbconvert.ipynb"], cwd=REPO)
    assert proc.returncode == 0
