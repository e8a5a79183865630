import copy
import itertools
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from rstitch.engines import ModelPair, ModelRunner, Sampler, Sequence
from rstitch.errors import ConfigError
from rstitch.methods import DecodeContext, build_method
from rstitch.methods.base import LLM, SLM
from rstitch.methods.spec_stats import greedy_consistency, summarize_spec
from rstitch.methods.specdec import SpecDec, residual_distribution, verify_draft_token

from conftest import run_script

PROMPTS = [[5, 6, 7, 8], [20, 21, 9], [30, 40, 50, 60, 70]]
BUDGET = 40


# --- a bigram "model": exact distributions, microseconds per forward ----------------------
class BigramSequence(Sequence):
    def _forward(self, new_ids, keep):
        return self.runner.table[new_ids[-keep:]], None

    def _crop(self, n_keep):
        pass  # no cache: the logits depend on the current token only


class BigramRunner(ModelRunner):
    """Next-token logits are a row of `table` picked by the last token."""

    def __init__(self, table: torch.Tensor, name: str, eos: tuple[int, ...] = ()):
        super().__init__()
        self.table, self.name = table, name
        self.tokenizer = None
        self.vocab_size = table.shape[0]
        self.num_parameters, self.hidden_size = table.numel(), 0
        self.eos_token_ids = list(eos)

    def new_sequence(self, prompt_ids, want_hidden=False):
        return BigramSequence(self, prompt_ids, want_hidden)


def chain_table(vocab: int, successor: dict[int, int], strength: float = 20.0) -> torch.Tensor:
    """Logits that make `successor[t]` the near-certain next token after t."""
    table = torch.zeros(vocab, vocab)
    for token, following in successor.items():
        table[token, following] = strength
    return table


# --- helpers ------------------------------------------------------------------------------
def decode(pair, name, prompt, budget=BUDGET, temperature=0.0, top_p=1.0, seed=0, **params):
    ctx = DecodeContext(pair, Sampler(temperature=temperature, top_p=top_p, seed=seed), budget)
    return build_method(name, **params).decode(list(prompt), ctx)


def near_copy_pair(tmp_path_factory, tiny_pair, noise: float = 0.05) -> ModelPair:
    """The tiny LLM as target and a slightly perturbed copy of it as draft: they agree on most,
    not all, tokens, so acceptance and rejection both happen."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from rstitch.engines import load_pair

    out = tmp_path_factory.mktemp("near_draft")
    model = LlamaForCausalLM.from_pretrained(tiny_pair["llm"])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(noise * weight.std() * torch.randn(weight.shape, generator=generator))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_pair["llm"]).save_pretrained(out)
    return load_pair({"path": str(out), "name": "near-draft"}, {"path": tiny_pair["llm"]})


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Tiny models: intra-op threads only add synchronization (and contention on shared CPUs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def near_pair(tmp_path_factory, tiny_pair):
    return near_copy_pair(tmp_path_factory, tiny_pair)


@pytest.fixture(scope="module")
def greedy_reference(near_pair, tiny_runners):
    """llm_only outputs per (pair, prompt), computed once."""
    return {
        (id(pair), tuple(prompt)): decode(pair, "llm_only", prompt)
        for pair, prompt in itertools.product([near_pair, tiny_runners], PROMPTS)
    }


def total_variation(counts: Counter, probs: dict, n: int) -> float:
    keys = set(counts) | set(probs)
    return 0.5 * sum(abs(counts.get(t, 0) / n - probs.get(t, 0.0)) for t in keys)


def chi_square_pvalue(counts: Counter, probs: dict, n: int, min_expected: float = 5.0) -> float:
    """Chi-square goodness of fit; cells with a small expected count are pooled."""
    big = [t for t, p in probs.items() if p * n >= min_expected]
    observed = [counts.get(t, 0) for t in big] + [n - sum(counts.get(t, 0) for t in big)]
    expected = [probs[t] * n for t in big] + [n - sum(probs[t] * n for t in big)]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    scale = sum(observed) / sum(expected)  # float32 probabilities do not sum to exactly 1
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


# --- the acceptance kernel ----------------------------------------------------------------
def test_kernel_output_follows_target_distribution():
    p = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.10, 0.00])
    q = torch.tensor([0.10, 0.40, 0.05, 0.05, 0.20, 0.20])  # q has mass where p has none
    sampler = Sampler(temperature=1.0, seed=7)
    n = 12000
    counts, accepted = Counter(), 0
    for _ in range(n):
        token = sampler.sample_from(q)
        replacement = verify_draft_token(p, q, token, sampler)
        accepted += replacement is None
        counts[token if replacement is None else replacement] += 1
    target = {i: float(v) for i, v in enumerate(p)}
    assert abs(accepted / n - float(torch.minimum(p, q).sum())) < 0.02  # P(accept) = 1 - TV(p, q)
    assert counts[5] == 0
    assert total_variation(counts, target, n) < 0.02
    assert chi_square_pvalue(counts, target, n) > 1e-3
    draft_only = {i: float(v) for i, v in enumerate(q)}
    assert chi_square_pvalue(counts, draft_only, n) < 1e-6  # the test can tell the two apart


def test_kernel_under_greedy_is_argmax_equality():
    greedy = Sampler()
    p = greedy.probs_from_logits(torch.tensor([0.1, 3.0, 0.5]))
    q_same = greedy.probs_from_logits(torch.tensor([0.0, 2.0, 1.0]))
    q_other = greedy.probs_from_logits(torch.tensor([0.0, 1.0, 2.0]))
    assert verify_draft_token(p, q_same, 1, greedy) is None
    assert verify_draft_token(p, q_other, 2, greedy) == 1
    assert torch.equal(residual_distribution(p, q_other), p)


# --- losslessness -------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_is_token_identical_to_llm_only(near_pair, tiny_runners, greedy_reference, k):
    accepted = discarded = 0
    for pair, prompt in itertools.product([near_pair, tiny_runners], PROMPTS):
        reference = greedy_reference[id(pair), tuple(prompt)]
        out = decode(pair, "specdec", prompt, k=k)
        assert out.token_ids == reference.token_ids
        assert out.finish_reason == reference.finish_reason
        accepted += out.stats["draft_tokens_accepted"]
        discarded += out.discarded_tokens
    assert accepted > 0 and discarded > 0  # both branches of the verification ran


def test_sampled_tokens_follow_the_target_distribution_end_to_end():
    # Random bigram draft and target over 6 tokens, k=3 with a budget of 3: the first block
    # drafts 2 tokens; the joint law of the first two output tokens must be the target's.
    vocab = 6
    generator = torch.Generator().manual_seed(3)
    target_table = torch.randn(vocab, vocab, generator=generator) * 1.5
    draft_table = torch.randn(vocab, vocab, generator=generator) * 1.5
    pair = ModelPair(BigramRunner(draft_table, "draft"), BigramRunner(target_table, "target"))
    sampler = Sampler(temperature=1.2, seed=11)
    ctx = DecodeContext(pair, sampler, 3)
    method = build_method("specdec", k=3)
    n = 5000
    counts, accepted = Counter(), 0
    for _ in range(n):
        out = method.decode([0], ctx)
        counts[tuple(out.token_ids[:2])] += 1
        accepted += out.stats["draft_tokens_accepted"]
    p = sampler.probs_from_logits(target_table)  # row t: p(next | t)
    exact = {(a, b): float(p[0, a] * p[a, b]) for a in range(vocab) for b in range(vocab)}
    assert 0.1 * n < accepted < 1.9 * n  # acceptance and rejection both common
    assert chi_square_pvalue(counts, exact, n) > 1e-3
    q = sampler.probs_from_logits(draft_table)
    draft_law = {(a, b): float(q[0, a] * q[a, b]) for a in range(vocab) for b in range(vocab)}
    assert chi_square_pvalue(counts, draft_law, n) < 1e-6


def test_sampling_on_real_models_matches_target_first_token(tiny_runners):
    prompt = [10, 11]
    sampler = Sampler(temperature=2.5, top_p=0.95, seed=5)
    ctx = DecodeContext(tiny_runners, sampler, 2)
    method = build_method("specdec", k=1)
    n = 400
    counts = Counter(method.decode(prompt, ctx).token_ids[0] for _ in range(n))
    p = sampler.probs_from_logits(tiny_runners.llm.new_sequence(prompt).next_distribution().logits)
    q = sampler.probs_from_logits(tiny_runners.slm.new_sequence(prompt).next_distribution().logits)
    target = {i: float(v) for i, v in enumerate(p) if v > 0}
    assert 0.5 * float((p - q).abs().sum()) > 0.5  # far from the draft: rejections matter
    assert total_variation(counts, target, n) < 0.15
    assert chi_square_pvalue(counts, target, n) > 1e-3


def test_matches_transformers_assisted_generation(near_pair, tiny_runners):
    from rstitch.engines.hf_generate import hf_assisted_generate

    for pair, k in ((near_pair, 3), (near_pair, 5), (tiny_runners, 5)):
        for prompt in PROMPTS[:2]:
            ours = decode(pair, "specdec", prompt, k=k).token_ids
            assert ours == hf_assisted_generate(pair, prompt, k, BUDGET)


# --- budget, EOS, caches ------------------------------------------------------------------
@pytest.mark.parametrize("budget", [1, 2, 6, 7, 13])
def test_budget_is_respected_exactly(near_pair, budget):
    out = decode(near_pair, "specdec", PROMPTS[0], budget=budget, k=5)
    reference = decode(near_pair, "llm_only", PROMPTS[0], budget=budget)
    assert out.token_ids == reference.token_ids
    assert len(out.token_ids) == budget and out.finish_reason == "length"


def test_stops_at_eos_inside_an_accepted_block():
    # Draft and target agree on the chain 1 -> 2 -> 3 -> 0 (EOS) -> 4: the draft stops proposing
    # at EOS and the output ends there, mid-block, with no bonus token.
    table = chain_table(5, {1: 2, 2: 3, 3: 0, 0: 4, 4: 4})
    pair = ModelPair(BigramRunner(table, "draft", eos=(0,)), BigramRunner(table, "target", eos=(0,)))
    out = decode(pair, "specdec", [1], budget=10, k=5)
    assert out.token_ids == [2, 3, 0] and out.finish_reason == "eos"
    assert out.sources == [SLM, SLM, SLM]
    assert out.stats["draft_tokens_proposed"] == 3 and out.stats["verifications"] == 1


def test_eos_from_target_mid_block():
    # The draft thinks 2 -> 3 but the target says 2 -> 0 (EOS): the target's EOS ends the output.
    draft = chain_table(5, {1: 2, 2: 3, 3: 4, 4: 4})
    target = chain_table(5, {1: 2, 2: 0, 3: 4, 4: 4})
    pair = ModelPair(BigramRunner(draft, "draft", eos=(0,)), BigramRunner(target, "target", eos=(0,)))
    out = decode(pair, "specdec", [1], budget=10, k=4)
    assert out.token_ids == [2, 0] and out.sources == [SLM, LLM] and out.finish_reason == "eos"
    assert out.discarded_tokens == 3  # drafted 3, 4, 4 after the accepted 2


def reference_greedy_specdec(pair, prompt, k, budget, eos):
    """Greedy SpecDec with fresh sequences per step (no cache reuse): output and sources."""
    output, sources = [], []
    while len(output) < budget:
        drafted = []
        for _ in range(min(k, budget - len(output) - 1)):
            drafted.append(pair.slm.new_sequence(prompt + output + drafted).next_distribution().argmax)
            if drafted[-1] in eos:
                break
        for token in drafted:
            best = pair.llm.new_sequence(prompt + output).next_distribution().argmax
            output.append(best)
            sources.append(SLM if best == token else LLM)
            if best != token or best in eos:
                break
        else:
            output.append(pair.llm.new_sequence(prompt + output).next_distribution().argmax)
            sources.append(LLM)
        if output[-1] in eos:
            break
    return output, sources


def test_cache_reuse_matches_fresh_sequences_and_skips_redundant_forwards(near_pair):
    prompt, k = PROMPTS[1], 3
    slm_before, llm_before = near_pair.slm.cost.copy(), near_pair.llm.cost.copy()
    out = decode(near_pair, "specdec", prompt, budget=30, k=k)
    slm_cost, llm_cost = near_pair.slm.cost.since(slm_before), near_pair.llm.cost.since(llm_before)
    eos = set(near_pair.llm.eos_token_ids) | set(near_pair.slm.eos_token_ids)
    assert (out.token_ids, out.sources) == reference_greedy_specdec(near_pair, prompt, k, 30, eos)
    # One target forward per block, one draft forward per drafted token, nothing re-processed.
    assert llm_cost.forward_calls == out.stats["target_forward_calls"]
    assert slm_cost.forward_calls == out.stats["draft_tokens_proposed"]
    assert slm_cost.tokens_processed <= len(prompt) + len(out.token_ids) + out.discarded_tokens
    assert llm_cost.tokens_processed <= len(prompt) + len(out.token_ids) + out.discarded_tokens


def test_speculative_decoder_accepts_every_token_of_an_identical_draft(tiny_runners):
    llm = tiny_runners.llm
    ctx = DecodeContext(ModelPair(llm, llm), Sampler(), 24)
    out = SpecDec(4).decode(PROMPTS[0], ctx)
    assert out.finish_reason == "length"
    assert out.stats["acceptance_rate"] == 1.0 and out.discarded_tokens == 0
    assert out.stats["target_forward_calls"] == 5  # 24 tokens = 4 blocks of 5 + one of 4
    assert out.sources == ([SLM] * 4 + [LLM]) * 4 + [SLM] * 3 + [LLM]


# --- statistics ---------------------------------------------------------------------------
def test_result_fields_and_per_position_statistics(near_pair):
    k = 4
    out = decode(near_pair, "specdec", PROMPTS[0], budget=BUDGET, k=k)
    stats = out.stats
    assert out.sources.count(SLM) == stats["draft_tokens_accepted"]
    assert out.discarded_tokens == stats["draft_tokens_proposed"] - stats["draft_tokens_accepted"]
    assert out.switches == stats["verifications"]
    assert sum(stats["accepted_per_position"]) == stats["draft_tokens_accepted"]
    # Position 0 is reached by every verification; later ones only after acceptances.
    assert stats["reached_per_position"][0] == stats["verifications"]
    for i in range(1, k):
        assert stats["reached_per_position"][i] <= stats["accepted_per_position"][i - 1]
    assert stats["mean_accepted_length"] == pytest.approx(stats["draft_tokens_accepted"] / stats["verifications"])


def test_summarize_pools_counts_over_samples(near_pair):
    outs = [decode(near_pair, "specdec", p, budget=BUDGET, k=3) for p in PROMPTS]
    records = [{"tokens": len(o.token_ids), "stats": o.stats} for o in outs]
    summary = build_method("specdec", k=3).summarize(records)
    accepted = sum(o.stats["draft_tokens_accepted"] for o in outs)
    proposed = sum(o.stats["draft_tokens_proposed"] for o in outs)
    assert summary["spec_acceptance_rate"] == pytest.approx(accepted / proposed)
    at0 = sum(o.stats["accepted_per_position"][0] for o in outs) / sum(o.stats["reached_per_position"][0] for o in outs)
    assert summary["spec_acceptance_rate_per_position"][0] == pytest.approx(at0)
    assert summary["spec_tokens_per_target_forward"] > 1.0
    assert summarize_spec([{"tokens": 3, "stats": {}}]) == {}


def test_token_consistency(near_pair, tiny_runners):
    llm = tiny_runners.llm
    matches, positions = greedy_consistency(ModelPair(llm, llm), PROMPTS[0], 25)
    assert matches == positions == 25
    matches, positions = greedy_consistency(near_pair, PROMPTS[0], 25)
    trace = decode(near_pair, "llm_only", PROMPTS[0], budget=25).token_ids
    expected = sum(
        near_pair.slm.new_sequence(PROMPTS[0] + trace[:i]).next_distribution().argmax == trace[i] for i in range(len(trace))
    )
    assert (matches, positions) == (expected, len(trace)) and 0 < matches < positions


@pytest.mark.slow
def test_token_consistency_script_prints_the_pooled_fraction(tiny_pair, near_pair):
    from rstitch.data import load_dataset_records
    from rstitch.data.prompts import PromptFormat

    proc = run_script("token_consistency", "--pair-slm", near_pair.slm.path, "--pair-llm", tiny_pair["llm"],
                      "--pair-name", "near", "--dataset", "testbed", "--limit", "2", "--max-new-tokens", "10",
                      "--option", "split=validation")
    row = proc.stdout.strip().splitlines()[-1].split()
    records = load_dataset_records("testbed", limit=2, split="validation")
    counts = [greedy_consistency(near_pair, PromptFormat().encode(near_pair.tokenizer, r.problem), 10) for r in records]
    assert row[:3] == ["near", "testbed", "2"] and int(row[3]) == sum(n for _, n in counts)
    assert float(row[4]) == pytest.approx(sum(m for m, _ in counts) / sum(n for _, n in counts), abs=1e-4)


# --- configuration errors -----------------------------------------------------------------
@pytest.mark.parametrize("k", [0, -2, 2.5, "5", True])
def test_bad_k_is_one_clear_error(k):
    with pytest.raises(ConfigError) as err:
        build_method("specdec", k=k)
    assert "\n" not in str(err.value) and "k" in str(err.value)


def test_vocabulary_mismatch_is_one_clear_error(tiny_runners):
    smaller = copy.copy(tiny_runners.slm)
    smaller.vocab_size = tiny_runners.llm.vocab_size - 1
    with pytest.raises(ConfigError) as err:
        decode(ModelPair(smaller, tiny_runners.llm), "specdec", PROMPTS[0], k=3)
    assert "\n" not in str(err.value) and "vocabulary" in str(err.value)
