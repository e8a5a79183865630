import json
import re

import pytest

from rstitch.errors import ConfigError
from rstitch.results import SampleStore, find_speedups, load_summaries, pareto_front, summarize_samples
from rstitch.results.baseline import missing_baseline_note, missing_speedup_reason
from rstitch.results.keys import comparison_key, fingerprint, method_weights, run_tag
from rstitch.results.summary import format_table


def sample(i, correct=True, latency=1.0, tokens=10):
    cost = {m: {"forward_time_s": 0.1, "forward_calls": 3} for m in ("slm", "llm")}
    return {"id": f"p{i}", "sample_index": 0, "correct": correct, "latency_s": latency, "tokens": tokens,
            "tokens_slm": tokens - 2, "tokens_llm": 2, "discarded_tokens": 1, "switches": 2, "cost": cost, "flops": 1.0}


def test_store_appends_resumes_and_refuses_duplicates(tmp_path):
    store = SampleStore(tmp_path, {"method": "a"})
    store.append(sample(1))
    with pytest.raises(ValueError):
        store.append(sample(1))
    store.close()
    (tmp_path / "samples.jsonl").open("a").write('{"id": "p2", "sampl')  # a kill mid-write
    reopened = SampleStore(tmp_path, {"method": "a"})
    assert reopened.done("p1", 0) and not reopened.done("p2", 0)
    reopened.append(sample(2))
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["p1", "p2"]


def test_one_process_per_run_directory(tmp_path):
    """A second process on a run directory (another sweep point sharing a baseline, another
    script) waits for the first to close it, then resumes from what it wrote: no sample is
    decoded or appended twice. In one process a second store is an error, not a deadlock."""
    import subprocess
    import sys

    first = SampleStore(tmp_path, {"method": "a"})
    first.append(sample(1))
    with pytest.raises(RuntimeError, match="already open in this process"):
        SampleStore(tmp_path, {"method": "a"})
    code = ("from rstitch.results import SampleStore; "
            f"s = SampleStore({str(tmp_path)!r}, {{'method': 'a'}}); print(s.done('p1', 0), s.done('p2', 0))")
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(subprocess.TimeoutExpired):
        other.wait(timeout=5)  # blocked while the first holds the directory
    first.append(sample(2))
    first.close()
    out, err = other.communicate(timeout=60)
    assert out.split() == ["True", "True"] and "waiting for another process" in err


def test_store_refuses_a_different_configuration(tmp_path):
    SampleStore(tmp_path, {"method": "a", "tau": 1}).close()
    with pytest.raises(ConfigError, match="differs in: tau"):
        SampleStore(tmp_path, {"method": "a", "tau": 2})


def test_summary_and_speedup():
    summary = summarize_samples([sample(1, True, 1.0), sample(2, False, 3.0)])
    assert summary["accuracy"] == 0.5 and summary["latency_s"] == 2.0 and summary["llm_token_share"] == 0.2
    key = {"pair": "x"}
    llm = {"method": "llm_only", "latency_s": 5.0, "comparison_key": key}
    assert find_speedups({"latency_s": 2.0, "comparison_key": key}, [llm])["speedup"] == 2.5
    assert find_speedups({"latency_s": 2.0, "comparison_key": {"pair": "y"}}, [llm])["speedup"] is None


def write_summary(root, name: str, **summary) -> None:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_a_missing_speedup_says_why_and_how_to_make_the_baseline(tmp_path):
    key = {"dataset": {"limit": 2}, "engine": {"num_threads": 1}, "max_new_tokens": 32}
    run = {"method": "rstitch", "speedup": None, "comparison_key": key}
    overrides = ["dataset.limit=2", "method=rstitch", "method.tau=0.1", "+method.x=1", "baseline=null", "prompt.system=a b"]
    note = missing_baseline_note({**run, "speedup_missing": missing_speedup_reason(run, tmp_path)}, overrides)
    assert note.splitlines() == [f"speedup -: no llm_only run under {tmp_path} yet; make it with",
                                 "  rstitch-run method=llm_only dataset.limit=2 'prompt.system=a b'",
                                 "or rerun with baseline=auto, which runs it first"]
    write_summary(tmp_path, "far", method="llm_only", comparison_key={**key, "dataset": {"limit": 5}, "max_new_tokens": 64})
    near = {**key, "dataset": {"limit": 5}, "engine": {"num_threads": 2}}
    write_summary(tmp_path, "near", method="llm_only", comparison_key=near)
    why = missing_speedup_reason(run, tmp_path)
    assert "has this run's comparison key (the nearest differs in: dataset.limit, engine.num_threads)" in why
    assert missing_speedup_reason({**run, "speedup": 1.5}, tmp_path) is None
    assert missing_speedup_reason({**run, "method": "llm_only"}, tmp_path) is None
    assert missing_baseline_note({**run, "speedup_missing": None}, overrides) is None


def test_format_table_has_one_row_per_run():
    rows = [{"method": "llm_only", "run_tag": "ab12", "n_samples": 2, "accuracy": 0.5, "latency_s": 1.0, "speedup": 1.0},
            {"method": "rstitch", "run_tag": "tau=0.1_cd34", "n_samples": 2, "accuracy": 0.25, "latency_s": 0.5}]
    lines = format_table(*rows).splitlines()
    assert len(lines) == 3 and len({len(line) for line in lines}) == 1  # aligned
    cells = [[c.strip() for c in re.split(r"\s{2,}", line.strip())] for line in lines]
    assert cells[0][:7] == ["method", "tag", "n", "accuracy +/- se", "acc_diff +/- se", "p", "latency_s"]
    assert cells[1][:7] == ["llm_only", "ab12", "2", "0.500", "-", "-", "1.000"] and cells[2][-2:] == ["-", "-"]


def test_format_table_shows_standard_errors_the_paired_difference_and_the_speedup_split():
    row = {"method": "rstitch", "run_tag": "t", "n_samples": 20, "accuracy": 0.45, "accuracy_se": 0.111, "accuracy_diff": -0.05,
           "accuracy_diff_se": 0.04, "accuracy_diff_p": 0.5, "latency_s": 1.0, "speedup": 2.4, "speedup_ci": [1.9, 2.8],
           "token_ratio": 0.5, "per_token_latency_ratio": 1.2}
    header, line = [[c.strip() for c in re.split(r"\s{2,}", x.strip())] for x in format_table(row).splitlines()]
    cell = dict(zip(header, line))
    assert cell["accuracy +/- se"] == "0.450 +/- 0.111" and cell["acc_diff +/- se"] == "-0.050 +/- 0.040" and cell["p"] == "0.5"
    assert cell["wall_speedup [95% CI]"] == "2.40 [1.90, 2.80]" and cell["tok_ratio"] == "0.50" and cell["per_tok_x"] == "1.20"
    assert cell["cpu_speedup [95% CI]"] == "-"  # no CPU time recorded (a GPU run, or one from before it was)


def test_tokens_per_s_speedup_is_reported_beside_the_latency_ratio():
    # The method writes twice as many tokens in 2 s as LLM-only does in 5 s: 2.5x by latency,
    # 5x by throughput (the EASD paper's measure).
    method = summarize_samples([{**sample(1, True, 2.0), "tokens": 20}])
    llm = {**summarize_samples([{**sample(1, True, 5.0), "tokens": 10}]), "method": "llm_only", "comparison_key": {}}
    assert method["tokens_per_s"] == 10.0 and llm["tokens_per_s"] == 2.0
    speedups = find_speedups({**method, "comparison_key": {}}, [llm])
    assert speedups == {"speedup": pytest.approx(2.5), "speedup_cpu": None, "speedup_estimate": None,
                        "speedup_tokens_per_s": pytest.approx(5.0)}


def test_run_tag_names_parameters_and_hashes_the_rest():
    base = {"pair": {}, "engine": {}, "dataset": {"limit": 1}, "prompt": {}, "max_new_tokens": 8, "decoding": {},
            "n_samples": 1, "method": {"name": "rstitch", "tau": 0.02}}
    tag = run_tag(base)
    assert tag.startswith("tau=0.02_")
    assert run_tag({**base, "dataset": {"limit": 2}}) != tag
    prompt = run_tag({**base, "method": {"name": "rstitch_deer", "tau": 0.02, "answer_prompt": "\n\n\\boxed"}})
    assert prompt.startswith("tau=0.02_") and "\n" not in prompt  # a text with newlines is left to the hash


def write_checkpoint(root, payload: bytes) -> str:
    (root / "config.json").write_text('{"hidden_size": 8}')
    (root / "model.safetensors").write_bytes(payload)
    return str(root)


def test_weights_retrained_in_place_get_their_own_runs_and_baselines(tmp_path):
    """Same paths, new weights: a new run directory and a new comparison key, never a resume
    into (or a speedup from) the old weights' results."""
    llm, router = tmp_path / "llm", tmp_path / "router"
    llm.mkdir(), router.mkdir()
    write_checkpoint(llm, b"a" * (3 << 20))  # larger than 2 MiB: head and tail are read
    write_checkpoint(router, b"r")
    cfg = {"pair": {"slm": {"path": "hub/slm"}, "llm": {"path": str(llm)}}, "engine": {}, "dataset": {}, "prompt": {},
           "max_new_tokens": 8, "decoding": {}, "n_samples": 1, "method": {"name": "rstitch_plus", "router": str(router)}}
    key, tag = comparison_key(cfg), run_tag(cfg)
    assert set(key["weights"]) == {"llm"}  # a hub id is keyed by its name
    assert (comparison_key(cfg), run_tag(cfg)) == (key, tag)  # stable while the files are
    write_checkpoint(llm, b"a" * ((3 << 20) - 1) + b"b")  # one byte in the tail of the shard
    assert comparison_key(cfg) != key and run_tag(cfg) != tag
    key, tag = comparison_key(cfg), run_tag(cfg)
    write_checkpoint(router, b"s")  # the method's own checkpoint: a new run, same baselines
    assert comparison_key(cfg) == key and run_tag(cfg) != tag


def test_bare_words_are_not_checkpoints(tmp_path, monkeypatch):
    """A method named like a folder of the working directory is a name, not a path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rstitch").mkdir()
    (tmp_path / "ckpt").mkdir()
    assert method_weights({"name": "rstitch", "mode": "rstitch", "router": "./ckpt"}) == {"router": fingerprint("ckpt")}


def test_fingerprint_reads_content_not_location(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    assert fingerprint(write_checkpoint(a, b"x" * 10)) == fingerprint(write_checkpoint(b, b"x" * 10))
    assert fingerprint(a) != fingerprint(write_checkpoint(b, b"x" * 11))


def test_summaries_table_and_pareto_front(tmp_path):
    points = [("llm_only", {}, 0.9, 4.0), ("rstitch", {"tau": 0.01}, 0.85, 2.0), ("rstitch", {"tau": 0.05}, 0.6, 2.5),
              ("slm_only", {}, 0.4, 1.0)]
    for i, (method, params, acc, lat) in enumerate(points):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({
            "pair": "p", "dataset": "d", "method": method, "run_tag": str(i), "accuracy": acc, "latency_s": lat,
            "config": {"method": {"name": method, **params}}}))
    frame = load_summaries(tmp_path)
    assert len(frame) == 4 and "method.tau" in frame.columns
    front = pareto_front(frame)
    assert sorted(front["latency_s"]) == [1.0, 2.0, 4.0]  # tau=0.05 is dominated


def test_roc_auc_ranks_with_ties_counting_half():
    from rstitch.results.uncertainty import roc_auc

    assert roc_auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75
    assert roc_auc([0.5, 0.5], [True, False]) == 0.5
    assert roc_auc([0.2, 0.9], [False, True]) == 1.0
    assert roc_auc([0.3, 0.4], [True, True]) != roc_auc([0.3, 0.4], [True, True])  # nan: one class only


def test_spearman_matches_scipy_with_ties_and_is_nan_on_constant_input():
    import random

    from scipy.stats import spearmanr

    from rstitch.results.uncertainty import average_ranks, spearman

    assert average_ranks([0.3, 0.1, 0.3, 0.2]) == [3.5, 1.0, 3.5, 2.0]
    rng = random.Random(1)
    a = [rng.randint(0, 5) for _ in range(60)]  # many ties
    b = [x + rng.gauss(0, 2) for x in a]
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) != spearman([1, 1, 1], [1, 2, 3])  # nan: constant side
    assert spearman([1.0], [2.0]) != spearman([1.0], [2.0])  # nan: one value


def test_roc_auc_interval_resamples_whole_groups():
    """Wrong steps clustered in a few problems: resampling problems gives a wider interval than
    treating every step as independent, and the interval holds the point estimate."""
    import random

    from rstitch.results.uncertainty import roc_auc, roc_auc_interval

    rng = random.Random(0)
    scores, labels, problems = [], [], []
    for problem in range(100):
        wrong = problem < 4  # four problems hold every wrong step, scored alike within a problem
        level = rng.random()
        for _ in range(6):
            labels.append(not wrong)
            scores.append(level + 0.05 * rng.random() if wrong else rng.random())
            problems.append(problem)
    auc = roc_auc(scores, labels)
    lo, hi = roc_auc_interval(scores, labels, problems)
    lo_steps, hi_steps = roc_auc_interval(scores, labels, range(len(scores)))
    assert lo < auc < hi and lo_steps < auc < hi_steps
    assert hi - lo > 1.2 * (hi_steps - lo_steps)
    assert roc_auc_interval(scores, labels, problems) == (lo, hi)  # seeded
    nan_lo, nan_hi = roc_auc_interval([0.1, 0.2], [True, True], [0, 1])
    assert nan_lo != nan_lo and nan_hi != nan_hi
