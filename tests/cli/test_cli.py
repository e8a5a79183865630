"""The `rstitch-run` command end to end, on tiny models and a local benchmark file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import build_model, build_tokenizer


def rstitch_run(tmp_path: Path, *overrides: str, check: bool = True, multirun: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    flags = ["-m"] if multirun else []
    logger = [] if any(o.startswith("logger=") for o in overrides) else ["logger=none"]
    cmd = [sys.executable, "-m", "rstitch.cli.run", *flags, f"results_root={tmp_path / 'runs'}", *logger, *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def pair_overrides(tiny_pair) -> list[str]:
    return [f"pair.slm.path={tiny_pair['slm']}", f"pair.llm.path={tiny_pair['llm']}", "pair.name=tiny", "max_new_tokens=12"]


def run_dirs(tmp_path: Path) -> list[Path]:
    return sorted(p.parent for p in (tmp_path / "runs").rglob("samples.jsonl"))


def read_samples(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_run_writes_samples_and_summary_and_resumes(tmp_path, tiny_pair, problems_file):
    base = [*pair_overrides(tiny_pair), "dataset=math500", f"dataset.path={problems_file}", "method=rstitch", "method.tau=0.3"]
    proc = rstitch_run(tmp_path, *base)
    assert "accuracy" in proc.stdout and "latency_s" in proc.stdout
    assert "FutureWarning" not in proc.stderr, proc.stderr[-3000:]  # e.g. a KV cache passed by a deprecated name
    [run_dir] = run_dirs(tmp_path)
    samples = read_samples(run_dir)
    assert [s["id"] for s in samples] == ["p1", "p2", "p3", "p4"]
    for s in samples:
        assert s["tokens"] == s["tokens_slm"] + s["tokens_llm"] == len(s["output_token_ids"]) <= 12
        assert s["latency_s"] > 0 and isinstance(s["correct"], bool)
        assert s["cost"]["slm"]["forward_calls"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["n_samples"] == 4 and 0 <= summary["accuracy"] <= 1
    assert summary["speedup"] is None  # no llm_only run yet, and the console says why and what to run
    note = proc.stdout.split("speedup -: ", 1)[1]
    assert note.startswith(f"no llm_only run under {tmp_path / 'runs' / 'tiny' / 'math500'} yet; make it with")
    baseline_command = note.splitlines()[1].split()
    assert baseline_command[:2] == ["rstitch-run", "method=llm_only"] and "method.tau=0.3" not in baseline_command

    # A kill mid-write leaves a cut line; the rerun repairs it and redoes only that sample.
    text = (run_dir / "samples.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "samples.jsonl").write_text("".join(text[:2]) + text[2][:25])
    rstitch_run(tmp_path, *base)
    again = read_samples(run_dir)
    assert [s["id"] for s in again] == ["p1", "p2", "p3", "p4"]
    assert again[:2] == samples[:2]
    assert again[2]["output_token_ids"] == samples[2]["output_token_ids"]  # same seed, same tokens

    # The printed command makes the LLM-only run of the same pair, data and budget: it gives the speedup.
    made = subprocess.run([sys.executable, "-m", "rstitch.cli.run", *baseline_command[1:]], capture_output=True, text=True,
                          env={**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}, cwd=tmp_path, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    proc = rstitch_run(tmp_path, *base)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["speedup"] is not None and summary["speedup"] > 0 and "speedup -:" not in proc.stdout


@pytest.mark.slow
def test_multirun_sweep_writes_one_dir_per_point(tmp_path, tiny_pair, problems_file):
    rstitch_run(tmp_path, *pair_overrides(tiny_pair), "dataset=math500", f"dataset.path={problems_file}",
                "dataset.limit=2", "method.tau=0.1,0.9", multirun=True)
    dirs = run_dirs(tmp_path)
    assert len(dirs) == 2 and {d.name.split("_")[0] for d in dirs} == {"tau=0.1", "tau=0.9"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["method=nope"], "unknown method 'nope'; valid:"),
        (["pair=nope"], "unknown pair 'nope'; valid:"),
        (["dataset=nope"], "unknown dataset 'nope'; valid:"),
        (["method.tau=abc"], "method.tau of 'rstitch' must be a finite number"),
        (["pair.llm.path=/nonexistent/model"], "model path not found: /nonexistent/model"),
    ],
)
def test_bad_input_is_one_error_line_and_no_results(tmp_path, tiny_pair, problems_file, overrides, needle):
    proc = rstitch_run(tmp_path, *pair_overrides(tiny_pair), "dataset=math500", f"dataset.path={problems_file}",
                       *overrides, check=False)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert run_dirs(tmp_path) == []
    # Not even the empty <pair>/<dataset>/<method> folders Hydra's run directory sat in.
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_tokenizer_mismatch_is_rejected(tmp_path, tiny_pair, problems_file):
    other_tok = build_tokenizer(tmp_path / "tok2", extra_chars="#@")
    other = build_model(tmp_path / "other", other_tok, layers=1, hidden=32, seed=5)
    proc = rstitch_run(tmp_path, *pair_overrides(tiny_pair), f"pair.slm.path={other}", "dataset=math500",
                       f"dataset.path={problems_file}", check=False)
    assert proc.returncode == 2 and "tokenizer mismatch" in proc.stderr
    assert run_dirs(tmp_path) == []


@pytest.mark.slow
def test_record_without_answer_is_rejected(tmp_path, tiny_pair):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n" + json.dumps({"problem": "2+2?"}) + "\n")
    proc = rstitch_run(tmp_path, *pair_overrides(tiny_pair), "dataset=math500", f"dataset.path={bad}", check=False)
    assert proc.returncode == 2 and "answer" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert run_dirs(tmp_path) == []


@pytest.mark.slow
def test_wandb_offline_run_holds_the_pareto_point(tmp_path, tiny_pair, problems_file):
    proc = rstitch_run(tmp_path, *pair_overrides(tiny_pair), "dataset=math500", f"dataset.path={problems_file}",
                       "dataset.limit=2", "logger=wandb")
    offline_runs = list((tmp_path / "runs" / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1, proc.stdout[-2000:]
    # W&B's run history and summary stay off the console (quiet), and our table comes last.
    assert "Run summary" not in proc.stdout + proc.stderr and "Run history" not in proc.stdout + proc.stderr
    lines = proc.stdout.rstrip().splitlines()
    assert lines[-1].startswith("results: ") and lines[0].split()[:4] == ["method", "tag", "n", "accuracy"]


@pytest.mark.slow
def test_wandb_runs_of_two_results_roots_are_two_and_a_resume_says_so(tmp_path, tiny_pair, problems_file):
    """The same run measured in two results roots (a quiet and a loaded sitting) must not merge when
    synced; a run resumed after an interrupt continues its W&B run and says so."""
    args = (*pair_overrides(tiny_pair), "dataset=math500", f"dataset.path={problems_file}", "dataset.limit=2", "logger=wandb")
    (tmp_path / "other").mkdir()
    rstitch_run(tmp_path, *args)
    rstitch_run(tmp_path / "other", *args)
    [first], [second] = run_dirs(tmp_path), run_dirs(tmp_path / "other")
    ids = [json.loads((d / "wandb_run.json").read_text())["id"] for d in (first, second)]
    assert first.relative_to(tmp_path) == second.relative_to(tmp_path / "other") and ids[0] != ids[1]

    # As if interrupted after its first sample: the second and the summary not written yet.
    samples = (first / "samples.jsonl").read_text().splitlines(keepends=True)
    (first / "samples.jsonl").write_text(samples[0])
    for name in ("summary.json", "wandb_run.json"):
        (first / name).unlink()
    resumed = rstitch_run(tmp_path, *args)
    assert f"rstitch-run: resuming W&B run {ids[0]}: 1 samples of {first} were decoded before" in resumed.stderr
    assert json.loads((first / "wandb_run.json").read_text())["id"] == ids[0]


def test_prm_group_feeds_the_prm_methods_and_their_run_key():
    from rstitch.cli.run import compose_config
    from rstitch.errors import ConfigError
    from rstitch.results.keys import run_tag

    rsd_default, rsd_oracle = compose_config(["method=rsd"]), compose_config(["method=rsd", "prm=oracle"])
    assert rsd_default["method"]["prm"]["name"] == "testbed" and rsd_oracle["method"]["prm"] == {"name": "oracle"}
    assert "prm" not in rsd_oracle and run_tag(rsd_default) != run_tag(rsd_oracle)
    rstitch = compose_config(["method=rstitch", "prm=oracle"])
    assert "prm" not in rstitch and "prm" not in rstitch["method"]
    with pytest.raises(ConfigError, match="unknown prm 'nope'; valid: "):  # a library call raises; rstitch-run prints it
        compose_config(["method=rsd", "prm=nope"])


def assert_one_error_line(proc: subprocess.CompletedProcess, needle: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(
    "content,needle",
    [
        (b'{"problem": "1+1?", "answer": "2"}\n{"problem": "caf\xe9", "answer": "3"}\n', "bad.jsonl:2: not UTF-8 text"),
        (b'{"problem": "1+1?", "answer": "2"}\n[1, 2]\n', "bad.jsonl:2: not a JSON object (a list)"),
        (b'"just a string"\n', "bad.jsonl:1: not a JSON object (a str)"),
    ],
)
def test_bad_dataset_file_is_one_error_line(tmp_path, tiny_pair, content, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    proc = rstitch_run(tmp_path, *pair_overrides(tiny_pair), "dataset=math500", f"dataset.path={bad}", check=False)
    assert_one_error_line(proc, needle)
    assert run_dirs(tmp_path) == [] and not any((tmp_path / "runs").rglob("run_key.json"))


@pytest.mark.slow
def test_unwritable_results_root_is_one_error_line(tmp_path, tiny_pair, problems_file):
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # works as root too, unlike a read-only directory
    proc = rstitch_run(tmp_path, *pair_overrides(tiny_pair), "dataset=math500", f"dataset.path={problems_file}",
                       f"results_root={blocker / 'runs'}", check=False)
    assert_one_error_line(proc, f"results_root '{blocker / 'runs'}' is not writable")


def interrupt_a_run(tmp_path: Path, tiny_pair, *overrides: str) -> tuple[subprocess.Popen, str]:
    """`rstitch-run` on 40 problems, sent SIGINT once its first sample is saved: the process and its stderr."""
    import signal
    import time

    # Enough problems that the run is still going when the interrupt lands, even on a slow poll.
    problems_file = tmp_path / "problems.jsonl"
    problems_file.write_text("".join(
        json.dumps({"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(40)))

    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "rstitch.cli.run", f"results_root={tmp_path / 'runs'}", "logger=none",
           *pair_overrides(tiny_pair)[:-1], "max_new_tokens=400", "dataset=math500", f"dataset.path={problems_file}", *overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    deadline = time.monotonic() + 300  # a hang guard: the loop ends as soon as a sample is saved
    while not any((tmp_path / "runs").rglob("samples.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    return proc, [line for line in stderr.splitlines() if line.strip()][-1]


@pytest.mark.slow
def test_ctrl_c_is_one_line_saying_what_is_saved_and_how_to_resume(tmp_path, tiny_pair):
    _, last = interrupt_a_run(tmp_path, tiny_pair)
    [run_dir] = run_dirs(tmp_path)
    saved = len(read_samples(run_dir))
    assert last == f"rstitch-run: interrupted: {saved} samples saved in {run_dir}; rerun the same command to resume"


@pytest.mark.slow
def test_ctrl_c_in_the_baseline_phase_names_the_baseline_directory(tmp_path, tiny_pair):
    """baseline=auto decodes llm_only first: an interrupt there names the llm_only run, where the
    samples are, and leaves no empty method directory behind."""
    _, last = interrupt_a_run(tmp_path, tiny_pair, "method=rstitch", "baseline=auto")
    [run_dir] = run_dirs(tmp_path)
    assert run_dir.parent.name == "llm_only"
    assert not (tmp_path / "runs" / "tiny" / "math500" / "rstitch").exists()
    saved = len(read_samples(run_dir))
    assert last == f"rstitch-run: interrupted: {saved} samples saved in {run_dir}; rerun the same command to resume"


def test_an_interrupt_whose_exception_was_dropped_still_stops_the_run_after_the_sample_in_flight(tmp_path):
    """Python drops a KeyboardInterrupt raised inside a finalizer; the flag the SIGINT handler also
    sets stops the run after the next saved sample, which stays saved for the resume."""
    import signal

    from rstitch import runner
    from rstitch.cli.run import compose_config, watch_interrupts

    cfg = compose_config(["dataset.limit=3", "max_new_tokens=8", "logger=none", f"results_root={tmp_path}"])
    watch_interrupts()
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert runner.INTERRUPT_REQUESTED.is_set()
        with pytest.raises(KeyboardInterrupt):
            runner.run(cfg, tmp_path / "run")
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        runner.INTERRUPT_REQUESTED.clear()
    assert len(read_samples(tmp_path / "run")) == 1


@pytest.mark.parametrize("override, key", [
    ("dataset.limit=6", "dataset.limit"), ("+method.k=3", "method.k"), ("++logger=none", "logger"),
    ("~method.tau", "method.tau"), ("prompt.system=a=b", "prompt.system"),
])
def test_override_key_names_the_setting(override: str, key: str) -> None:
    from rstitch.configs import override_key
    from rstitch.results.baseline import is_method_override

    assert override_key(override) == key
    assert is_method_override(override) == key.startswith("method.")


@pytest.mark.slow
def test_report_of_one_root_is_written_into_it_and_named_by_its_absolute_path(tmp_path):
    from rstitch.cli.run import compose_config
    from rstitch.runner import run_config

    root = tmp_path / "runs"
    run_config(compose_config(["method=llm_only", f"results_root={root}", "logger=none", "dataset.limit=2", "max_new_tokens=8"]))
    (tmp_path / "elsewhere").mkdir()
    proc = subprocess.run([sys.executable, "-m", "rstitch.cli.report", "../runs"], capture_output=True, text=True,
                          cwd=tmp_path / "elsewhere", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (root / "report.html").is_file() and not (tmp_path / "elsewhere" / "report.html").exists()
    assert f"report: {root / 'report.html'}" in proc.stdout.splitlines()


def test_a_report_written_in_the_repository_is_ignored_by_git():
    repo = Path(__file__).resolve().parents[2]
    for path in ("report.html", "report_files/frontier.png"):
        assert subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=repo).returncode == 0, path


# --------------------------------------------------------------------------- what the README tells a new user

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_table_row(group: str) -> str:
    [row] = [line for line in README.read_text().splitlines() if line.startswith(f"| `{group}` |")]
    return row


@pytest.mark.parametrize("group", ["dataset", "prompt", "logger", "engine"])
def test_the_readme_lists_every_choice_of_a_config_group(group):
    from rstitch.config_groups import group_choices

    row = readme_table_row(group)
    assert not [name for name in group_choices(group) if f"`{name}`" not in row], row


def test_the_readme_says_wandb_is_the_default_and_shows_the_hub_and_the_offline_forms():
    text = README.read_text()
    assert "`logger=wandb`" in text and "`logger=none` turns it off" in text
    commands = [line for line in text.splitlines() if line.startswith("rstitch-run ") and "dataset=gsm8k" in line]
    assert any("dataset.path" not in line for line in commands)  # the hub form, for a user with network
    assert any("dataset.path" in line for line in commands) and "python scripts/export_benchmarks.py --out" in text
    assert "a few minutes" not in text and "../shared/" not in text.split("## Benchmark files")[0]


def test_the_extras_pyproject_asks_of_installed_packages_exist():
    """`pip install` warns of an extra a package does not provide (math-verify[antlr4_9_3])."""
    from importlib.metadata import PackageNotFoundError, metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on

    project = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        try:
            provided = metadata(requirement.name).get_all("Provides-Extra") or []
        except PackageNotFoundError:
            continue
        missing = set(requirement.extras) - set(provided)  # as spelled: older pips compare names unnormalized
        assert not missing, f"{requirement.name} provides {sorted(map(canonicalize_name, provided))}, not {sorted(missing)}"
