import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from rstitch.engines import ModelPair, Sampler, TokenDistribution
from rstitch.errors import ConfigError
from rstitch.methods import build_method, easd
from rstitch.methods.base import LLM, SLM
from rstitch.methods.easd import EntropyPenalty, top_overlap
from rstitch.methods.spec_stats import greedy_entropies, mean_of_top_fraction
from rstitch.training.easd_calibration import check_calibration_set, dataset_prompts, validation_prompts

from conftest import run_script
from test_specdec import (  # noqa: F401  (fixtures)
    PROMPTS,
    BigramRunner,
    chain_table,
    decode,
    near_pair,
    single_thread,
)

VOCAB = 20
TAU_H = 1.0


def constructed(top: list[int], spread: bool) -> TokenDistribution:
    """`top` are the five most likely tokens in order; spread: entropy ~2.9 nats, else ~0.01."""
    logits = torch.zeros(VOCAB)
    for rank, token in enumerate(top):
        logits[token] = (1.0 - 0.1 * rank) if spread else (12.0, 3.0, 2.5, 2.0, 1.5)[rank]
    return TokenDistribution(logits)


SHARED_TOP = [0, 1, 2, 3, 4]
FOUR_SHARED_TOP = [0, 1, 2, 3, 9]
THREE_SHARED_TOP = [0, 1, 2, 8, 9]


# --- the penalty decision -----------------------------------------------------------------
def test_constructed_distributions_are_what_the_grid_assumes():
    assert constructed(SHARED_TOP, True).entropy > 2.5 > TAU_H > 0.05 > constructed(SHARED_TOP, False).entropy
    assert top_overlap(constructed(SHARED_TOP, True), constructed(SHARED_TOP, False), 5) == 1.0
    assert top_overlap(constructed(FOUR_SHARED_TOP, True), constructed(SHARED_TOP, True), 5) == 0.8
    assert top_overlap(constructed(THREE_SHARED_TOP, True), constructed(SHARED_TOP, True), 5) == 0.6


@pytest.mark.parametrize(
    "draft_high,target_high,four_shared,use_overlap,use_draft_entropy",
    list(itertools.product([True, False], repeat=5)),
)
def test_penalty_applies_exactly_when_its_conditions_hold(draft_high, target_high, four_shared, use_overlap, use_draft_entropy):
    draft = constructed(FOUR_SHARED_TOP if four_shared else THREE_SHARED_TOP, draft_high)
    target = constructed(SHARED_TOP, target_high)
    rule = EntropyPenalty(TAU_H, top_n=5, tau_o=0.8, use_overlap=use_overlap, use_draft_entropy=use_draft_entropy)
    expected = target_high and (draft_high or not use_draft_entropy) and (four_shared or not use_overlap)
    assert rule.applies(draft, target) is expected


def test_entropy_threshold_is_strict_and_overlap_counts_at_least_tau_o():
    draft, target = constructed(SHARED_TOP, True), constructed(SHARED_TOP, True)
    assert not EntropyPenalty(tau_h=target.entropy).applies(draft, target)  # H = tau_H does not exceed
    assert EntropyPenalty(tau_h=target.entropy - 1e-3).applies(draft, target)
    # tau_O = 0.8 means "at least four of the top 5 coincide" (the paper's text; its equation is strict).
    assert EntropyPenalty(TAU_H, tau_o=0.8).applies(constructed(FOUR_SHARED_TOP, True), target)
    assert not EntropyPenalty(TAU_H, tau_o=0.8).applies(constructed(THREE_SHARED_TOP, True), target)
    assert not EntropyPenalty(TAU_H, tau_o=0.81).applies(constructed(FOUR_SHARED_TOP, True), target)


def test_replacement_zeroes_the_draft_token_and_renormalizes():
    target = TokenDistribution(torch.tensor([1.0, 3.0, 2.0, 0.5]))
    rule = EntropyPenalty(TAU_H)
    sampled = rule.replacement_probs(Sampler(temperature=1.0), target, 1)
    expected = target.probs.clone()
    expected[1] = 0.0
    torch.testing.assert_close(sampled, expected / expected.sum())
    greedy = rule.replacement_probs(Sampler(), target, 1)  # the target's argmax is excluded
    assert int(greedy.argmax()) == 2 and float(greedy.sum()) == 1.0


# --- decoding -----------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_with_unreachable_tau_is_token_identical_to_llm_only(near_pair, k):
    for prompt in PROMPTS:
        out = decode(near_pair, "easd", prompt, k=k, tau_h=1e9)
        assert out.token_ids == decode(near_pair, "llm_only", prompt).token_ids
        assert out.stats["easd_penalties"] == 0 and out.stats["draft_tokens_accepted"] > 0


def uncertain_after_two(draft_row_top: list[int], draft_spread: bool = True) -> ModelPair:
    """Bigram pair over 8 tokens: 1 -> 2 -> {3, 4, 5, 6, 7} (uncertain; 3 then 4 most likely)
    -> 1, every other step near-certain. The draft's row after 2 has top tokens `draft_row_top`
    (3 first), spread (entropy ~1.9 nats) or confident."""
    target = chain_table(8, {1: 2, 3: 1, 4: 1, 0: 1, 5: 1, 6: 1, 7: 1})
    target[2, [3, 4, 5, 6, 7]] = torch.tensor([1.0, 0.9, 0.8, 0.7, 0.6])
    draft = target.clone()
    draft[2] = 0.0
    draft[2, draft_row_top] = torch.tensor([1.0, 0.9, 0.8, 0.7, 0.6] if draft_spread else [14.0, 4.0, 3.0, 2.0, 1.0])
    return ModelPair(BigramRunner(draft, "draft"), BigramRunner(target, "target"))


def test_penalty_changes_output_relative_to_specdec_on_a_constructed_case():
    pair = uncertain_after_two([3, 4, 5, 6, 7])
    specdec = decode(pair, "specdec", [1], budget=9, k=5)
    assert specdec.token_ids == [2, 3, 1] * 3 and specdec.discarded_tokens == 0
    out = decode(pair, "easd", [1], budget=9, k=5, tau_h=1.0)
    # Every block reaches the uncertain step after 2: the draft's 3 is penalized and the target
    # writes its next choice, 4; the last token is the target's own (budget tail, no draft).
    assert out.token_ids == [2, 4, 1] * 3
    assert out.sources == [SLM, LLM, SLM, SLM, LLM, SLM, SLM, LLM, LLM]
    assert out.stats["easd_penalties"] == 3
    assert out.discarded_tokens == out.stats["draft_tokens_proposed"] - out.stats["draft_tokens_accepted"]


@pytest.mark.parametrize(
    "draft_top,draft_spread,params,penalized",
    [
        ([3, 4, 5, 0, 1], True, {}, False),  # 3 of 5 shared: no penalty
        ([3, 4, 5, 6, 0], True, {}, True),  # 4 of 5 shared: the penalty applies at tau_O = 0.8
        ([3, 4, 5, 0, 1], True, {"use_overlap": False}, True),
        ([3, 4, 5, 6, 7], False, {}, False),  # confident draft: no penalty
        ([3, 4, 5, 6, 7], False, {"use_draft_entropy": False}, True),
        ([3, 4, 5, 6, 0], False, {"use_overlap": False, "use_draft_entropy": False}, True),
    ],
)
def test_ablations_on_the_constructed_case(draft_top, draft_spread, params, penalized):
    pair = uncertain_after_two(draft_top, draft_spread)
    out = decode(pair, "easd", [1], budget=9, k=5, tau_h=1.0, **params)
    assert out.token_ids == ([2, 4, 1] if penalized else [2, 3, 1]) * 3
    assert (out.stats["easd_penalties"] > 0) is penalized


def test_penalty_on_real_models(tiny_runners):
    # Identical draft and target: SpecDec accepts everything, so every EASD rejection is a penalty.
    llm = tiny_runners.llm
    pair = ModelPair(llm, llm)
    prompt = PROMPTS[0]
    entropies = greedy_entropies(llm, prompt, 30, llm.eos_token_ids)
    tau = sorted(entropies)[len(entropies) // 2]
    specdec = decode(pair, "specdec", prompt, budget=30, k=4)
    out = decode(pair, "easd", prompt, budget=30, k=4, tau_h=tau)
    assert specdec.discarded_tokens == 0 and out.token_ids != specdec.token_ids
    rejections = sum(out.stats["reached_per_position"]) - sum(out.stats["accepted_per_position"])
    assert out.stats["easd_penalties"] == rejections > 0
    # The first penalized token is the target's second choice (greedy, draft token masked).
    first = next(i for i, (a, b) in enumerate(zip(out.token_ids, specdec.token_ids)) if a != b)
    dist = llm.new_sequence(prompt + out.token_ids[:first]).next_distribution()
    assert dist.entropy > tau and out.sources[first] == LLM
    assert out.token_ids[first] == dist.topk(2)[0][1]


# --- calibration --------------------------------------------------------------------------
def test_mean_of_top_fraction():
    values = [float(v) for v in range(1, 101)]
    assert mean_of_top_fraction(values, 0.05) == pytest.approx(98.0)  # mean of 96..100
    assert mean_of_top_fraction([3.0, 1.0, 2.0], 0.05) == 3.0  # at least one value
    with pytest.raises(ValueError):
        mean_of_top_fraction([], 0.05)


def test_greedy_entropies_follow_the_greedy_trace(tiny_runners):
    llm = tiny_runners.llm
    entropies = greedy_entropies(llm, PROMPTS[0], 20, llm.eos_token_ids)
    trace = decode(tiny_runners, "llm_only", PROMPTS[0], budget=20).token_ids
    scored = llm.new_sequence(PROMPTS[0]).score(trace)[:-1]
    assert len(entropies) == len(trace)
    assert entropies == pytest.approx([d.entropy for d in scored], abs=1e-3)


def test_auto_tau_reads_the_calibration_of_the_pair(tiny_runners, tmp_path):
    user_file = tmp_path / "cache" / "calibration.json"
    method = build_method("easd", tau_h="auto", calibration=str(user_file))
    with pytest.raises(ConfigError) as err:
        method.penalty_for(tiny_runners)
    assert "\n" not in str(err.value) and "calibrate_easd" in str(err.value) and str(user_file) in str(err.value)
    entry = {"tau_h": 1.25, "slm": tiny_runners.slm.name, "llm": tiny_runners.llm.name}
    easd.store_calibration("tiny", entry, user_file)  # creates the folder
    easd.store_calibration("other", {**entry, "slm": "elsewhere", "tau_h": 9.0}, user_file)
    assert build_method("easd", tau_h="auto", calibration=str(user_file)).penalty_for(tiny_runners).tau_h == 1.25
    assert set(json.loads(user_file.read_text())) == {"tiny", "other"}
    user_file.write_text("{not json")
    with pytest.raises(ConfigError, match=r"calibration\.json is not JSON"):
        build_method("easd", tau_h="auto", calibration=str(user_file)).penalty_for(tiny_runners)


def test_the_packaged_calibration_is_read_after_the_users(tiny_runners, tmp_path, monkeypatch):
    """The testbed's entry ships with the package (read-only); a user's entry for the same pair wins."""
    packaged = tmp_path / "packaged.json"
    entry = {"slm": tiny_runners.slm.name, "llm": tiny_runners.llm.name}
    easd.store_calibration("tiny", {**entry, "tau_h": 0.5}, packaged)
    monkeypatch.setattr(easd, "PACKAGED_CALIBRATION", packaged)
    missing = tmp_path / "none.json"
    assert build_method("easd", tau_h="auto", calibration=str(missing)).penalty_for(tiny_runners).tau_h == 0.5
    easd.store_calibration("tiny", {**entry, "tau_h": 2.0}, missing)
    assert build_method("easd", tau_h="auto", calibration=str(missing)).penalty_for(tiny_runners).tau_h == 2.0
    assert json.loads(packaged.read_text())["tiny"]["tau_h"] == 0.5  # never written


def test_the_calibration_file_is_read_through_the_config(monkeypatch, tmp_path):
    from rstitch.cli.run import compose_config

    monkeypatch.setenv("RSTITCH_CACHE", str(tmp_path))
    assert compose_config(["method=easd"])["method"]["calibration"] == f"{tmp_path}/easd_calibration.json"
    monkeypatch.delenv("RSTITCH_CACHE")
    assert compose_config(["method=easd"])["method"]["calibration"] == "~/.cache/rstitch/easd_calibration.json"
    assert easd.user_calibration_file() == Path.home() / ".cache" / "rstitch" / "easd_calibration.json"


@pytest.mark.slow
def test_calibration_script_stores_the_top_five_percent_mean(tiny_pair, tiny_runners, tmp_path):
    out = tmp_path / "calibration.json"
    run_script("calibrate_easd", "--slm", tiny_pair["slm"], "--llm", tiny_pair["llm"], "--pair-name", "tiny",
               "--n", "3", "--max-new-tokens", "12", "--out", str(out))
    entry = json.loads(out.read_text())["tiny"]
    llm = tiny_runners.llm
    prompts = validation_prompts(llm.tokenizer, 3)
    entropies = [h for p in prompts for h in greedy_entropies(llm, p, 12, llm.eos_token_ids)]
    assert entry["n_positions"] == len(entropies) and entry["top_fraction"] == 0.05
    assert entry["tau_h"] == pytest.approx(mean_of_top_fraction(entropies, 0.05), abs=1e-4)
    assert entry["tau_h"] > sum(entropies) / len(entropies)


@pytest.mark.parametrize("dataset", ["math500", "testbed", "gsm8k", "nonsense"])
def test_calibration_refuses_evaluated_benchmarks(dataset):
    with pytest.raises(ConfigError) as err:
        check_calibration_set(dataset)
    assert ("evaluated benchmark" if dataset != "nonsense" else "unknown calibration set") in str(err.value)
    assert "\n" not in str(err.value)
    assert check_calibration_set("limo") == "GAIR/LIMO"


# --- configuration errors -----------------------------------------------------------------
@pytest.mark.parametrize(
    "params",
    [{"k": 0}, {"k": -1}, {"k": 1.5}, {"tau_h": "high"}, {"tau_o": 1.5}, {"top_n": 0}, {"use_overlap": "no"}, {"use_draft_entropy": 1}],
)
def test_bad_config_is_one_clear_error(params):
    with pytest.raises(ConfigError) as err:
        build_method("easd", **params)
    assert "\n" not in str(err.value)


def test_entropies_are_in_nats():
    uniform = TokenDistribution(torch.zeros(VOCAB))
    assert uniform.entropy == pytest.approx(math.log(VOCAB))


def test_calibration_prompts_read_limo_through_the_dataset_loader():
    from rstitch.data.prompts import PromptFormat

    class Chars:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "limo.jsonl"
    fmt = PromptFormat(name="plain", style="plain", template="Q: {problem}\n")
    prompts = dataset_prompts(Chars(), "limo", 1, fmt, str(fixture))
    assert len(prompts) == 1
    assert "".join(map(chr, prompts[0])) == "Q: Find the remainder when $2^{10}$ is divided by 7.\n"
