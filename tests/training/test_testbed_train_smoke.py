"""End-to-end smoke run of scripts/train_testbed.py on tiny sizes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # trains a tiny family in subprocesses

ROOT = Path(__file__).resolve().parents[2]


def train_smoke(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_testbed.py"), "--smoke", "--out", str(out), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


def smoke_run(out: Path, *extra: str) -> Path:
    proc = train_smoke(out, *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
    return smoke_run(tmp_path_factory.mktemp("testbed_smoke"))


def test_same_seeds_same_family(smoke_dir, tmp_path):
    """Fixed seeds and binding step counts: a second run trains the same weights, bit for bit."""
    from safetensors.torch import load_file

    again = smoke_run(tmp_path / "again")
    for name in ("slm", "llm"):
        first, second = load_file(smoke_dir / name / "model.safetensors"), load_file(again / name / "model.safetensors")
        assert first.keys() == second.keys()
        assert all(torch.equal(first[k], second[k]) for k in first), name
    assert (smoke_dir / "prm" / "prm_head.json").read_text() == (again / "prm" / "prm_head.json").read_text()
    assert validation_numbers(smoke_dir) == validation_numbers(again)


def test_prm_phase_alone_reproduces_the_full_run(smoke_dir, tmp_path):
    """Each phase draws its own problem stream: `--only prm` on a run's SLM and LLM fits the
    PRM head that run fitted, bit for bit, so PRM recipes can be compared without retraining the LLM."""
    import shutil

    rerun = tmp_path / "prm_only"
    for name in ("slm", "llm"):
        shutil.copytree(smoke_dir / name, rerun / name)
    smoke_run(rerun, "--only", "prm")
    assert (smoke_dir / "prm" / "prm_head.json").read_text() == (rerun / "prm" / "prm_head.json").read_text()


def validation_numbers(out: Path) -> str:
    """The run's validation report without wall times, as text (NaN AUCs compare equal)."""
    val = json.loads((out / "train_report.json").read_text())["val"]
    for model in ("slm", "llm"):
        val[model].pop("seconds")
    return json.dumps(val, sort_keys=True)


def test_outputs_load(smoke_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rstitch.methods.specreason import JUDGE_PREFIX, judge_prompt
    from rstitch.scorers import load_prm
    from rstitch.testbed import STEP_SEPARATOR, generate_problems
    from rstitch.testbed.tokenizer import render_prompt

    for name in ("tokenizer", "slm", "llm"):
        assert (smoke_dir / name / "tokenizer.json").exists()
    for name in ("slm", "llm"):
        assert (smoke_dir / name / "config.json").exists()
        assert (smoke_dir / name / "model.safetensors").exists()

    tok = AutoTokenizer.from_pretrained(smoke_dir / "tokenizer")
    slm = AutoModelForCausalLM.from_pretrained(smoke_dir / "slm")
    llm = AutoModelForCausalLM.from_pretrained(smoke_dir / "llm")
    prm = load_prm("testbed", path=str(smoke_dir / "prm"), model=str(smoke_dir / "llm"))
    assert slm.config.vocab_size == llm.config.vocab_size == len(prm.tokenizer) == len(tok)

    q = generate_problems("test", 1)[0]
    prompt = render_prompt(tok, q.problem)
    assert prompt.endswith("<|assistant|>\n")
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        for m in (slm, llm):
            out = m.generate(**ids, max_new_tokens=5, do_sample=False)
            assert out.shape[1] == ids["input_ids"].shape[1] + 5 or tok.eos_token_id in out[0].tolist()
    scores = prm.score(q.problem, q.steps("concise"))
    assert len(scores) == len(q.steps("concise")) and all(0.0 <= x <= 1.0 for x in scores)
    assert judge_prompt(tok, q.problem, ["a"], STEP_SEPARATOR).endswith(JUDGE_PREFIX)
    report = json.loads((smoke_dir / "train_report.json").read_text())
    assert "val" in report


def test_tokenizer_identical_across_models(smoke_dir):
    from transformers import AutoTokenizer

    ref = (smoke_dir / "tokenizer" / "tokenizer.json").read_text()
    toks = {}
    for name in ("tokenizer", "slm", "llm"):
        assert (smoke_dir / name / "tokenizer.json").read_text() == ref
        toks[name] = AutoTokenizer.from_pretrained(smoke_dir / name)
    text = "Start with 47. Add 38.\n\n47 + 38 = 85\n\n\\boxed{85}"
    encs = {name: t.encode(text, add_special_tokens=False) for name, t in toks.items()}
    assert len({tuple(e) for e in encs.values()}) == 1
    assert len({t.chat_template for t in toks.values()}) == 1
    t = toks["tokenizer"]
    assert t.decode(encs["tokenizer"]) == text
    assert t.convert_ids_to_tokens(t.encode("\n\n", add_special_tokens=False)) == ["ĊĊ"]


def test_prm_is_the_llm_with_a_fitted_head(smoke_dir):
    """The PRM is a head over the LLM's own weights (prm/ holds no copy of them); the head was
    fitted on checker labels."""
    assert sorted(p.name for p in (smoke_dir / "prm").iterdir()) == ["prm_head.json"]
    head = json.loads((smoke_dir / "prm" / "prm_head.json").read_text())
    fit = json.loads((smoke_dir / "train_report.json").read_text())["prm_train"]
    assert head["weight"] == fit["weight"] and head["bias"] == fit["bias"] and fit["steps"] > fit["solutions"] > 0


def test_report_counts_each_prm_data_pool(smoke_dir):
    """SLM samples, LLM samples and LLM stretch solutions are all drawn and counted."""
    pools = json.loads((smoke_dir / "train_report.json").read_text())["samples"]
    assert set(pools) == {"SLM samples", "LLM samples", "LLM stretch"}
    for pool in pools.values():
        assert pool["solutions"] > 0 and pool["steps"] >= pool["solutions"]
        assert 0.0 <= pool["wrong_step_frac"] <= 1.0


def measure(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "measure_testbed.py"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )


def test_measure_testbed_measures_a_trained_family(smoke_dir, tmp_path):
    """`measure_testbed.py --family DIR` runs the framework on DIR's models and PRM, not the shipped ones."""
    proc = measure("--family", str(smoke_dir), "--n", "3", "--no-sweeps", "--judge-steps", "3",
                   "--results-root", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    params = f"{n_params(smoke_dir / 'llm') / 1e6:.2f}M / {n_params(smoke_dir / 'slm') / 1e6:.2f}M"
    assert params in proc.stdout  # the smoke family's sizes, not the shipped 1.76M / 0.17M
    assert (tmp_path / "testbed" / "testbed" / "llm_only").is_dir()
    judge_row = next(line for line in proc.stdout.splitlines() if line.startswith("| judge ROC-AUC"))
    assert "SLM steps (3, " in judge_row and "--judge-steps 3 " in proc.stdout  # the cap is applied and said


def test_measure_testbed_rejects_a_directory_without_a_family(tmp_path):
    proc = measure("--family", str(tmp_path), "--n", "3")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: --family {tmp_path}: no trained slm, llm, prm")
    proc = measure("--family", str(tmp_path), "--write-doc")
    assert proc.returncode != 0 and "--write-doc describes the shipped family" in proc.stderr


def n_params(model_dir: Path) -> int:
    from safetensors.torch import load_file

    return sum(t.numel() for t in load_file(model_dir / "model.safetensors").values())


def test_example_fractions_over_one_are_refused(tmp_path):
    proc = train_smoke(tmp_path, "--judge-frac", "0.8")
    assert proc.returncode != 0
    assert "--judge-frac + --stitch-frac is 1.1" in proc.stderr.strip().splitlines()[-1]
    assert not any(tmp_path.iterdir())
