import json

import pytest
import torch

from rstitch.engines import Sampler
from rstitch.errors import ConfigError
from rstitch.latency.model import LatencyModel, estimate_latency, latency_file
from rstitch.methods import DecodeContext, build_method
from rstitch.methods.base import LLM, SLM
from rstitch.methods.rstitch_plus import RouterSwitch, routed_decode
from rstitch.scorers.rstitch_router import CONFIG_FILE, WEIGHTS_FILE, RouterConfig, RStitchRouter, load_router, save_router

PROMPT = [5, 6, 7, 8]
TAU = 0.35  # mixes both models on the tiny pair (see test_methods)


def make_router(pair, seed: int = 0, answer: int | None = None) -> RStitchRouter:
    """A random router whose decisions depend on the hidden state, or a constant one."""
    torch.manual_seed(seed)
    router = RStitchRouter(RouterConfig(pair.slm.hidden_size, pair.llm.hidden_size))
    with torch.no_grad():
        router.head.weight.mul_(50.0)
        if answer is not None:
            router.head.weight.zero_()
            router.head.bias.copy_(torch.tensor([10.0, -10.0] if answer == SLM else [-10.0, 10.0]))
    return router.eval()


def decode(pair, name, budget=50, **params):
    ctx = DecodeContext(pair, Sampler(), budget)
    return build_method(name, **params).decode(list(PROMPT), ctx)


def test_constant_routers_reproduce_rstitch(tiny_runners):
    always_slm = decode(tiny_runners, "rstitch_plus", tau=TAU, router=make_router(tiny_runners, answer=SLM))
    always_llm = decode(tiny_runners, "rstitch_plus", tau=TAU, router=make_router(tiny_runners, answer=LLM))
    rstitch_same_tau = decode(tiny_runners, "rstitch", tau=TAU)
    rstitch_slm_only = decode(tiny_runners, "rstitch", tau=1.0)
    assert set(rstitch_same_tau.sources) == {SLM, LLM} and rstitch_same_tau.token_ids != rstitch_slm_only.token_ids
    assert (always_llm.token_ids, always_llm.sources) == (rstitch_same_tau.token_ids, rstitch_same_tau.sources)
    assert always_llm.discarded_tokens == rstitch_same_tau.discarded_tokens
    assert (always_slm.token_ids, always_slm.sources) == (rstitch_slm_only.token_ids, rstitch_slm_only.sources)
    assert always_slm.stats["router_calls"] > 0 and always_slm.stats["router_llm_choices"] == 0
    assert always_llm.stats["router_llm_choices"] == always_llm.stats["router_calls"] > 0


def test_router_decides_only_at_high_entropy_slm_positions(tiny_runners):
    # Replay Algorithm 1 by hand on fresh sequences: below tau the entropy gate alone decides; an
    # uncertain SLM token goes to the router (reading the SLM's hidden state); an uncertain LLM
    # keeps going, and only a confident token hands back to the SLM.
    router = make_router(tiny_runners, seed=3)
    out = decode(tiny_runners, "rstitch_plus", tau=TAU, router=router, budget=60)
    runners = {SLM: tiny_runners.slm, LLM: tiny_runners.llm}

    def dist_of(source, produced):
        return runners[source].new_sequence(PROMPT + produced, want_hidden=True).next_distribution()

    def route(source, dist):
        nonlocal calls, choices
        calls += 1
        choice = int(router(dist.hidden.unsqueeze(0), source).argmax())
        choices.add(choice)
        return choice

    active, produced, calls, choices = SLM, [], 0, set()
    for token, source in zip(out.token_ids, out.sources):
        dist = dist_of(active, produced)
        if active == SLM and dist.normalized_entropy > TAU and route(SLM, dist) == LLM:
            active, dist = LLM, dist_of(LLM, produced)
        assert (source, token) == (active, dist.argmax)
        produced.append(token)
        if dist.normalized_entropy <= TAU:
            active = SLM
    assert choices == {SLM, LLM}  # the router really chose both ways
    assert out.stats["router_calls"] == calls
    assert out.token_ids != decode(tiny_runners, "rstitch", tau=TAU, budget=60).token_ids


class _Recording(RStitchRouter):
    """Says LLM on SLM states and SLM on LLM states; records whose states it read."""

    def __init__(self, pair):
        super().__init__(RouterConfig(pair.slm.hidden_size, pair.llm.hidden_size))
        self.sources: list[int] = []

    def forward(self, hidden, source):
        self.sources.append(source)
        return torch.tensor([[-10.0, 10.0]]) if source == SLM else torch.tensor([[10.0, -10.0]])


def test_an_uncertain_llm_keeps_writing_and_the_router_reads_slm_states_only(tiny_runners):
    # A router that would send every uncertain LLM position back to the SLM changes nothing: the
    # LLM keeps control until its own token is confident, as in R-Stitch at the same tau.
    router = _Recording(tiny_runners).eval()
    out = decode(tiny_runners, "rstitch_plus", tau=TAU, router=router)
    rstitch = decode(tiny_runners, "rstitch", tau=TAU)
    assert (out.token_ids, out.sources, out.switches) == (rstitch.token_ids, rstitch.sources, rstitch.switches)
    assert router.sources and set(router.sources) == {SLM}


def test_stats_latency_estimate_and_summary(tiny_runners, tmp_path):
    models = {"slm": LatencyModel(0, 0, 1e-3, 2e-3), "llm": LatencyModel(1e-6, 0, 4e-3, 5e-3)}
    for key, model in models.items():
        model.save(latency_file(tmp_path, key))
    router = make_router(tiny_runners, seed=3)
    method = build_method("rstitch_plus", tau=TAU, router=router, latency_dir=str(tmp_path))
    result = method.decode(list(PROMPT), DecodeContext(tiny_runners, Sampler(), 40))
    stats = result.stats
    assert stats["router_calls"] > 0 and stats["router_time_s"] > 0
    # The estimate is the model applied to exactly the forwards the trajectory ran.
    policy = RouterSwitch(router, TAU)
    again, trace = routed_decode(list(PROMPT), DecodeContext(tiny_runners, Sampler(), 40), policy, models)
    assert again.token_ids == result.token_ids and len(trace.forwards) == stats["forwards"]
    assert stats["latency_estimate_s"] == pytest.approx(estimate_latency(trace.forwards, models))
    unprofiled = build_method("rstitch_plus", tau=TAU, router=router).decode(list(PROMPT), DecodeContext(tiny_runners, Sampler(), 40))
    assert "latency_estimate_s" not in unprofiled.stats  # no latency_dir: no estimate (and no testbed default)
    processed = sum(f.n_inf for f in trace.forwards)
    assert processed >= len(PROMPT) + len(result.token_ids) - 1  # every output token reached a model

    samples = [{"latency_s": 0.5, "stats": stats}, {"latency_s": 0.25, "stats": {**stats, "router_calls": 0, "router_time_s": 0.0}}]
    summary = method.summarize(samples)
    assert summary["router_ms_per_call"] == pytest.approx(1000 * stats["router_time_s"] / stats["router_calls"])
    assert summary["router_calls"] == pytest.approx(stats["router_calls"] / 2)
    assert summary["trace_latency_estimate_rel_error"] == pytest.approx(
        (abs(stats["latency_estimate_s"] - 0.5) / 0.5 + abs(stats["latency_estimate_s"] - 0.25) / 0.25) / 2)


def test_sampled_router_is_seeded_and_differs_from_argmax(tiny_runners):
    router = make_router(tiny_runners, seed=3)
    with torch.no_grad():
        router.head.weight.mul_(0.01)  # a near-uniform policy: sampling must matter
    runs = [decode(tiny_runners, "rstitch_plus", tau=TAU, router=router, sample_router=True, seed=s).sources for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_checkpoint_round_trip(tiny_runners, tmp_path):
    router = make_router(tiny_runners, seed=5)
    save_router(router, tmp_path / "r", metadata={"steps": 3})
    assert (tmp_path / "r" / WEIGHTS_FILE).is_file()
    config = json.loads((tmp_path / "r" / CONFIG_FILE).read_text())
    assert config["num_parameters"] == router.num_parameters() and config["metadata"] == {"steps": 3}
    loaded = load_router(tmp_path / "r")
    hidden = torch.randn(3, tiny_runners.slm.hidden_size)
    torch.testing.assert_close(loaded(hidden), router(hidden))
    from_path = decode(tiny_runners, "rstitch_plus", tau=TAU, router=str(tmp_path / "r"))
    assert from_path.token_ids == decode(tiny_runners, "rstitch_plus", tau=TAU, router=router).token_ids


def test_default_tau_is_the_one_the_router_was_trained_at(tiny_runners, tmp_path):
    router = make_router(tiny_runners)
    save_router(router, tmp_path / "trained", metadata={"config": {"tau": 0.2}})
    save_router(router, tmp_path / "untagged")
    assert build_method("rstitch_plus", router=str(tmp_path / "trained")).tau == 0.2
    assert build_method("rstitch_plus", router=str(tmp_path / "trained"), tau=0.05).tau == 0.05
    assert build_method("rstitch_plus", router=str(tmp_path / "untagged")).tau == 0.001
    assert build_method("rstitch_plus", router=router).tau == 0.001


def test_width_rule_and_batched_log_probs():
    paper = RStitchRouter(RouterConfig(1536, 3584))  # R1-1.5B's states, the 7B's width
    assert paper.config.width == 45
    assert paper.num_parameters() == (1536 * 45 + 45) + 6 * (45 * 45 + 45) + 2 * 45 + (45 * 2 + 2)
    router = RStitchRouter(RouterConfig(8, 12))
    hidden = torch.randn(4, 12)  # SLM states zero-padded to a wider batch
    hidden[:, 8:] = 0.0
    batched = router.log_probs(hidden, torch.tensor([SLM] * 4))
    for i in range(4):
        torch.testing.assert_close(batched[i], torch.log_softmax(router(hidden[i:i + 1, :8])[0], -1))
    with pytest.raises(ValueError, match="SLM hidden states only"):
        router.log_probs(hidden, torch.tensor([SLM, LLM, SLM, SLM]))


def test_router_has_no_llm_projection_and_bills_only_what_algorithm_1_runs(tiny_runners, tmp_path):
    """Algorithm 1 consults the router on SLM states only: its parameters, and the FLOPs billed per
    call, are the SLM's input projection, the trunk and the head (no LLM input projection)."""
    shipped = load_router(_shipped_router())  # written with an LLM projection: still loads
    width, slm = shipped.config.width, shipped.config.slm_hidden
    trunk_and_head = 6 * (width * width + width) + 2 * width + (width * 2 + 2)
    assert shipped.num_parameters() == slm * width + width + trunk_and_head
    assert not any("inputs.1" in name for name, _ in shipped.named_parameters())
    old_layout = {k: v for k, v in shipped.state_dict().items()}  # as saved before: two projections
    old_layout = {("inputs.0." + k[len("input."):] if k.startswith("input.") else k): v for k, v in old_layout.items()}
    old_layout["inputs.1.weight"], old_layout["inputs.1.bias"] = torch.ones(width, 112), torch.ones(width)
    from safetensors.torch import save_file
    save_router(shipped, tmp_path / "old")
    save_file({k: v.contiguous() for k, v in old_layout.items()}, tmp_path / "old" / WEIGHTS_FILE)
    hidden = torch.randn(2, slm)
    torch.testing.assert_close(load_router(tmp_path / "old")(hidden), shipped(hidden))
    router = make_router(tiny_runners)
    out = decode(tiny_runners, "rstitch_plus", tau=TAU, router=router)
    assert out.stats["router_calls"] > 0
    assert out.stats["flops_router"] == 2 * router.num_parameters() * out.stats["router_calls"]
    width = router.config.width
    assert router.num_parameters() == (tiny_runners.slm.hidden_size + 1) * width + 6 * (width * width + width) + 2 * width + (width * 2 + 2)


def _shipped_router():
    from rstitch.testbed import ASSETS_DIR
    return ASSETS_DIR / "rstitch_router"


def test_bad_configs_are_one_clear_error(tiny_runners, tmp_path):
    with pytest.raises(ConfigError, match="no router checkpoint"):
        build_method("rstitch_plus", router=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="method.router of 'rstitch_plus' is not set"):
        build_method("rstitch_plus")  # no default path into the testbed: the config names the router
    wrong = RStitchRouter(RouterConfig(8, tiny_runners.llm.hidden_size))
    with pytest.raises(ConfigError, match="SLM hidden size"):
        decode(tiny_runners, "rstitch_plus", router=wrong)
