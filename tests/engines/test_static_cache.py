"""The HF engine's static decode path (`engine.compile`, engines/hf_static.py), on CPU without
capture (`static`) and, where a GPU is present, with CUDA graphs (`graphs`): the same invariants
and tokens as the eager path."""
from __future__ import annotations

import gc
import json
import math
import re
import time
import weakref
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rstitch.cli.run import compose_config
from rstitch.engines import Sampler, TokenDistribution, hf_static, load_pair
from rstitch.engines.hf import HFModelRunner
from rstitch.engines.hf_static import StaticDecoder, StaticSequence, resolve_mode
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


HOST_SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default}


class StepProbe(TorchDispatchMode):
    """Every aten call of a step: a host synchronization (`.item()`, `.tolist()`, a data-dependent
    branch: on CUDA a sync, and a failed capture), a tensor of another device, or a key/value
    tensor copied to every query head fails the step."""

    def __init__(self, device: torch.device, query_heads: int):
        super().__init__()
        self.device, self.query_heads, self.shapes = device, query_heads, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        kwargs = kwargs or {}
        assert func not in HOST_SYNCS, f"host synchronization in the step: {func}"
        for a in [*args, *kwargs.values()]:
            assert not isinstance(a, torch.Tensor) or a.device == self.device, f"{func} reads a {a.device} tensor"
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            self.shapes.append(tuple(out.shape))
        return out


def _meta_decoder(config, dtype=torch.bfloat16):
    """A StaticDecoder over a model on the meta device (no values, no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    runner = type("Runner", (), {"vocab_size": config.vocab_size, "model": model, "device": torch.device("meta"),
                                 "name": "meta", "synchronize": lambda self: None})()
    return StaticDecoder(runner, "static")


def test_the_step_makes_no_host_synchronization_and_reads_grouped_keys_in_place():
    """The R-Stitch pair's attention layout (28 query heads over 4 KV heads) at the default slot
    length, on the meta device: no step (decode, verification, wide) syncs with the host, and
    none materializes the keys for every query head ([rows, 28, positions, head dim])."""
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=28 * 8, num_attention_heads=28, num_key_value_heads=4, num_hidden_layers=2,
                         intermediate_size=64, vocab_size=1000)
    decoder = _meta_decoder(config)
    for rows, width, full in ((2, 1, True), (4, 8, True), (1, 64, False)):
        ids = torch.zeros((rows, width), dtype=torch.long, device="meta")
        probe = StepProbe(torch.device("meta"), 28)
        with probe:
            outputs = (decoder.compute if full else decoder.hidden_only)(ids, torch.zeros_like(ids), 512)
        assert outputs[-1].shape == (rows, width, 28 * 8)
        if full:
            logits, summary, _ = outputs  # (entropy, argmax) pairs
            assert logits.shape == (rows, width, 1000) and summary.shape == (rows, width, 2)
        repeated = [s for s in probe.shapes if len(s) == 4 and s[1] == 28 and s[2] >= 512]
        assert not repeated, f"keys copied to every query head: {repeated[:2]}"


def test_grouped_attention_equals_attention_over_repeated_keys():
    from transformers.integrations.sdpa_attention import repeat_kv

    torch.manual_seed(0)
    query, key, value = torch.randn(3, 8, 5, 16), torch.randn(3, 2, 40, 16), torch.randn(3, 2, 40, 16)
    mask = torch.arange(40)[None, None, None, :] <= torch.tensor([10, 20, 39])[:, None, None, None] + torch.arange(5)[:, None]
    out, _ = hf_static.grouped_attention(None, query, key, value, mask, scaling=0.25)
    reference = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key, 4), repeat_kv(value, 4),
                                                                 attn_mask=mask, scale=0.25)
    assert torch.allclose(out, reference.transpose(1, 2), atol=1e-5)


def test_a_padded_forward_that_fills_a_slot_to_its_last_position_equals_the_eager_path(monkeypatch):
    """Rows of n_cached + width = the slot's length: the padding column writes its key to the
    scratch position, which must lie past the last real token (the `+ 1` of `needed`)."""
    monkeypatch.setattr(hf_static, "INITIAL_LENGTH", 16)
    monkeypatch.setattr(hf_static, "MIN_READ", 4, raising=False)
    runner, eager = HFModelRunner(str(SLM_DIR), compile="static"), HFModelRunner(str(SLM_DIR))
    for width in (3, 5, 7):  # buckets 4, 8, 8: one to three padding columns
        prompt = list(range(3, 3 + runner.static.kv.length - width - 1))
        fast, slow = runner.new_sequence(prompt), eager.new_sequence(prompt)
        fast.score([prompt[-1]]), slow.score([prompt[-1]])
        assert fast.n_cached + width == runner.static.kv.length
        new = list(range(20, 20 + width))
        for x, y in zip(fast.score(new), slow.score(new)):
            assert torch.allclose(x.logits, y.logits, atol=1e-4)


def test_a_short_sequence_attends_over_its_live_length_only(static_llm):
    """Attention reads the first MIN_READ (or the next power of two) positions of a slot, not
    the whole buffer."""
    lengths = []
    layer = static_llm.model.model.layers[0].self_attn
    handle = layer.register_forward_pre_hook(lambda m, a, k: lengths.append(k["attention_mask"].shape[-1]),
                                             with_kwargs=True)
    try:
        static_llm.new_sequence(list(range(3, 60))).generate(4, Sampler())
    finally:
        handle.remove()
    assert static_llm.static.kv.length == hf_static.INITIAL_LENGTH
    assert lengths and set(lengths) == {hf_static.MIN_READ}


def test_a_prefill_runs_the_head_only_on_the_positions_kept(static_llm):
    """A 40-token prompt and its next token (bucket 64) keep two positions: the LM head makes
    logits of those two only."""
    vocab = static_llm.model.config.vocab_size
    probe = StepProbe(torch.device("cpu"), 4)
    seq = static_llm.new_sequence(list(range(3, 43)))
    with probe:
        seq.score([43])
    head_rows = [s for s in probe.shapes if s and s[-1] == vocab]
    assert head_rows and max(math.prod(s[:-1]) for s in head_rows) == 2


def test_a_straggler_in_a_high_slot_moves_down_and_decodes_the_same(monkeypatch):
    runner, eager = HFModelRunner(str(SLM_DIR), compile="static"), HFModelRunner(str(SLM_DIR))
    prompts = [list(range(3 + i, 20 + i)) for i in range(3)]
    seqs = [runner.new_sequence(p) for p in prompts]
    for seq in seqs:
        seq.score([5])
    straggler = seqs.pop()
    assert straggler.slot == 2
    del seqs, seq
    gc.collect()  # the others finish: slots 0 and 1 are free
    reference = eager.new_sequence(prompts[2])
    reference.score([5])
    assert straggler.generate(6, Sampler()).token_ids == reference.generate(6, Sampler()).token_ids
    assert straggler.slot == 0 and 2 in runner.static.kv.free
    del straggler
    gc.collect()
    assert sorted(runner.static.kv.free) == [0, 1, 2, 3]  # the moved sequence frees the slot it holds


def test_the_kv_budget_check_names_what_fits_in_one_line():
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, num_hidden_layers=28)
    gib = 1 << 30
    assert hf_static.kv_bytes(config, torch.bfloat16, 32, 32768) == 56 * gib  # a 7B's KV at batch 32 x 32k
    hf_static.check_kv_budget(config, torch.bfloat16, 32, 32768, 60 * gib, "llm")
    with pytest.raises(ConfigError) as refused:
        hf_static.check_kv_budget(config, torch.bfloat16, 32, 32768, 40 * gib, "llm")
    message = str(refused.value)
    assert "\n" not in message and "56.0 GiB for 32 sequences x 32768 positions" in message
    slots, length = map(int, re.search(r"(\d+) sequences fit at 32768 positions, or 32 at (\d+)", message).groups())
    for fits, over in (((slots, 32768), (slots + 1, 32768)), ((32, length), (32, length + 1))):
        assert hf_static.kv_bytes(config, torch.bfloat16, *fits) <= 40 * gib < hf_static.kv_bytes(config, torch.bfloat16, *over)


def test_latency_profiles_are_keyed_by_the_decode_path(monkeypatch):
    """A captured or compiled path gets profiles of its own; the eager path (and `static`, its
    uncaptured stand-in on CPU) keeps the files it has."""
    from rstitch.engines import hf
    from rstitch.latency.model import latency_file, runner_identity

    eager, static = HFModelRunner(str(SLM_DIR)), HFModelRunner(str(SLM_DIR), compile="static")
    monkeypatch.setattr(hf, "resolve_mode", lambda value, device: "inductor")
    compiled = HFModelRunner(str(SLM_DIR), compile="inductor")
    files = [latency_file("profiles", *runner_identity(r)).name for r in (eager, static, compiled)]
    assert files[0] == files[1] == f"{eager.name}.cpu.float32.json" != files[2] == f"{eager.name}.hf-inductor.cpu.float32.json"


def test_inductor_is_a_cpu_path_with_the_recompile_limit_raised(monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)
    assert resolve_mode("inductor", torch.device("cpu")) == "inductor"
    runner = HFModelRunner(str(SLM_DIR), compile="static")
    compiled = StaticDecoder(runner, "inductor")
    shapes = len(hf_static.WIDTHS) * 8 * 8  # widths x row buckets up to 128 x attention windows up to 32k
    assert torch._dynamo.config.recompile_limit >= shapes
    # views of the buffers are made inside each compiled call, none kept between calls
    assert runner.static.kv.memoize and not compiled.kv.memoize


# --- capture and replay, emulated on a CPU ----------------------------------------------------
class _Stream:
    def wait_stream(self, other: Any) -> None:
        pass


class _Recorder(TorchDispatchMode):
    """The aten calls of a capture, with their tensors: what a CUDA graph records (kernels on
    fixed addresses, host values baked in)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        kwargs = kwargs or {}
        assert func not in HOST_SYNCS, f"host synchronization during capture: {func}"
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class _Graph:
    def __init__(self, cuda: EmulatedCuda):
        self.cuda, self.ops = cuda, []

    def replay(self) -> None:
        """Every recorded call again on the recorded tensors, results written where the capture's went."""
        self.cuda.replays += 1
        for func, args, kwargs, out in self.ops:
            fresh = func(*args, **kwargs)
            pairs = zip(out, fresh) if isinstance(out, (tuple, list)) else [(out, fresh)]
            for recorded, new in pairs:
                # a view (or `to` of the same dtype) is the recorded memory again; an in-place call wrote it already
                if isinstance(recorded, torch.Tensor) and recorded.data_ptr() != new.data_ptr():
                    recorded.copy_(new)


class EmulatedCuda:
    """torch.cuda's stream and graph API on a CPU: captures record aten calls and replays rerun
    them; it keeps which streams ran work, and a pool handle whose graphs were all freed refuses
    reuse as PyTorch's caching allocator does (`use_count > 0`)."""

    def __init__(self, capture_cost_s: float = 0.0):
        self.capture_stream, self.current = _Stream(), _Stream()
        self.work_streams: set[int] = set()
        self.pools: dict[tuple[int, int], int] = {}  # handle -> live graphs
        self.captures = self.replays = self.handles = 0
        self.graphs: list[weakref.ref] = []
        self.capture_cost_s = capture_cost_s

    def install(self, monkeypatch) -> None:
        import transformers.generation.utils  # noqa: F401 - its annotations name torch.cuda.CUDAGraph: imported before the swap
        if hasattr(hf_static, "CaptureStream"):
            monkeypatch.setattr(hf_static.CaptureStream, "_streams", {})
        for name in ("Stream", "current_stream", "stream", "graph_pool_handle", "CUDAGraph", "graph"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def Stream(self, device: Any = None) -> _Stream:  # noqa: N802 - torch.cuda's name
        return _Stream()

    def current_stream(self, device: Any = None) -> _Stream:
        return self.current

    @contextmanager
    def stream(self, stream: _Stream):
        self.work_streams.add(id(stream))
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous

    def graph_pool_handle(self) -> tuple[int, int]:
        self.handles += 1
        return (0, self.handles)

    def CUDAGraph(self) -> _Graph:  # noqa: N802 - torch.cuda's name
        graph = _Graph(self)
        self.graphs.append(weakref.ref(graph))
        return graph

    @contextmanager
    def graph(self, graph: _Graph, pool: Any = None, stream: Any = None, **kwargs: Any):
        if pool is not None:
            if self.pools.get(pool) == 0:
                raise RuntimeError("INTERNAL ASSERT FAILED: it->second->use_count > 0")
            self.pools[pool] = self.pools.get(pool, 0) + 1
            weakref.finalize(graph, self._release, pool)
        with self.stream(stream or self.capture_stream), _Recorder() as recorder:
            yield
        time.sleep(self.capture_cost_s)
        graph.ops = recorder.ops
        self.captures += 1

    def _release(self, pool: tuple[int, int]) -> None:
        self.pools[pool] -= 1


def _emulated_graphs(monkeypatch, path=SLM_DIR, capture_cost_s: float = 0.0):
    cuda = EmulatedCuda(capture_cost_s)
    cuda.install(monkeypatch)
    runner = HFModelRunner(str(path), compile="static")
    runner.static = StaticDecoder(runner, "graphs")
    return runner, cuda


def test_emulated_capture_and_replay_across_slot_and_length_doublings(monkeypatch):
    """Graphs recorded on a CPU and replayed: three sequences (slots double twice) past 16, 32 and
    64 positions (the length doubles three times, every graph recaptured) decode the eager path's
    tokens, on one stream, re-capturing into a pool handle that is still valid, and the steps keep
    no captured output alive."""
    monkeypatch.setattr(hf_static, "INITIAL_LENGTH", 16)
    monkeypatch.setattr(hf_static, "MIN_READ", 8, raising=False)
    runner, cuda = _emulated_graphs(monkeypatch)
    eager = HFModelRunner(str(SLM_DIR))
    prompts = [list(range(3 + i, 14 + i)) for i in range(3)]
    seqs, references = [runner.new_sequence(p) for p in prompts], [eager.new_sequence(p) for p in prompts]
    outs = [s.generate(60, Sampler()).token_ids for s in seqs]
    assert outs == [r.generate(60, Sampler()).token_ids for r in references]
    for seq, reference in zip(seqs, references):  # replayed distributions, not only their argmax
        for x, y in zip(seq.score([5, 6, 7]), reference.score([5, 6, 7])):
            assert torch.allclose(x.logits, y.logits, atol=1e-4)
    assert runner.static.kv.slots == 4 and runner.static.kv.length == 128
    assert cuda.captures == runner.static.captured > 8 and cuda.replays > 100
    assert len(cuda.work_streams) == 1  # every warm-up and capture on the one capture stream
    assert sum(g() is not None for g in cuda.graphs) == len(runner.static.steps)  # resizes freed the old graphs
    for step in runner.static.steps.values():
        recorded = {t.untyped_storage()._cdata for _, _, _, t in step.graph.ops if isinstance(t, torch.Tensor)}
        assert all(t.untyped_storage()._cdata not in recorded for t in step.outputs)  # unowned aliases


def test_an_emulated_batched_run_with_graphs_decodes_what_batch_1_decodes(tmp_path, monkeypatch):
    """Batch 4 through the run loop on emulated graphs (slots double while sequences join, steps
    of 1 to 4 rows are captured and replayed) gives batch 1's tokens on the static path."""
    from rstitch.engines import hf
    from rstitch.engines.cache import clear_pairs

    cuda = EmulatedCuda()
    cuda.install(monkeypatch)
    monkeypatch.setattr(hf, "resolve_mode", lambda value, device: "graphs" if value == "graphs" else resolve_mode(value, device))
    from rstitch.testbed import ASSETS_DIR

    profiles = tmp_path / "latency"  # the eager path's testbed profiles, under the graphs path's names
    profiles.mkdir()
    for model in ("testbed-llm", "testbed-slm"):
        source = ASSETS_DIR / "latency" / f"{model}.cpu.float32.json"
        (profiles / f"{model}.hf-graphs.cpu.float32.json").write_text(source.read_text())
    common = ["logger=none", f"results_root={tmp_path}", "engine.num_threads=1", "method=rstitch", "method.tau=0.02",
              "dataset.limit=2", "n_samples=2", "max_new_tokens=24", f"latency_dir={profiles}"]
    rows = {}
    for mode, batch in (("static", 1), ("graphs", 4)):
        clear_pairs()
        cfg = compose_config([*common, f"engine.compile={mode}", f"batch_size={batch}"])
        cfg.pop("logger"), cfg.pop("results_root")
        run(cfg, tmp_path / mode)
        lines = (tmp_path / mode / "samples.jsonl").read_text().splitlines()
        rows[mode] = {(r["id"], r["sample_index"]): r["output_token_ids"] for r in map(json.loads, lines)}
    clear_pairs()
    assert rows["graphs"] == rows["static"] and len(rows["static"]) == 4
    assert cuda.captures > 0 and cuda.replays > 0 and len(cuda.work_streams) == 1


@pytest.mark.parametrize("slots,length,shortest,longest", [(1, 2048, 40, 200), (4, 4096, 100, 2100), (32, 16384, 300, 8292)])
def test_warm_up_covers_every_step_shape_a_sample_can_use(slots, length, shortest, longest):
    """Every step a forward can take (any highest slot, any captured width, any live length from
    the shortest prompt to the longest sample plus a widest step) is among the warmed shapes."""
    warmed = set(hf_static.warm_shapes(slots, length, shortest, longest))
    for live in range(shortest, min(longest + hf_static.WIDTHS[-1], length - 1) + 1):
        for widest in (1, 3, 16, 17, 100, 128):
            for highest in range(slots):
                if widest <= live:
                    assert hf_static.step_shape(highest, widest, live, slots, length) in warmed, (highest, widest, live)
    assert len(warmed) == slots.bit_length() * len(hf_static.WIDTHS) * len({s for _, _, s in warmed})


@pytest.mark.parametrize("batch", [1, pytest.param(4, marks=SLOW)])
def test_every_capture_happens_in_warm_up_never_inside_a_timed_sample(tmp_path, monkeypatch, batch):
    """The run captures every step its samples can use after the warm-up decode (rows up to the
    batch's slots, every width, every attention window up to the longest sample): no sample
    (batch 1: each timed decode; batch 4: the whole decode loop) captures anything."""
    from rstitch import runner as run_loop
    from rstitch.engines import hf
    from rstitch.engines.cache import clear_pairs
    from rstitch.testbed import ASSETS_DIR

    cuda = EmulatedCuda()
    cuda.install(monkeypatch)
    monkeypatch.setattr(hf, "resolve_mode", lambda value, device: "graphs" if value == "graphs" else resolve_mode(value, device))
    profiles = tmp_path / "latency"  # batch 4 estimates latency from profiles: the testbed's, under the graphs path's names
    profiles.mkdir()
    for model in ("testbed-llm", "testbed-slm"):
        source = ASSETS_DIR / "latency" / f"{model}.cpu.float32.json"
        (profiles / f"{model}.hf-graphs.cpu.float32.json").write_text(source.read_text())
    after_warm_up, in_samples = [], []
    prepare, timed = run_loop.prepare_shapes, run_loop.timed_decode

    def prepare_and_count(*args: Any) -> None:
        prepare(*args)
        after_warm_up.append(cuda.captures)

    def timed_and_count(method, prompt_ids, ctx):
        before = cuda.captures
        out = timed(method, prompt_ids, ctx)
        in_samples.append(cuda.captures - before)
        return out

    monkeypatch.setattr(run_loop, "prepare_shapes", prepare_and_count)
    monkeypatch.setattr(run_loop, "timed_decode", timed_and_count)
    cfg = compose_config(["logger=none", f"results_root={tmp_path}", "engine.num_threads=1", "method=specdec",
                          "dataset.limit=3", "n_samples=2", "max_new_tokens=40", f"latency_dir={profiles}",
                          "engine.compile=graphs", f"batch_size={batch}"])
    cfg.pop("logger"), cfg.pop("results_root")
    clear_pairs()
    try:
        run(cfg, tmp_path / "run")
    finally:
        clear_pairs()
    assert len((tmp_path / "run" / "samples.jsonl").read_text().splitlines()) == 6
    assert len(after_warm_up) == 1 and after_warm_up[0] > 0 and cuda.replays > 0
    assert cuda.captures == after_warm_up[0], f"{cuda.captures - after_warm_up[0]} captures after warm-up"
    assert in_samples == ([0] * 6 if batch == 1 else [])


def test_capture_time_is_left_out_of_the_forward_times(monkeypatch):
    """Captures made inside a timed forward (here each costs 0.3 s) count for no forward time."""
    runner, cuda = _emulated_graphs(monkeypatch, capture_cost_s=0.3)
    seq = runner.new_sequence(list(range(3, 30)))
    seconds = []
    for new_ids in ([30], [31, 32, 33], [34]):  # widths 1, 4 (a capture each), then a replay
        _, _, elapsed = runner.run_forward(seq, new_ids, len(new_ids))
        seq.n_cached += len(new_ids)
        seconds.append(elapsed)
    assert cuda.captures == 2 and max(seconds) < 0.3
    assert len(runner.static.capture_spans) == 2 and sum(s for _, s in runner.static.capture_spans) >= 0.6


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


# --- against transformers' own decoding ---------------------------------------------------------
def test_every_cache_path_decodes_what_transformers_generate_does(static_llm):
    """Greedy tokens and per-token logits of transformers' `generate` (its own DynamicCache) from
    the batch-1 path, the batched slot cache and the static cache, batched and one by one; the
    model receives every one of these caches as a transformers `Cache`."""
    from transformers import Cache

    from rstitch.engines.base import ForwardRequest

    eager, steps = HFModelRunner(str(LLM_DIR)), 6
    prompts = [[5, 9, 3, 17], [8, 2, 11, 4, 6, 13, 7, 21, 10]]
    base = getattr(eager.model, eager.model.base_model_prefix)
    assert static_llm.model is eager.model  # one set of weights: the hook below sees both runners
    caches: list[Any] = []
    hook = base.register_forward_pre_hook(
        lambda module, args, kwargs: caches.append(kwargs.get("cache", kwargs.get("past_key_values"))), with_kwargs=True)
    try:
        expected = []
        for prompt in prompts:
            out = eager.model.generate(torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                                       output_logits=True, return_dict_in_generate=True, pad_token_id=0)
            expected.append(torch.cat(out.logits)[:, : eager.vocab_size])
        assert all(isinstance(c, Cache) for c in caches) and len(caches) == 2 * steps
        for runner in (eager, static_llm):
            alone = [runner.new_sequence(p) for p in prompts]
            batched = [runner.new_sequence(p) for p in prompts]
            logits: dict[int, list[torch.Tensor]] = {id(s): [] for s in (*alone, *batched)}
            for _ in range(steps):
                results = runner.forward_batch([ForwardRequest(runner, s, s.tokens[s.n_cached:], 1) for s in batched])
                for seq, (row_logits, _hidden) in zip(batched, results):
                    seq.n_cached = len(seq.tokens)
                    logits[id(seq)].append(row_logits[-1])
                for seq in alone:
                    logits[id(seq)].append(seq.next_distribution().logits)
                for seq in (*alone, *batched):
                    seq.append(int(logits[id(seq)][-1].argmax()))
            for seq, want in zip([*alone, *batched], expected * 2):
                assert seq.tokens[-steps:] == want.argmax(-1).tolist()
                assert torch.allclose(torch.stack(logits[id(seq)]), want, atol=1e-3)
    finally:
        hook.remove()
    assert all(isinstance(c, Cache) for c in caches)
    assert {type(c.layers[0]).__name__ for c in caches} == {"DynamicLayer", "_SlotLayer", "_RowsLayer"}
