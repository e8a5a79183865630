"""Scale-out: shards and their merge, resume after a kill, the submitit launcher, shared baselines,
and the papers' grids as experiment presets."""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from rstitch.cli import merge
from rstitch.cli.run import CONF_DIR, compose_config
from rstitch.data import load_dataset_records
from rstitch.errors import ConfigError
from rstitch.results import SampleStore, load_summaries
from rstitch.results.keys import comparison_key, run_key, run_tag
from rstitch.runner import run_config

COMPARED_FIELDS = ("id", "sample_index", "output_token_ids", "token_sources", "answer", "correct", "tokens")


def write_problems(path: Path, n: int) -> Path:
    rows = [{"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_overrides(tiny_pair: dict, problems: Path, root: Path, budget: int = 12) -> list[str]:
    return [f"pair.slm.path={tiny_pair['slm']}", f"pair.llm.path={tiny_pair['llm']}", "pair.name=tiny",
            "dataset=math500", f"dataset.path={problems}", f"max_new_tokens={budget}", "logger=none",
            f"results_root={root}"]


def run_in_process(tiny_pair, problems, root, *overrides: str) -> dict:
    return run_config(compose_config([*tiny_overrides(tiny_pair, problems, root), *overrides]))


def cli_env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "rstitch.cli.run", *args], capture_output=True, text=True,
                          env=cli_env(), cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def samples_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def compared(samples: list[dict]) -> list[tuple]:
    return [tuple(json.dumps(s[f]) for f in COMPARED_FIELDS) for s in samples]


def run_dirs(root: Path, method: str) -> list[Path]:
    return sorted(p.parent for p in root.rglob("summary.json") if p.parent.parent.name == method)


# --------------------------------------------------------------------------- sharding


def test_shards_split_the_selection_deterministically_disjoint_and_covering():
    selection = [r.id for r in load_dataset_records("testbed", limit=10, shuffle_seed=3)]
    shards = [[r.id for r in load_dataset_records("testbed", limit=10, shuffle_seed=3, shard=i, num_shards=3)]
              for i in range(3)]
    assert [len(s) for s in shards] == [4, 3, 3]
    assert sorted(sum(shards, [])) == sorted(selection) and len(set(sum(shards, []))) == 10
    assert shards[1] == selection[1::3]  # strided: a benchmark ordered by difficulty spreads over the shards
    again = [r.id for r in load_dataset_records("testbed", limit=10, shuffle_seed=3, shard=1, num_shards=3)]
    assert again == shards[1]


@pytest.mark.parametrize("shard,num_shards,needle", [
    (3, 3, "dataset.shard must be an integer in [0, 2]"),
    (-1, 2, "dataset.shard must be an integer in [0, 1]"),
    (True, 2, "dataset.shard must be an integer"),
    (0, 0, "dataset.num_shards must be an integer >= 1"),
    (0, "2", "dataset.num_shards must be an integer >= 1"),
    (0, 11, "dataset.num_shards=11 exceeds the 10 records selected from 'testbed'"),
])
def test_bad_shard_values_are_one_line_errors(shard, num_shards, needle):
    with pytest.raises(ConfigError) as err:
        load_dataset_records("testbed", limit=10, shard=shard, num_shards=num_shards)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_bad_shard_fails_before_any_result_is_written(tmp_path, tiny_pair):
    problems = write_problems(tmp_path / "p.jsonl", 4)
    with pytest.raises(ConfigError, match=r"dataset.shard must be an integer in \[0, 1\]"):
        run_in_process(tiny_pair, problems, tmp_path / "runs", "dataset.shard=2", "dataset.num_shards=2")
    assert not (tmp_path / "runs").exists()


def test_unsharded_runs_keep_their_key_and_shards_get_their_own_dirs():
    whole = compose_config([])
    assert whole["dataset"]["num_shards"] == 1 and "num_shards" not in run_key(whole)["dataset"]
    legacy = {**whole, "dataset": {k: v for k, v in whole["dataset"].items() if k not in ("shard", "num_shards")}}
    assert run_tag(whole) == run_tag(legacy)  # run dirs written before sharding existed still resume
    tags = [run_tag(compose_config([f"dataset.shard={i}", "dataset.num_shards=2"])) for i in (0, 1)]
    assert tags[0].startswith("tau=0.02_shard=0of2_") and tags[1].startswith("tau=0.02_shard=1of2_")
    assert len({*tags, run_tag(whole)}) == 3


# --------------------------------------------------------------------------- merge


@pytest.fixture(scope="module")
def sharded(tiny_pair, tmp_path_factory):
    """Shards 0 and 1 of 2 of an R-Stitch run and of its LLM-only baseline, and the unsharded R-Stitch run."""
    base = tmp_path_factory.mktemp("sharded")
    problems = write_problems(base / "problems.jsonl", 5)
    for method in (["method=llm_only"], ["method=rstitch", "method.tau=0.3"]):
        for shard in (0, 1):
            run_in_process(tiny_pair, problems, base / "runs", *method, f"dataset.shard={shard}", "dataset.num_shards=2")
    whole = run_in_process(tiny_pair, problems, base / "whole", "method=rstitch", "method.tau=0.3")
    return {"base": base, "problems": problems, "whole": whole}


def whole_run_dir(sharded) -> Path:
    return sharded["base"] / "whole" / "tiny" / "math500" / "rstitch" / sharded["whole"]["run_tag"]


def copy_runs(sharded, tmp_path) -> Path:
    root = tmp_path / "runs"
    shutil.copytree(sharded["base"] / "runs", root)
    return root


def shard_dirs(root: Path, method: str = "rstitch") -> list[Path]:
    return [d for d in run_dirs(root, method) if "shard=" in d.name]


def merge_cli(capsys, *args) -> tuple[int, list[str], str]:
    try:
        merge.main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, [line for line in err.splitlines() if line.strip()], out


def test_merge_writes_the_run_an_unsharded_job_would_write(sharded, tmp_path, capsys):
    root = copy_runs(sharded, tmp_path)
    for point, baseline in zip(shard_dirs(root), shard_dirs(root, "llm_only")):  # each shard: its own speedup
        point, baseline = (json.loads((d / "summary.json").read_text()) for d in (point, baseline))
        assert point["speedup"] == pytest.approx(baseline["latency_s"] / point["latency_s"])
    code, errors, out = merge_cli(capsys, "--all", root)
    assert code == 0, errors
    [merged] = [d for d in run_dirs(root, "rstitch") if "shard=" not in d.name]
    whole = sharded["whole"]
    assert merged.name == whole["run_tag"]  # the directory an unsharded run of this config uses
    expected = samples_of(whole_run_dir(sharded))
    assert compared(samples_of(merged)) == compared(expected)  # all samples, none twice, in dataset order
    summary = json.loads((merged / "summary.json").read_text())
    for key in ("n_samples", "n_problems", "accuracy", "tokens", "tokens_slm", "tokens_llm", "switches"):
        assert summary[key] == whole[key], key
    assert summary["comparison_key"] == whole["comparison_key"] and len(summary["merged_from"]) == 2
    [llm_merged] = [d for d in run_dirs(root, "llm_only") if "shard=" not in d.name]
    llm = json.loads((llm_merged / "summary.json").read_text())
    assert summary["speedup"] == pytest.approx(llm["latency_s"] / summary["latency_s"])  # llm_only merged first
    assert "merged 2 shards, 5 samples" in out
    table = load_summaries(root)  # shard runs are parts of runs: only the merged ones are rows
    assert sorted(table["method"]) == ["llm_only", "rstitch"] and set(table["n_samples"]) == {5}
    assert merge_cli(capsys, "--all", root)[0] == 0  # merging again replaces the merge
    assert compared(samples_of(merged)) == compared(expected)


def drop_line(path: Path, index: int) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:index] + lines[index + 1:]))


@pytest.mark.parametrize("damage,needle", [
    ("other_config", "are not shards of one configuration (differ in: method.name, method.tau)"),
    ("missing_shard", "missing shard(s) 1 of 2"),
    ("shard_twice", "shard 0 of 2 given twice"),
    ("duplicated_sample", "is recorded twice"),
    ("missing_sample", "1 of 5 samples are missing from the shards, first 'p2' #0 of shard 0"),
    ("unfinished", "has not finished (no summary.json)"),
    ("not_a_shard", "is not a shard run"),
])
def test_merge_refuses_with_one_error_line(sharded, tmp_path, capsys, damage, needle):
    root = copy_runs(sharded, tmp_path)
    first, second = shard_dirs(root)
    args = [first, second]
    if damage == "other_config":
        args = [first, shard_dirs(root, "llm_only")[1]]
    elif damage == "missing_shard":
        args = [first]
    elif damage == "shard_twice":
        args = [first, first]
    elif damage == "duplicated_sample":
        with open(second / "samples.jsonl", "a") as f:
            f.write((first / "samples.jsonl").read_text().splitlines(keepends=True)[0])
    elif damage == "missing_sample":
        drop_line(first / "samples.jsonl", 1)  # shard 0 holds p0, p2, p4
    elif damage == "unfinished":
        (second / "summary.json").unlink()
    elif damage == "not_a_shard":
        args = [first, whole_run_dir(sharded)]
    code, errors, _ = merge_cli(capsys, *args)
    assert code == 2 and len(errors) == 1 and errors[0].startswith("rstitch-merge: error: "), errors
    assert needle in errors[0], errors[0]
    assert not [d for d in run_dirs(root, "rstitch") if "shard=" not in d.name]  # nothing written


def test_merge_does_not_overwrite_an_unsharded_run(sharded, tmp_path, capsys):
    root = copy_runs(sharded, tmp_path)
    whole_dir = whole_run_dir(sharded)
    shutil.copytree(whole_dir, root / "tiny" / "math500" / "rstitch" / whole_dir.name)
    code, errors, _ = merge_cli(capsys, *shard_dirs(root))
    assert code == 2 and "already holds an unsharded run" in errors[0]


def test_merge_without_a_merged_baseline_says_how_to_make_it(sharded, tmp_path, capsys):
    root = copy_runs(sharded, tmp_path)
    shards = shard_dirs(root)
    for i, d in enumerate(shards):  # the record Hydra writes beside a CLI run
        (d / ".hydra").mkdir()
        (d / ".hydra" / "overrides.yaml").write_text(
            f"- method=rstitch\n- method.tau=0.3\n- dataset.limit=5\n- dataset.shard={i}\n- dataset.num_shards=2\n")
    code, errors, out = merge_cli(capsys, *shards)  # the llm_only shards stay unmerged: no baseline run
    assert code == 0, errors
    assert "speedup -: no llm_only run under" in out
    assert "\n  rstitch-run method=llm_only dataset.limit=5\n" in out  # the unsharded baseline, shard overrides dropped
    assert out.rstrip().splitlines()[-1].startswith("merged 2 shards")
    code, _, out = merge_cli(capsys, "--all", root)  # with the baseline merged too: a speedup, no note
    assert code == 0 and "speedup -:" not in out


# --------------------------------------------------------------------------- resume after a kill


@pytest.mark.slow
def test_killed_run_resumes_without_losing_or_duplicating_samples(tmp_path, tiny_pair):
    problems = write_problems(tmp_path / "problems.jsonl", 12)
    args = [*tiny_overrides(tiny_pair, problems, tmp_path / "killed", budget=40), "method=random", "method.p=0.5",
            "decoding.temperature=0.8", "engine.num_threads=1"]  # both models, sampled: resume must redraw the same
    proc = subprocess.Popen([sys.executable, "-m", "rstitch.cli.run", *args], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, written = time.monotonic() + 300, 0
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            files = list((tmp_path / "killed").rglob("samples.jsonl"))
            written = files[0].read_bytes().count(b"\n") if files else 0
            if written >= 3:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait()
    assert 3 <= written < 12, f"the run was not killed mid-way ({written} samples written)"
    [run_dir] = [p.parent for p in (tmp_path / "killed").rglob("samples.jsonl")]
    assert not (run_dir / "summary.json").exists()

    run_cli(*args, cwd=tmp_path)  # resume
    uninterrupted = [a.replace(str(tmp_path / "killed"), str(tmp_path / "whole")) for a in args]
    run_config(compose_config([a for a in uninterrupted if not a.startswith("engine.")]))
    [whole_dir] = [p.parent for p in (tmp_path / "whole").rglob("samples.jsonl")]
    resumed, whole = samples_of(run_dir), samples_of(whole_dir)
    assert [s["id"] for s in resumed] == [f"p{i}" for i in range(12)]  # none lost, none twice
    assert compared(resumed) == compared(whole)
    assert json.loads((run_dir / "summary.json").read_text())["n_samples"] == 12


def test_a_corrupt_line_inside_samples_is_one_error_line(tmp_path):
    SampleStore(tmp_path, {"method": "a"}).append({"id": "p1", "sample_index": 0})
    with open(tmp_path / "samples.jsonl", "a") as f:
        f.write('{"id": "p2", "sam\n{"id": "p3", "sample_index": 0}\n')  # cut mid-line, then written on
    with pytest.raises(ConfigError, match=r"samples.jsonl:2: not a JSON sample"):
        SampleStore(tmp_path, {"method": "a"})


# --------------------------------------------------------------------------- launcher and baselines


@pytest.mark.slow
def test_two_point_sweep_through_submitit_local(tmp_path, tiny_pair):
    problems = write_problems(tmp_path / "problems.jsonl", 2)
    root = tmp_path / "runs"
    proc = run_cli("-m", "hydra/launcher=local", *tiny_overrides(tiny_pair, problems, root, budget=8),
                   "engine.num_threads=1", "method.tau=0.1,0.9", cwd=tmp_path)
    assert "Submitit 'local' sweep output dir" in proc.stderr + proc.stdout
    # The jobs' own output goes to .submitit/; the sweep's table is printed on the console, last.
    *_, sweep_line, note = proc.stdout.rstrip().splitlines()
    assert sweep_line == f"sweep: 2 runs under {root}" and note.startswith("speedup -: no llm_only run")
    assert "tau=0.1_" in proc.stdout and "tau=0.9_" in proc.stdout
    assert not (root / ".submitit" / "%j").exists()  # no directory named after the unformatted job id
    dirs = run_dirs(root, "rstitch")
    assert [d.name.split("_")[0] for d in dirs] == ["tau=0.1", "tau=0.9"]
    assert all(json.loads((d / "summary.json").read_text())["n_samples"] == 2 for d in dirs)
    assert len(list((root / ".submitit").rglob("*_result.pkl"))) == 2  # each point ran as a submitit job


def test_every_sweep_point_uses_the_one_shared_baseline(tmp_path, tiny_pair):
    problems = write_problems(tmp_path / "problems.jsonl", 3)
    root = tmp_path / "runs"
    baselines = {m: run_in_process(tiny_pair, problems, root, f"method={m}") for m in ("llm_only", "slm_only")}
    points = [run_in_process(tiny_pair, problems, root, "method=rstitch", f"method.tau={tau}") for tau in (0.1, 0.9)]
    points.append(run_in_process(tiny_pair, problems, root, "method=random", "method.p=0.5"))
    llm_dir = run_dirs(root, "llm_only")
    before = (llm_dir[0] / "samples.jsonl").read_bytes()
    again = run_in_process(tiny_pair, problems, root, "method=llm_only")  # a second grid asks for it again
    assert (llm_dir[0] / "samples.jsonl").read_bytes() == before and again["latency_s"] == baselines["llm_only"]["latency_s"]
    assert len(llm_dir) == 1 and len(run_dirs(root, "slm_only")) == 1
    for point in points:
        assert point["comparison_key"] == baselines["llm_only"]["comparison_key"]
        assert point["speedup"] == pytest.approx(baselines["llm_only"]["latency_s"] / point["latency_s"])
    assert baselines["slm_only"]["speedup"] == pytest.approx(baselines["llm_only"]["latency_s"] / baselines["slm_only"]["latency_s"])


def test_baseline_auto_runs_the_matching_baseline_first_and_reuses_it(tmp_path, tiny_pair):
    problems = write_problems(tmp_path / "problems.jsonl", 2)
    root = tmp_path / "runs"
    point = run_in_process(tiny_pair, problems, root, "method=rstitch", "method.tau=0.5", "baseline=auto")
    [llm_dir] = run_dirs(root, "llm_only")
    baseline = json.loads((llm_dir / "summary.json").read_text())
    assert baseline["comparison_key"] == point["comparison_key"] and baseline["n_samples"] == 2
    assert point["speedup"] == pytest.approx(baseline["latency_s"] / point["latency_s"])
    before = (llm_dir / "samples.jsonl").read_bytes()
    other = run_in_process(tiny_pair, problems, root, "method=random", "method.p=0.5", "baseline=auto")
    assert (llm_dir / "samples.jsonl").read_bytes() == before and other["speedup"] is not None  # reused, not decoded again
    assert run_dirs(root, "llm_only") == [llm_dir]


def test_baseline_is_no_part_of_the_run_key(tmp_path, tiny_pair):
    problems = write_problems(tmp_path / "problems.jsonl", 2)
    plain = compose_config(tiny_overrides(tiny_pair, problems, tmp_path))
    auto = compose_config([*tiny_overrides(tiny_pair, problems, tmp_path), "baseline=auto"])
    assert plain["baseline"] is None and auto["baseline"] == "auto"
    assert run_key(auto) == run_key(plain) and run_tag(auto) == run_tag(plain)
    with pytest.raises(ConfigError, match=r"^baseline must be null or auto, got 'yes'$"):
        run_config(compose_config([*tiny_overrides(tiny_pair, problems, tmp_path), "baseline=yes"]))


# --------------------------------------------------------------------------- experiment presets

PRESETS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
PAPER_PRESETS = [p for p in PRESETS if "_paper" in p]
FIDELITY = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"
CITATION_SECTION = "## Presets: every value and its citation"
# Where the paper gives a value, its row cites a numbered section, table, figure, algorithm, equation or
# appendix (tests/project/test_fidelity.py checks the number and finds the quote in the paper's text); where it
# does not, the row says so and what we chose.
CITATION_WORDS = ("§", "Table", "Figure", "Algorithm", "eq.", "appendix", "Definition")
# Grids without a testbed twin: the testbed has no code or cross-domain task, and one pair (the 7B and
# Figure 4 grids' twins stand for the 72B and Figure 5 grids; rstitch_paper's for the same-family pairs).
NO_TWIN = {"rstitch_paper_code", "rstitch_paper_code_tau", "rstitch_paper_cross", "rsd_paper_72b", "rsd_paper_72b_sd",
           "rsd_paper_72b_delta", "rsd_paper_72b_baselines", "arbitrage_paper_latency", "arbitrage_paper_latency_tau",
           "arbitrage_paper_latency_rsd", "rstitch_paper_family"}
GROUPS = ("pair", "dataset", "prompt", "method")


def citation_rows() -> list[dict]:
    """The rows of docs/fidelity.md's preset citation table."""
    text = FIDELITY.read_text().split(CITATION_SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("presets", "---"):
            continue
        presets, key, value, citation = cells
        rows.append({"presets": [p.strip() for p in presets.split(",")], "key": key.strip("`"),
                     "values": [v.strip() for v in value.strip("`").split(",")], "citation": citation})
    return rows


def normalized(values) -> list[str]:
    """Values as comparable strings: numbers by value (8192 == 8192.0), "\\n" escapes as newlines."""
    out = []
    for v in values:
        text = str(v)
        try:
            out.append(repr(float(text)))
        except ValueError:
            out.append(text.encode().decode("unicode_escape") if "\\" in text else text)
    return sorted(out)


def dotted(cfg: dict, key: str):
    node: object = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if key in GROUPS and isinstance(node, dict):
        return node["name"]
    return node


def preset_values(preset: str, key: str) -> list:
    """The values `preset` gives `key`: a sweep axis's values, or the composed value (a `method.*`
    key at every method of the grid that has it; they must agree)."""
    params = sweep_params(preset)
    if key in params:
        return params[key]
    methods = params.get("method", [None])
    found = []
    for method in methods:
        cfg = first_point(preset) if method is None else first_point(preset, method=method)
        value = dotted(cfg, key)
        if value is not None:
            found.append(value)
    assert found, f"{preset} sets no {key}"
    assert all(v == found[0] for v in found), (preset, key, found)
    return [found[0]]


def test_citation_table_is_parsed_and_names_only_paper_presets():
    rows = citation_rows()
    assert len(rows) > 50
    named = {p for row in rows for p in row["presets"]}
    assert named == set(PAPER_PRESETS), named ^ set(PAPER_PRESETS)


@pytest.mark.parametrize("row", citation_rows(), ids=lambda r: f"{r['presets'][0]}:{r['key']}")
def test_each_preset_value_is_the_one_its_citation_gives(row):
    citation = row["citation"]
    assert citation.startswith("not stated") and "ours" in citation or any(w in citation for w in CITATION_WORDS), citation
    for preset in row["presets"]:
        expected = [v.replace("<pair>", first_point(preset)["pair"]["name"]) for v in row["values"]]
        assert normalized(preset_values(preset, row["key"])) == normalized(expected), (preset, row["key"])


def preset_file_keys(preset: str) -> set[str]:
    """The keys a preset's own file sets (its sweep axes and values), dotted."""
    import yaml

    data = yaml.safe_load((CONF_DIR / "experiment" / f"{preset}.yaml").read_text()) or {}
    keys = set(data.get("hydra", {}).get("sweeper", {}).get("params") or {})

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict) and k != "router":
                walk(v, f"{prefix}{k}.")
            else:
                keys.add(f"{prefix}{k}")
    walk({k: v for k, v in data.items() if k not in ("defaults", "hydra")}, "")
    return keys


@pytest.mark.parametrize("preset", PAPER_PRESETS)
def test_every_value_a_paper_preset_sets_has_a_cited_row(preset):
    """Every sweep axis and set value of a paper preset, and its pair, benchmarks, budget, prompt and
    decoding temperature, have a row in docs/fidelity.md (so none is a silent choice)."""
    covered = {"method.router" if row["key"].startswith("method.router") else row["key"]
               for row in citation_rows() if preset in row["presets"]}
    required = set(sweep_params(preset)) | preset_file_keys(preset) | {"pair", "dataset", "max_new_tokens", "prompt",
                                                                        "decoding.temperature"}
    required = {"method.router" if k.startswith("method.router") else k for k in required}
    assert required <= covered, sorted(required - covered)


@functools.cache  # composing is the slow part of these tests; nothing mutates the results
def sweep_params(preset: str) -> dict[str, list]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}"], return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.params else {}
    parser = OverridesParser.create()
    parsed = {}
    for key, value in params.items():
        override = parser.parse_override(f"{key}={value}")
        parsed[key] = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
    return parsed


@functools.cache
def first_point(preset: str, **choose) -> dict:
    """The config of one job of the preset's grid (the first value of each axis unless chosen)."""
    axes = {**{k: v[0] for k, v in sweep_params(preset).items()}, **choose}
    return compose_config([f"experiment={preset}", *(f"{k}={v}" for k, v in axes.items())])


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes(preset):
    cfg = compose_config([f"experiment={preset}"])
    # Greedy as in R-Stitch, RSD, EASD, Arbitrage; SpecReason samples at 0.6 (16 samples per problem).
    assert cfg["decoding"]["temperature"] == (0.6 if preset.startswith("specreason_paper") else 0.0)
    for key, values in sweep_params(preset).items():
        group = key if (CONF_DIR / key).is_dir() else None
        if group:  # every grid value names a config of its group
            assert all((CONF_DIR / group / f"{v}.yaml").is_file() for v in values), (key, values)


TWINNED = [p for p in PAPER_PRESETS if p not in NO_TWIN]


@pytest.mark.parametrize("grid", TWINNED)
def test_testbed_twins_run_their_paper_grids_methods_on_the_testbed(grid):
    params, twin_params = sweep_params(grid), sweep_params(grid.replace("_paper", "_testbed"))
    assert {k: v for k, v in twin_params.items() if k.startswith("method")} == \
        {k: v for k, v in params.items() if k.startswith("method")}
    for key in ("method.k", "method.model", "method.tau_h"):  # a grid's fixed method settings too (N stays small)
        if key in preset_file_keys(grid):
            assert preset_values(grid.replace("_paper", "_testbed"), key) == preset_values(grid, key), key
    twin_cfg = first_point(grid.replace("_paper", "_testbed"))
    assert (twin_cfg["pair"]["name"], twin_cfg["dataset"]["name"], twin_cfg["logger"]["_target_"]) == \
        ("testbed", "testbed", "rstitch.logging.NullLogger")
    budgets = twin_params.get("max_new_tokens", [twin_cfg["max_new_tokens"]])
    assert len(budgets) == len(params.get("max_new_tokens", [None]))  # one testbed budget per paper budget


def base_of(grid: str) -> str:
    """The preset whose LLM-only runs are `grid`'s baselines."""
    return grid if "llm_only" in sweep_params(grid).get("method", []) else grid.rsplit("_", 1)[0]


@pytest.mark.parametrize("grid", sorted(g for g in PAPER_PRESETS if base_of(g) != g))
def test_a_grid_and_its_baselines_share_the_comparison_key(grid):
    """The LLM-only run of the paper's base preset is the baseline of every point of its grids."""
    for name in [grid] + ([grid.replace("_paper", "_testbed")] if grid in TWINNED else []):
        base = base_of(name)
        point = first_point(name)
        shared = {k: v[0] for k, v in sweep_params(name).items() if not k.startswith("method")}
        baseline = first_point(base, method="llm_only", **shared)
        assert baseline["method"] == {"name": "llm_only"}
        assert comparison_key(point) == comparison_key(baseline), name


def test_testbed_twins_share_one_baseline_at_the_shared_budget():
    papers = {p.split("_paper")[0] for p in PAPER_PRESETS}
    keys = {comparison_key(first_point(f"{paper}_testbed", method="llm_only", max_new_tokens=256)) == comparison_key(
        first_point("testbed_twin", method="llm_only")) for paper in papers}
    assert keys == {True}


def test_rstitch_plus_grid_reads_one_router_per_pair_at_the_papers_tau():
    for pair in sweep_params("rstitch_paper_plus")["pair"]:
        method = first_point("rstitch_paper_plus", pair=pair)["method"]
        assert (method["tau"], method["router"]) == (0.001, f"routers/rstitch_plus/{pair}")
    assert first_point("rstitch_testbed_plus")["method"]["tau"] == 0.001


def test_easd_fixed_grid_uses_the_papers_thresholds():
    for preset in ("easd_paper_fixed", "easd_testbed_fixed"):
        method = first_point(preset)["method"]
        assert (method["tau_h"], method["tau_o"], method["top_n"]) == (2.0, 0.8, 5)


def test_arbitrage_paper_grid_requires_a_router_for_the_pair():
    from rstitch.methods import build_method

    method = build_method(**first_point("arbitrage_paper_tau")["method"])
    with pytest.raises(ConfigError, match="router not found at /set-method.router.path/to-a-router-trained-for-this-pair; train it"):
        method.router()
    given = first_point("arbitrage_paper_tau", **{"method.router.path": "/r"})
    assert given["method"]["router"]["path"] == "/r"


# --------------------------------------------------------------------------- sweeps: every point, own runs, speedups


def test_sweep_points_are_hydras_expansion_of_the_command_and_the_presets_grid():
    from rstitch.logging.sweep import sweep_points

    assert sweep_points(["method.tau=0.1,0.2", "dataset.limit=2"]) == [["method.tau=0.1", "dataset.limit=2"],
                                                                       ["method.tau=0.2", "dataset.limit=2"]]
    grid = sweep_points(["method.tau=0.5,0.6"], {"method.tau": "1,2,3", "pair": "a,b"})  # the command replaces an axis
    assert sorted(map(sorted, grid)) == sorted(map(sorted, [[f"pair={p}", f"method.tau={t}"] for p in "ab" for t in ("0.5", "0.6")]))
    assert len(sweep_points(["method.tau=range(0,1,0.25)"])) == 4


@pytest.mark.parametrize("argv, needle", [
    (["-m", "dataset.shard=0,5", "dataset.num_shards=2", "dataset.limit=2"],
     "sweep point dataset.shard=5 dataset.num_shards=2 dataset.limit=2: dataset.shard must be an integer in [0, 1]"),
    (["-m", "dataset.limit=2,1", "dataset.shard=1", "dataset.num_shards=2"], "sweep point dataset.limit=1 "),
    (["-m", "method=rstitch", "baseline=auto,yes"], "baseline must be null or auto, got 'yes'"),
])
def test_every_sweep_point_is_checked_before_anything_runs(argv, needle):
    """Not only the first value of each axis: a later point that its job would refuse is one line now."""
    from rstitch.cli.preflight import check_command_line

    with pytest.raises(ConfigError) as err:
        check_command_line(argv)
    assert needle in str(err.value) and "\n" not in str(err.value)
    check_command_line([a.split(",")[0] if a.startswith(("dataset.shard=", "dataset.limit=", "baseline=")) else a for a in argv])


def test_a_point_that_finished_before_its_baseline_gets_its_speedup_at_the_sweep_end(tmp_path, tiny_pair):
    """Parallel jobs of one sweep: the point stores no speedup; the sweep's end fills it in from the
    baseline that finished in it, and the sweep's run directories are the points' own."""
    from rstitch.logging.sweep import fill_speedups, point_run_dirs

    problems = write_problems(tmp_path / "problems.jsonl", 2)
    root = tmp_path / "runs"
    point = run_in_process(tiny_pair, problems, root, "method=rstitch", "method.tau=0.5")
    baseline = run_in_process(tiny_pair, problems, root, "method=llm_only")
    [point_dir], [llm_dir] = run_dirs(root, "rstitch"), run_dirs(root, "llm_only")
    assert point["speedup"] is None
    mode = (point_dir / "summary.json").stat().st_mode
    assert fill_speedups([point_dir, llm_dir]) == [point_dir] and fill_speedups([point_dir, llm_dir]) == []
    filled = json.loads((point_dir / "summary.json").read_text())
    assert filled["speedup"] == pytest.approx(baseline["latency_s"] / point["latency_s"]) and filled["speedup_ci"] is not None
    assert (point_dir / "summary.json").stat().st_mode == mode
    cfg = compose_config([*tiny_overrides(tiny_pair, problems, root), "method=rstitch", "method.tau=0.5", "baseline=auto"])
    assert point_run_dirs(cfg) == [point_dir, llm_dir]


def test_a_rerun_that_changed_no_sample_does_not_log_the_sweep_summary_again(tmp_path, tiny_pair, monkeypatch):
    from rstitch.logging import WandbLogger
    from rstitch.logging.sweep import log_sweep_summary

    monkeypatch.setenv("WANDB_MODE", "offline")
    problems = write_problems(tmp_path / "problems.jsonl", 2)
    root = tmp_path / "runs"
    for method in ("llm_only", "slm_only"):
        run_in_process(tiny_pair, problems, root, f"method={method}")
    dirs = [*run_dirs(root, "llm_only"), *run_dirs(root, "slm_only")]
    logger = WandbLogger(mode="offline", dir=str(tmp_path))
    state = root / ".sweep_summaries"
    run_id = log_sweep_summary(dirs, logger, name="sweep/runs", state_dir=state)
    assert run_id is not None and (state / f"{run_id}.sha1").is_file()
    assert log_sweep_summary(dirs, logger, name="sweep/runs", state_dir=state) is None  # the same samples: not logged again
    samples = dirs[1] / "samples.jsonl"
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:-1]))
    run_in_process(tiny_pair, problems, root, "method=slm_only")  # decodes the removed sample again
    assert log_sweep_summary(dirs, logger, name="sweep/runs", state_dir=state) == run_id


def test_slurm_requests_and_states_are_read_as_slurm_writes_them():
    from rstitch.cli.cluster import failure_line, gpu_count, minutes, sbatch_flags
    from rstitch.configs import override_value

    assert [gpu_count(g) for g in ("(null)", "gpu:2", "gpu:a100:4(S:0-1)", "gpu:a100:4,gpu:v100:2,shard:8")] == [0, 2, 4, 6]
    assert [minutes(t) for t in ("infinite", "30:00", "2:00:00", "1-00:00:00", "45")] == [float("inf"), 30, 120, 1440, 45]
    assert override_value(["-m", "hydra/launcher=slurm", "x=1", "hydra/launcher=slurm_cpu"], "hydra/launcher") == "slurm_cpu"
    flags = sbatch_flags({"cpus_per_task": 2, "mem_gb": 4, "gpus_per_node": 0, "timeout_min": 60, "qos": "low",
                          "additional_parameters": {"mail_type": "END"}}, "debug")
    assert flags == ["--partition=debug", "--cpus-per-task=2", "--ntasks-per-node=1", "--nodes=1", "--mem=4096M", "--time=60",
                     "--qos=low", "--mail-type=END"]
    uncompleted = RuntimeError("Job 12_1 (task: 0) with path /r/.submitit/12_1/12_1_0_result.pkl\nhas not produced any output (state: CANCELLED)")
    line = failure_line(uncompleted, {"12_1": {"State": "CANCELLED", "Reason": "None"}})
    assert line.startswith("job 12_1 ended CANCELLED without a result (log: /r/.submitit/12_1/)") and "rerun the same command" in line
