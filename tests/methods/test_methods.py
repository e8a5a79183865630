import pytest

from rstitch.engines import Sampler
from rstitch.errors import ConfigError
from rstitch.methods import BASELINE_ROLES, FAMILIES, METHODS, DecodeContext, Method, baseline_method, build_method, method_rank
from rstitch.methods.base import LLM, SLM, register_method

PROMPTS = [[5, 6, 7, 8], [20, 21, 9], [30, 40, 50, 60, 70]]


def decode(pair, name, budget=40, temperature=0.0, seed=0, prompt=PROMPTS[0], **params):
    ctx = DecodeContext(pair, Sampler(temperature=temperature, seed=seed), budget)
    return build_method(name, **params).decode(list(prompt), ctx)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_rstitch_extreme_thresholds_reproduce_single_models(tiny_runners, prompt):
    llm = decode(tiny_runners, "llm_only", prompt=prompt)
    slm = decode(tiny_runners, "slm_only", prompt=prompt)
    assert llm.token_ids != slm.token_ids  # the invariant below must be able to fail
    high = decode(tiny_runners, "rstitch", tau=1.0, prompt=prompt)
    low = decode(tiny_runners, "rstitch", tau=-0.1, prompt=prompt)
    assert high.token_ids == slm.token_ids and set(high.sources) == {SLM}
    assert low.token_ids == llm.token_ids and set(low.sources) == {LLM}


def test_rstitch_mid_threshold_mixes_and_follows_algorithm_1(tiny_runners):
    # Replay the rule by hand with fresh sequences: SLM keeps a token iff H <= tau; the LLM
    # writes rejected positions and hands back after a token with H <= tau.
    tau = 0.35
    out = decode(tiny_runners, "rstitch", tau=tau, budget=60)
    assert set(out.sources) == {SLM, LLM}
    prompt = PROMPTS[0]
    active, produced = SLM, []
    for token, source in zip(out.token_ids, out.sources):
        runner = tiny_runners.slm if active == SLM else tiny_runners.llm
        dist = runner.new_sequence(prompt + produced).next_distribution()
        if active == SLM and dist.normalized_entropy > tau:
            active = LLM
            dist = tiny_runners.llm.new_sequence(prompt + produced).next_distribution()
        assert source == active and token == dist.argmax
        produced.append(token)
        active = SLM if dist.normalized_entropy <= tau else active
    assert out.switches >= out.discarded_tokens > 0


def test_random_extremes(tiny_runners):
    assert decode(tiny_runners, "random", p=1.0).token_ids == decode(tiny_runners, "slm_only").token_ids
    assert decode(tiny_runners, "random", p=0.0).token_ids == decode(tiny_runners, "llm_only").token_ids
    mixed = decode(tiny_runners, "random", p=0.5)
    assert set(mixed.sources) == {SLM, LLM}


def test_sampling_is_reproducible_per_seed(tiny_runners):
    a = decode(tiny_runners, "rstitch", tau=0.3, temperature=1.0, seed=3)
    b = decode(tiny_runners, "rstitch", tau=0.3, temperature=1.0, seed=3)
    c = decode(tiny_runners, "rstitch", tau=0.3, temperature=1.0, seed=4)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_budget_is_respected(tiny_runners):
    out = decode(tiny_runners, "rstitch", tau=0.3, budget=7)
    assert len(out.token_ids) <= 7


@pytest.mark.parametrize("name,params", [("rstitch", {"tau": "abc"}), ("random", {"p": 2.0}), ("nope", {}), ("rstitch", {"bogus": 1})])
def test_bad_method_config_is_one_clear_error(name, params):
    with pytest.raises(ConfigError) as err:
        build_method(name, **params)
    assert "\n" not in str(err.value)


def test_every_method_declares_its_family_and_the_baselines_their_roles():
    assert all(cls.family in FAMILIES for cls in METHODS.values())
    assert {name: cls.baseline for name, cls in METHODS.items() if cls.baseline} == {"llm_only": "target", "slm_only": "draft"}
    assert baseline_method() == "llm_only" and [baseline_method(r) for r in BASELINE_ROLES] == ["llm_only", "slm_only"]
    assert sorted(METHODS, key=method_rank)[:3] == ["llm_only", "slm_only", "arbitrage"]
    assert {n for n, c in METHODS.items() if c.family == "speculative"} == {"specdec", "easd"}


class _Unregistered(Method):
    def decode(self, prompt_ids, ctx):
        raise NotImplementedError


@pytest.mark.parametrize("attrs,message", [({}, "must declare family"), ({"family": "tokens"}, "must declare family"),
                                           ({"family": "token", "baseline": "target"}, "taken by 'llm_only'"),
                                           ({"family": "token", "baseline": "oracle"}, "baseline must be None or one of")])
def test_registration_refuses_missing_or_clashing_metadata(attrs, message):
    cls = type("Candidate", (_Unregistered,), attrs)
    with pytest.raises(ValueError, match=message):
        register_method("candidate")(cls)
    assert "candidate" not in METHODS


def test_build_method_checks_parameters_by_signature_and_lets_bugs_through(monkeypatch):
    class Buggy(_Unregistered):
        family = "token"

        def __init__(self, tau: float = 0.1):
            raise TypeError("a bug inside the constructor")

    monkeypatch.setitem(METHODS, "buggy", Buggy)
    with pytest.raises(TypeError, match="a bug inside"):  # not reported as a config error
        build_method("buggy", tau=0.2)
    with pytest.raises(ConfigError, match="method 'buggy': .*unexpected keyword argument 'k'"):
        build_method("buggy", k=1)
    # Step-level methods pass **options on to their base class: checked there, listing the valid ones.
    with pytest.raises(ConfigError, match=r"method 'specreason_decode': unknown parameter bogus; valid: .*first_n_by_base.*max_steps"):
        build_method("specreason_decode", bogus=1)
