"""The HF engine's static decode path (`engine.compile`, engines/hf_static.py), on CPU without
capture (`static`) and, where a GPU is present, with CUDA graphs (`graphs`): the same invariants
and tokens as the eager path."""
from __future__ import annotations

import json

import pytest
import torch

from rstitch.cli.run import compose_config
from rstitch.engines import Sampler, TokenDistribution, hf_static, load_pair
from rstitch.engines.hf import HFModelRunner
from rstitch.engines.hf_static import StaticDecoder, StaticKV, StaticSequence, resolve_mode
from rstitch.errors import ConfigError
from rstitch.results.keys import run_key
from rstitch.runner import run
from rstitch.testbed import LLM_DIR, SLM_DIR

from conftest import decode_testbed_problem


@pytest.fixture(scope="module")
def static_pair():
    return load_pair({"path": str(SLM_DIR)}, {"path": str(LLM_DIR)}, compile="static")


@pytest.fixture(scope="module")
def static_llm():
    return HFModelRunner(str(LLM_DIR), compile="static")


def test_the_knob_resolves_per_device_and_refuses_capture_without_cuda():
    assert resolve_mode("auto", torch.device("cpu")) == "off"
    assert resolve_mode("auto", torch.device("cuda")) == "graphs"
    assert resolve_mode(True, torch.device("cuda")) == "graphs" and resolve_mode(False, torch.device("cuda")) == "off"
    assert resolve_mode("static", torch.device("cpu")) == "static"
    with pytest.raises(ConfigError, match="engine.compile=graphs .* needs pair.device=cuda"):
        resolve_mode("graphs", torch.device("cpu"))
    with pytest.raises(ConfigError, match="engine.compile must be one of"):
        resolve_mode("fast", torch.device("cpu"))


def test_the_default_keeps_run_keys_and_cpu_runs_eager(tmp_path):
    cfg = compose_config(["logger=none", f"results_root={tmp_path}"])
    assert cfg["engine"]["compile"] == "auto"
    before = {**cfg, "engine": {k: v for k, v in cfg["engine"].items() if k != "compile"}}
    assert run_key(cfg) == run_key(before)
    assert run_key({**cfg, "engine": {**cfg["engine"], "compile": "static"}}) != run_key(cfg)
    assert HFModelRunner(str(SLM_DIR)).static is None


def test_the_run_key_names_the_path_the_setting_resolves_to(tmp_path):
    """auto, off and no setting share the eager path's runs on a CPU; on CUDA auto captures graphs,
    whose latencies (and bf16 near-ties) are not the eager path's, so it gets runs of its own."""
    cfg = compose_config(["logger=none", f"results_root={tmp_path}"])
    with_compile = [run_key({**cfg, "engine": {**cfg["engine"], "compile": value}}) for value in ("auto", "off", False)]
    assert with_compile[0] == with_compile[1] == with_compile[2]
    cuda = {**cfg, "pair": {**cfg["pair"], "device": "cuda"}}
    auto_cuda, off_cuda, graphs_cuda = (run_key({**cuda, "engine": {**cfg["engine"], "compile": v}}) for v in ("auto", "off", "graphs"))
    assert auto_cuda == graphs_cuda != off_cuda


def test_static_path_keeps_the_hybrid_invariants(static_pair, check_hybrid_invariants):
    def decode(name, **params):
        return _decode(static_pair, name, **params)

    assert isinstance(static_pair.llm.new_sequence([1]), StaticSequence)
    check_hybrid_invariants(decode, decode("llm_only"), decode("slm_only"))


def _decode(pair, name, **params):
    from rstitch.data.prompts import PromptFormat
    from rstitch.methods import DecodeContext, build_method
    from rstitch.testbed import generate_problems

    [problem] = generate_problems("test", 1, seed=11)
    prompt = PromptFormat().encode(pair.tokenizer, problem.problem)
    return build_method(name, **params).decode(prompt, DecodeContext(pair, Sampler(), 96, problem=problem.problem))


def test_distributions_match_an_exact_reference_after_rollback(static_llm):
    eager = HFModelRunner(str(LLM_DIR))
    prompt = list(range(3, 60))
    fast, slow = static_llm.new_sequence(prompt), eager.new_sequence(prompt)
    for seq in (fast, slow):
        seq.score([7, 8, 9, 10])
        seq.rollback(3)  # inside the window: no forward
        seq.append([11, 12])
    a, b = fast.score([13]), slow.score([13])
    for x, y in zip(a, b):
        reference = TokenDistribution(x.logits.clone())  # computed on the host from the step's own logits
        assert x.entropy == pytest.approx(reference.entropy, rel=1e-6) and x.argmax == reference.argmax
        assert torch.allclose(x.logits, y.logits, atol=1e-4) and x.argmax == y.argmax
        assert x.normalized_entropy == pytest.approx(y.normalized_entropy, abs=1e-5)


def test_rollback_lowers_a_length_and_moves_no_data(static_llm):
    seq = static_llm.new_sequence(list(range(3, 40)))
    seq.generate(12, Sampler())
    kv = static_llm.static.kv
    before = [(t.data_ptr(), t.clone()) for t in kv.keys[:1] + kv.values[:1]]
    seq.rollback(8)
    assert seq.n_cached == len(seq.tokens) == 37 + 4
    assert all(t.data_ptr() == ptr and torch.equal(t, old) for t, (ptr, old) in zip(kv.keys[:1] + kv.values[:1], before))
    again = seq.generate(8, Sampler()).token_ids  # the rolled-back positions are overwritten in place
    assert len(again) == 8


def test_buffers_grow_in_slots_and_length_keeping_their_contents(monkeypatch):
    monkeypatch.setattr(hf_static, "INITIAL_LENGTH", 16)
    runner = HFModelRunner(str(SLM_DIR), compile="static")
    eager = HFModelRunner(str(SLM_DIR))
    prompts = [list(range(3 + i, 14 + i)) for i in range(3)]
    seqs = [runner.new_sequence(p) for p in prompts]  # three live sequences: slots 0, 1, 2 of 4
    assert sorted(s.slot for s in seqs) == [0, 1, 2] and runner.static.kv.slots == 4
    outs = [s.generate(30, Sampler()).token_ids for s in seqs]  # past 16 positions: the length doubles, twice
    assert runner.static.kv.length >= 41
    assert outs == [eager.new_sequence(p).generate(30, Sampler()).token_ids for p in prompts]
    freed = seqs.pop().slot
    assert runner.new_sequence([5]).slot == freed  # a closed sequence's slot is reused


SLOW = pytest.mark.slow


@pytest.mark.parametrize("method,params", [("rstitch", ["method.tau=0.02"]), ("specdec", []),
                                           pytest.param("llm_only", [], marks=SLOW), pytest.param("rsd", [], marks=SLOW),
                                           pytest.param("maj", ["method.n=2"], marks=SLOW)])
def test_static_path_decodes_what_the_eager_path_decodes(tmp_path, method, params):
    common = ["logger=none", f"results_root={tmp_path}", "engine.num_threads=1", f"method={method}", *params,
              "dataset.limit=3", "max_new_tokens=48"]
    temperature = ["decoding.temperature=0.7"] if method == "maj" else []
    rows = {}
    for mode in ("auto", "static"):
        cfg = compose_config([*common, *temperature, f"engine.compile={mode}"])
        cfg.pop("logger"), cfg.pop("results_root")
        run(cfg, tmp_path / mode)
        rows[mode] = [json.loads(line) for line in (tmp_path / mode / "samples.jsonl").read_text().splitlines()]
    for eager, static in zip(rows["auto"], rows["static"]):
        assert static["output_token_ids"] == eager["output_token_ids"]
        assert static["token_sources"] == eager["token_sources"]
        assert {k: {**c, "forward_time_s": 0} for k, c in static["cost"].items()} == \
            {k: {**c, "forward_time_s": 0} for k, c in eager["cost"].items()}


@pytest.mark.parametrize("method", ["rstitch", pytest.param("specdec", marks=SLOW)])
def test_batch_n_on_the_static_path_decodes_what_batch_1_decodes(tmp_path, method):
    common = ["logger=none", f"results_root={tmp_path}", "engine.num_threads=1", f"method={method}",
              "dataset.limit=3", "n_samples=2", "max_new_tokens=32", "engine.compile=static"]
    rows = {}
    for batch in (1, 4):
        cfg = compose_config([*common, f"batch_size={batch}"])
        cfg.pop("logger"), cfg.pop("results_root")
        run(cfg, tmp_path / str(batch))
        lines = (tmp_path / str(batch) / "samples.jsonl").read_text().splitlines()
        rows[batch] = {(r["id"], r["sample_index"]): r for r in map(json.loads, lines)}
    assert set(rows[1]) == set(rows[4]) and len(rows[1]) == 6
    for key, row in rows[1].items():
        assert rows[4][key]["output_token_ids"] == row["output_token_ids"], key
        assert rows[4][key]["token_sources"] == row["token_sources"], key


def test_the_step_makes_no_host_synchronization():
    """The decode step runs on the meta device, whose tensors have no values: any `.item()`,
    `.tolist()` or data-dependent branch inside it (a sync on CUDA, and a failed graph capture)
    raises here."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(LLM_DIR)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    decoder = object.__new__(StaticDecoder)
    decoder.model, decoder.base, decoder.head = model, model.model, model.get_output_embeddings()
    decoder.runner = type("Runner", (), {"vocab_size": config.vocab_size})()
    decoder.kv = StaticKV(config, torch.float32, torch.device("meta"))
    for width in (1, 8):
        ids = torch.zeros((2, width), dtype=torch.long, device="meta")
        logits, entropy, argmax, hidden = decoder.compute(ids, torch.zeros_like(ids))
        assert logits.shape == (2, width, config.vocab_size) and entropy.shape == argmax.shape == (2, width)


# --- on a GPU ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda_pairs():
    options = {"device": "cuda", "dtype": "float32"}
    eager = load_pair({"path": str(SLM_DIR)}, {"path": str(LLM_DIR)}, compile="off", **options)
    graphs = load_pair({"path": str(SLM_DIR)}, {"path": str(LLM_DIR)}, compile="graphs", **options)
    return eager, graphs


@pytest.mark.gpu
def test_cuda_graphs_keep_the_hybrid_invariants(cuda_pairs, check_hybrid_invariants):
    _, graphs = cuda_pairs

    def decode(name, **params):
        return _decode(graphs, name, **params)

    check_hybrid_invariants(decode, decode("llm_only"), decode("slm_only"))
    assert graphs.llm.static.captured > 0


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["llm_only", "slm_only", "rstitch", "specdec"])
def test_cuda_graphs_decode_what_the_eager_path_decodes(cuda_pairs, method):
    eager, graphs = cuda_pairs
    params = {"tau": 0.02} if method == "rstitch" else {}
    assert decode_testbed_problem(graphs, method, **params) == decode_testbed_problem(eager, method, **params)


@pytest.mark.gpu
def test_cuda_graphs_batch_n_decodes_what_batch_1_decodes(tmp_path):
    common = ["logger=none", f"results_root={tmp_path}", "method=rstitch", "dataset.limit=3", "n_samples=2",
              "max_new_tokens=32", "pair.device=cuda", "engine.compile=graphs"]
    rows = {}
    for batch in (1, 4):
        cfg = compose_config([*common, f"batch_size={batch}"])
        cfg.pop("logger"), cfg.pop("results_root")
        run(cfg, tmp_path / str(batch))
        rows[batch] = sorted((r["id"], r["sample_index"], r["output_token_ids"]) for r in
                             map(json.loads, (tmp_path / str(batch) / "samples.jsonl").read_text().splitlines()))
    assert rows[1] == rows[4]



def test_a_prefill_wider_than_the_buckets_runs_on_the_same_slots(monkeypatch):
    monkeypatch.setattr(hf_static, "FULL_STEP_POSITIONS", 4)  # also steps of 8 rows x 1 take the head-after path
    runner = HFModelRunner(str(SLM_DIR), compile="static")
    eager = HFModelRunner(str(SLM_DIR))
    prompt = list(range(3, 300))  # 297 tokens: wider than hf_static.WIDTHS, run uncaptured at its own width
    fast, slow = runner.new_sequence(prompt, want_hidden=True), eager.new_sequence(prompt, want_hidden=True)
    assert fast.generate(24, Sampler()).token_ids == slow.generate(24, Sampler()).token_ids
    a, b = fast.score([5, 6, 7, 8, 9]), slow.score([5, 6, 7, 8, 9])  # width 5 -> bucket 8: more than 4 positions
    assert [x.argmax for x in a] == [y.argmax for y in b]
    assert all(torch.allclose(x.hidden, y.hidden, atol=1e-4) for x, y in zip(a, b))
