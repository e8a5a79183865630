"""Runs of tokens (`Sequence.decode_until`): the rule form of a switch policy decodes what its
per-token form decodes, and baselines and step-level methods take the same engine path, so a
speedup compares like with like on every engine (on vLLM: tests/engines/test_vllm_engine.py)."""
from __future__ import annotations

import pytest

from rstitch.data.prompts import PromptFormat
from rstitch.engines import Sampler, Sequence, SwitchRule, load_pair
from rstitch.methods import DecodeContext, build_method
from rstitch.methods.base import LLM, SLM
from rstitch.methods.rstitch import EntropySwitch
from rstitch.methods.token_switch import switch_decode
from rstitch.testbed import LLM_DIR, SLM_DIR, generate_problems

BUDGET = 96


@pytest.fixture(scope="module")
def pair():
    return load_pair({"path": str(SLM_DIR)}, {"path": str(LLM_DIR)}, num_threads=1)


def prompt(pair, seed: int) -> tuple[str, list[int]]:
    [problem] = generate_problems("test", 1, seed=seed)
    return problem.problem, PromptFormat().encode(pair.tokenizer, problem.problem)


class PerToken:
    """A policy's keep/next without its rule: the per-token loop."""

    def __init__(self, policy):
        self.policy, self.want_hidden = policy, policy.want_hidden

    def first(self) -> int:
        return self.policy.first()

    def keep(self, source, dist) -> bool:
        return self.policy.keep(source, dist)

    def next(self, source, dist) -> int:
        return self.policy.next(source, dist)


def books(pair) -> dict:
    return {k: {f: v for f, v in m.cost.as_dict().items() if f != "forward_time_s"} for k, m in pair.models().items()}


def decode_with(pair, policy, seed: int, temperature: float) -> tuple:
    problem, ids = prompt(pair, seed)
    before = books(pair)
    ctx = DecodeContext(pair, Sampler(temperature=temperature, seed=seed), BUDGET, problem=problem)
    result = switch_decode(ids, ctx, policy)
    after = books(pair)
    spent = {k: {f: after[k][f] - before[k][f] for f in after[k]} for k in after}
    return result.token_ids, result.sources, result.finish_reason, result.discarded_tokens, result.switches, spent


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("tau", [0.005, 0.02, 0.2])
@pytest.mark.parametrize("seed", [3, 4])
def test_rule_form_decodes_what_the_per_token_form_decodes(pair, tau, seed, temperature):
    ruled = decode_with(pair, EntropySwitch(tau), seed, temperature)
    assert ruled == decode_with(pair, PerToken(EntropySwitch(tau)), seed, temperature)
    assert tau == 0.2 or ruled[4] > 0  # the rules ended runs


def test_switch_rules_of_rstitch():
    policy = EntropySwitch(0.02)
    slm, llm = policy.rule(SLM), policy.rule(LLM)
    assert slm.crosses(0.03) and not slm.crosses(0.02) and not slm.keep_last
    assert llm.crosses(0.02) and not llm.crosses(0.03) and llm.keep_last
    assert not SwitchRule.never().ends and SwitchRule.never().keep_last


@pytest.mark.parametrize("name", ["llm_only", "slm_only", "rsd", "specreason"])
def test_baselines_and_step_methods_write_their_tokens_through_runs(pair, name, monkeypatch):
    """Every token llm_only writes, and every draft or target step of a step-level method, comes
    from `decode_until` (on vLLM: one native request per run), not from a per-token loop of the
    method's own."""
    written = []
    original = Sequence.decode_until

    def spy(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        written.append(len(result.token_ids))
        return result

    monkeypatch.setattr(Sequence, "decode_until", spy)
    problem, ids = prompt(pair, 5)
    result = build_method(name).decode(ids, DecodeContext(pair, Sampler(), BUDGET, problem=problem))
    assert written and sum(written) >= len(result.token_ids) > 0
    if name.endswith("_only"):
        assert written == [len(result.token_ids)]  # the whole sample is one run
