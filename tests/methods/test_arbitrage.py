import pytest
import torch

from rstitch.engines import Sampler
from rstitch.errors import ConfigError
from rstitch.methods import DecodeContext, build_method
from rstitch.methods.base import LLM, SLM
from rstitch.scorers.arbitrage_router import ArbitrageRouter, encode_router_input, router_pieces
from rstitch.testbed import ASSETS_DIR, generate_problems

from conftest import decode_testbed_problem

PROMPTS = [[5, 6, 7, 8], [20, 21, 9]]
PROBLEM = generate_problems("test", 1, seed=2)[0].problem  # the oracle PRM checks testbed problems
STEP_OPTIONS = {"max_step_tokens": 5, "max_repeats": 0}
ORACLE = {"name": "oracle"}


@pytest.fixture(scope="module")
def router_path(tiny_pair, tmp_path_factory) -> str:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tiny_pair["tokenizer"])
    torch.manual_seed(5)
    model = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, num_labels=2, pad_token_id=tok.pad_token_id,
    ))
    with torch.no_grad():
        model.score.weight.mul_(20.0)  # spread y_hat over (0, 1)
    path = tmp_path_factory.mktemp("router")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def decode(pair, name, prompt=PROMPTS[0], budget=40, **params):
    ctx = DecodeContext(pair, Sampler(), budget, problem=PROBLEM)
    return build_method(name, **{**STEP_OPTIONS, **params}).decode(list(prompt), ctx)


def plain(pair, name, prompt, budget=40):
    return build_method(name).decode(list(prompt), DecodeContext(pair, Sampler(), budget)).token_ids


@pytest.mark.parametrize("prompt", PROMPTS)
def test_oracle_extremes_reproduce_single_models(tiny_runners, prompt):
    always = decode(tiny_runners, "arbitrage_oracle", prompt, tau=float("-inf"), prm=ORACLE)
    never = decode(tiny_runners, "arbitrage_oracle", prompt, tau=float("inf"), prm=ORACLE)
    assert always.token_ids == plain(tiny_runners, "llm_only", prompt) and set(always.sources) == {LLM}
    assert never.token_ids == plain(tiny_runners, "slm_only", prompt) and set(never.sources) == {SLM}
    for out in (always, never):  # the oracle runs and scores both models at every step
        assert out.stats["target_calls"] == out.stats["draft_calls"] == out.stats["steps"]
        assert out.stats["prm_calls"] == 2 * out.stats["steps"]


@pytest.mark.parametrize("tau", [0.0, -0.5])
def test_oracle_escalates_iff_the_target_gains_more_than_tau(tiny_runners, tau):
    out = decode(tiny_runners, "arbitrage_oracle", tau=tau, prm=ORACLE, budget=60)
    gains = [t - s for s, t in zip(out.stats["step_scores"], out.stats["step_target_scores"])]
    assert out.stats["step_decisions"] == ["escalate" if g > tau else "accept" for g in gains]
    assert out.stats["wasted_escalations"] == sum(1 for g in gains if tau < g <= 0)
    assert out.stats["escalations_scored"] == out.stats["escalations"]
    if tau == 0.0:  # only strict gains escalate: the mix the test relies on
        assert {"accept", "escalate"} <= set(out.stats["step_decisions"]) and out.stats["wasted_escalations"] == 0
    else:
        assert out.stats["wasted_escalations"] > 0


@pytest.mark.parametrize("prompt", PROMPTS)
def test_router_extremes_reproduce_single_models(tiny_runners, router_path, prompt):
    never = decode(tiny_runners, "arbitrage", prompt, tau=1.0, router={"path": router_path})
    always = decode(tiny_runners, "arbitrage", prompt, tau=-0.01, router={"path": router_path})
    assert never.token_ids == plain(tiny_runners, "slm_only", prompt) and set(never.sources) == {SLM}
    assert always.token_ids == plain(tiny_runners, "llm_only", prompt) and set(always.sources) == {LLM}
    assert never.stats["target_calls"] == 0 and never.stats["router_calls"] == never.stats["steps"]
    assert never.stats["flops_router"] > 0


def test_router_runs_the_target_only_when_escalating(tiny_runners, router_path):
    scores = decode(tiny_runners, "arbitrage", tau=1.0, router={"path": router_path}).stats["step_scores"]
    tau = sorted(scores)[len(scores) // 2]
    out = decode(tiny_runners, "arbitrage", tau=tau, router={"path": router_path})
    decisions = out.stats["step_decisions"]
    assert {"accept", "escalate"} <= set(decisions)
    assert out.stats["target_calls"] == decisions.count("escalate")
    assert decisions == ["escalate" if y > tau else "accept" for y in out.stats["step_scores"]]
    assert out.discarded_tokens > 0  # the escalated drafts


def test_router_predicts_class_one_at_the_last_token_and_reuses_the_prefix(router_path):
    from transformers import AutoModelForSequenceClassification

    router = ArbitrageRouter(router_path)
    model = AutoModelForSequenceClassification.from_pretrained(router_path).eval()
    history = [(SLM, "4 * 2 = 8"), (LLM, "3 + 8 = 11")]
    ids = encode_router_input(router.tokenizer, "P?", history, "so 11")
    with torch.no_grad():
        expected = torch.softmax(model(torch.tensor([ids])).logits[0], -1)[1]
    assert router.predict("P?", history, "so 11") == pytest.approx(float(expected), abs=1e-5)
    before = router.cost.tokens_processed
    router.predict("P?", history + [(SLM, "so 11")], "done")
    assert router.cost.tokens_processed - before == len("Model 0: done\n\n")
    assert router_pieces("P?", history, "so 11") == ["P?\n", "Model 0: 4 * 2 = 8\n\n", "Model 1: 3 + 8 = 11\n\n", "Model 0: so 11\n\n"]


@pytest.mark.parametrize("name,params", [
    ("arbitrage", {"tau": "x"}), ("arbitrage", {"router": "path"}), ("arbitrage", {"router": {"path": "/nonexistent"}}),
    ("arbitrage", {"router": {"path": None}}),
    ("arbitrage_oracle", {"prm": {"name": "nope"}}), ("arbitrage_oracle", {"tau": None}),
])
def test_bad_config_is_one_clear_error(tiny_runners, name, params):
    with pytest.raises(ConfigError) as err:
        decode(tiny_runners, name, budget=4, **params)
    assert "\n" not in str(err.value)


@pytest.mark.slow  # the testbed PRM scores every step of a 96-token decode: two minutes on two busy cores
def test_testbed_extremes_reproduce_single_models(testbed_pair):
    run = lambda name, **p: decode_testbed_problem(testbed_pair, name, **p)  # noqa: E731
    assert run("arbitrage_oracle", tau=float("-inf")) == run("llm_only")
    assert run("arbitrage", tau=1.0, router={"path": str(ASSETS_DIR / "arbitrage_router")}) == run("slm_only")
