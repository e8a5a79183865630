"""Shared fixtures: a tiny tokenizer and tiny random Llama models built on the spot (no hub)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# Tests live in a folder per package and share helpers by module name (`from test_specdec import
# BigramRunner`): every folder is importable from every other, as pytest imports a test file by its name.
sys.path[:0] = [str(folder) for folder in sorted(Path(__file__).resolve().parent.iterdir())
                if folder.is_dir() and folder.name.isidentifier() and not folder.name.startswith("_") and folder.name != "fixtures"]
if os.environ.get("PYTEST_XDIST_WORKER"):  # `-n auto`: a worker per core, so one torch thread each, not a core's worth
    torch.set_num_threads(1)
# The real benchmark records (MATH-500, GSM8K, AIME24, AMC23, Minerva as JSONL): ../shared/benchmarks
# beside the checkout, or the directory RSTITCH_BENCHMARKS names (scripts/export_benchmarks.py makes one).
SHARED_BENCHMARKS = Path(os.environ.get("RSTITCH_BENCHMARKS") or REPO.parent / "shared" / "benchmarks")
# Set where the records must be present (.ci/run): a missing file fails the tests that read it instead of skipping them.
REQUIRE_BENCHMARKS = "RSTITCH_REQUIRE_BENCHMARKS"


def benchmark_file(name: str) -> Path:
    """SHARED_BENCHMARKS / `name`; when it is missing, the test skips with how to provide it (and
    fails under RSTITCH_REQUIRE_BENCHMARKS=1)."""
    path = SHARED_BENCHMARKS / name
    if not path.is_file():
        message = (f"benchmark file {path} missing: export the hub's pinned records once (online) with "
                   "`python scripts/export_benchmarks.py --out DIR` and set RSTITCH_BENCHMARKS=DIR (README, Benchmark files)")
        if os.environ.get(REQUIRE_BENCHMARKS) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


# The five papers' texts (docs/fidelity.md quotes them): ../shared/papers beside the checkout, or the
# directory RSTITCH_PAPERS names. Not in the repository; .ci/run sets RSTITCH_REQUIRE_PAPERS=1.
SHARED_PAPERS = Path(os.environ.get("RSTITCH_PAPERS") or REPO.parent / "shared" / "papers")
REQUIRE_PAPERS = "RSTITCH_REQUIRE_PAPERS"


def paper_file(name: str) -> Path:
    """SHARED_PAPERS / `name`; when it is missing, the test skips saying so (and fails under
    RSTITCH_REQUIRE_PAPERS=1)."""
    path = SHARED_PAPERS / name
    if not path.is_file():
        message = f"paper text {path} missing: set RSTITCH_PAPERS to the directory of the papers' texts (docs/fidelity.md)"
        if os.environ.get(REQUIRE_PAPERS) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}<|endoftext|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(out_dir: Path, extra_chars: str = ""):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-*/=.,:?()\\{}\n" + extra_chars))
    specials = ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>"]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        additional_special_tokens=specials[1:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_model(out_dir: Path, tokenizer, layers: int, hidden: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    # Sharper logits than the default init so entropies spread over [0, 1].
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests skip, with the reason shown, on a machine without CUDA."""
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)


def run_script(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """scripts/<name>.py run as a user runs it (its own process, the installed package); it must succeed."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / f"{name}.py"), *args], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny_pair")
    tok = build_tokenizer(root / "tokenizer")
    slm = build_model(root / "slm", tok, layers=1, hidden=32, seed=1)
    llm = build_model(root / "llm", tok, layers=3, hidden=64, seed=2)
    return {"slm": str(slm), "llm": str(llm), "tokenizer": str(root / "tokenizer")}


@pytest.fixture(scope="session")
def tiny_runners(tiny_pair):
    from rstitch.engines import load_pair

    return load_pair({"path": tiny_pair["slm"]}, {"path": tiny_pair["llm"]})


@pytest.fixture
def problems_file(tmp_path) -> Path:
    path = tmp_path / "problems.jsonl"
    rows = [
        {"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(1, 5)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def testbed_pair():
    """The shipped testbed pair (part of the package, so never skipped)."""
    from rstitch.engines import load_pair
    from rstitch.testbed import LLM_DIR, SLM_DIR

    return load_pair({"path": str(SLM_DIR)}, {"path": str(LLM_DIR)})


def decode_testbed_problem(pair, name: str, budget: int = 96, seed: int = 11, **params):
    """Greedy decode of one fixed testbed test problem with method `name`."""
    from rstitch.data.prompts import PromptFormat
    from rstitch.engines import Sampler
    from rstitch.methods import DecodeContext, build_method
    from rstitch.testbed import generate_problems

    [problem] = generate_problems("test", 1, seed=seed)
    prompt = PromptFormat().encode(pair.tokenizer, problem.problem)
    ctx = DecodeContext(pair, Sampler(), budget, problem=problem.problem)
    return build_method(name, **params).decode(prompt, ctx).token_ids


@pytest.fixture(scope="session")
def check_hybrid_invariants():
    """`check(decode, llm, slm, near_tie=None)`: on any engine and pair, R-Stitch at tau < 0
    reproduces `llm_only` and at tau >= 1 `slm_only` token for token, and greedy SpecDec reproduces
    `llm_only`. `decode(method, **params)` decodes the shared sample; `llm`, `slm` are the single
    models' results.

    `near_tie=(llm_runner, prompt_ids, margin)` is for engines whose logits depend on a forward's
    shape (llama.cpp: SpecDec verifies k+1 tokens in one forward, `llm_only` decodes one at a time;
    up to 0.43 apart on the 0.5B's logits, docs/llamacpp.md): SpecDec must then equal `llm_only` up
    to its first difference, and there `llm_only`'s two best tokens must lie within `margin` logits
    with SpecDec's token one of them. A real verification bug diverges at a confident position."""
    from rstitch.methods.base import LLM, SLM

    def check(decode, llm, slm, near_tie=None) -> None:
        assert llm.token_ids != slm.token_ids  # the pair disagrees within the budget: the checks can fail
        low, high = decode("rstitch", tau=-1.0), decode("rstitch", tau=1.0)
        assert low.token_ids == llm.token_ids and set(low.sources) == {LLM}
        assert high.token_ids == slm.token_ids and set(high.sources) == {SLM}
        spec = decode("specdec", k=4)
        if near_tie is None or spec.token_ids == llm.token_ids:
            assert spec.token_ids == llm.token_ids
        else:
            _assert_diverges_at_a_near_tie(spec.token_ids, llm.token_ids, *near_tie)
        assert set(spec.sources) == {SLM, LLM}  # drafts were accepted, and the target corrected some

    return check


def _assert_diverges_at_a_near_tie(got: list[int], want: list[int], runner, prompt_ids: list[int], margin: float) -> None:
    first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    logits = runner.new_sequence(list(prompt_ids) + want[:first]).next_distribution().logits
    top2 = torch.topk(logits, 2)
    gap = float(top2.values[0] - top2.values[1])
    assert gap <= margin and {got[first], want[first]} <= set(top2.indices.tolist()), (
        f"diverged at token {first} where the LLM's best two tokens are {gap:.3f} logits apart (over {margin})")
