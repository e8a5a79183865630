"""R-Stitch+: R-Stitch's entropy gate with a learned router at the uncertain positions (R-Stitch §3.3;
Algorithm 1 in appendix A.3, the R-Stitch+ branch; the router of appendix A.13; docs/rstitch-plus.md).
A router that always answers LLM is R-Stitch at the same tau; one that always answers SLM is
SLM-only decoding. It is trained with DAPO (`scripts/train_router.py`, eqs. 3-8).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rstitch.engines import TokenDistribution
from rstitch.errors import ConfigError
from rstitch.latency.model import ForwardTrace, LatencyModel, estimate_latency, load_pair_latency
from rstitch.methods.base import (
    EXTRA_FLOPS,
    LLM,
    SLM,
    DecodeContext,
    DecodeResult,
    Method,
    model_flops,
    register_method,
    require_int,
    require_number,
)
from rstitch.methods.token_switch import SwitchPolicy, switch_decode
from rstitch.scorers.rstitch_router import RStitchRouter, load_router, router_metadata

PAPER_TAU = 0.001


@dataclass
class RouterDecision:
    """One router call, kept for policy-gradient training."""

    source: int  # whose hidden state the router read (always the SLM under Algorithm 1)
    hidden: torch.Tensor  # [H_source]
    action: int  # SLM or LLM
    log_prob: float  # of `action` under the policy that chose it


class RouterSwitch(SwitchPolicy):
    """The R-Stitch+ `SwitchPolicy` (Algorithm 1, lines 10-22): the router is consulted only while
    the SLM is active and uncertain. `sample=True` draws its actions (training rollouts)."""

    want_hidden = True

    def __init__(self, router: RStitchRouter, tau: float, sample: bool = False,
                 generator: torch.Generator | None = None, record: bool = False):
        self.router, self.tau, self.sample = router, tau, sample
        self.device = next(router.parameters()).device  # hidden states may live on the GPU
        self.generator = generator
        self.record = record
        self.decisions: list[RouterDecision] = []
        self.calls = 0
        self.llm_choices = 0
        self.seconds = 0.0

    def keep(self, source: int, dist: TokenDistribution) -> bool:
        if source == LLM or dist.normalized_entropy <= self.tau:
            return True
        assert dist.hidden is not None, "want_hidden: the SLM's distributions carry its hidden state"
        return self.route(SLM, dist.hidden) == SLM

    def next(self, source: int, dist: TokenDistribution) -> int:
        # An uncertain LLM keeps going; only a confident token hands back to the SLM (Algorithm 1).
        return SLM if dist.normalized_entropy <= self.tau else source

    @torch.inference_mode()
    def route(self, source: int, hidden: torch.Tensor) -> int:
        start = time.perf_counter()
        hidden = hidden.to(self.device)
        logits = self.router(hidden.unsqueeze(0), source)[0]
        if self.sample:
            action = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=self.generator))
        else:
            action = int(logits.argmax())
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.llm_choices += action == LLM
        if self.record:
            log_prob = float(torch.log_softmax(logits, -1)[action])
            self.decisions.append(RouterDecision(source, hidden.clone(), action, log_prob))
        return action

    def stats(self) -> dict[str, Any]:
        # Each call runs the router once on one hidden state: its FLOPs count in the sample's.
        flops = model_flops(self.router.num_parameters(), self.calls)
        return {"router_calls": self.calls, "router_llm_choices": self.llm_choices, "router_time_s": self.seconds,
                "flops_router": flops, EXTRA_FLOPS: flops}


def routed_decode(prompt_ids: list[int], ctx: DecodeContext, policy: RouterSwitch,
                  latency: Mapping[str, LatencyModel] | None = None) -> tuple[DecodeResult, ForwardTrace]:
    """Decode with `policy`, logging every forward (the trajectory's latency estimate, with models)."""
    trace = ForwardTrace()
    traced_ctx = DecodeContext(trace.wrap(ctx.pair), ctx.sampler, ctx.max_new_tokens, ctx.problem, ctx.metadata)
    result = switch_decode(prompt_ids, traced_ctx, policy)
    result.stats.update(policy.stats())
    result.stats["forwards"] = len(trace.forwards)
    if latency is not None:
        result.stats["latency_estimate_s"] = estimate_latency(trace.forwards, latency)
    return result, trace


@register_method("rstitch_plus")
class RStitchPlus(Method):
    family = "token"
    reads_hidden_states = True  # the router reads the SLM's last hidden state

    def __init__(self, tau: float | None = None, router: str | RStitchRouter | None = None, sample_router: bool = False,
                 seed: int = 0, latency_dir: str | None = None):
        trained_tau = None
        if isinstance(router, RStitchRouter):
            self.router = router
        elif router:
            if not (Path(router) / "config.json").is_file():
                raise ConfigError(f"rstitch_plus: no router checkpoint at {router} (train one with scripts/train_router.py)")
            self.router = load_router(router)
            trained_tau = router_metadata(router).get("config", {}).get("tau")
        else:  # the testbed's router comes from the config too (conf/method/rstitch_plus.yaml)
            raise ConfigError("method.router of 'rstitch_plus' is not set: a router directory from scripts/train_router.py")
        # A router is trained for one gate: by default decode at the tau it was trained at.
        self.tau = require_number("rstitch_plus", "tau", tau if tau is not None else trained_tau or PAPER_TAU)
        self.sample_router = bool(sample_router)
        self.seed = require_int("rstitch_plus", "seed", seed, low=0)
        self.latency_dir = Path(latency_dir) if latency_dir else None  # None: no trace latency estimate
        self._latency: dict[int, Mapping[str, LatencyModel] | None] = {}

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        # The router reads SLM hidden states only, so only the SLM's size must match.
        if self.router.config.slm_hidden != ctx.pair.slm.hidden_size:
            raise ConfigError(f"rstitch_plus: router expects SLM hidden size {self.router.config.slm_hidden}, "
                              f"the pair's SLM has {ctx.pair.slm.hidden_size}")
        # Its own generator: router draws must not shift the sampler's token stream.
        generator = torch.Generator().manual_seed(self.seed + len(prompt_ids) * 7919 + sum(prompt_ids))
        policy = RouterSwitch(self.router, self.tau, self.sample_router, generator)
        if id(ctx.pair) not in self._latency:
            self._latency[id(ctx.pair)] = load_pair_latency(self.latency_dir, ctx.pair) if self.latency_dir else None
        result, _ = routed_decode(prompt_ids, ctx, policy, self._latency[id(ctx.pair)])
        return result

    def summarize(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        stats = [s.get("stats", {}) for s in samples]
        calls = sum(s.get("router_calls", 0) for s in stats)
        seconds = sum(s.get("router_time_s", 0.0) for s in stats)
        latency = sum(s.get("latency_s", 0.0) for s in samples)
        out = {
            "router_calls": statistics.fmean(s.get("router_calls", 0) for s in stats) if stats else 0.0,
            "router_ms_per_call": 1000 * seconds / calls if calls else None,
            "router_time_share": seconds / latency if latency else None,
            "router_llm_choice_rate": sum(s.get("router_llm_choices", 0) for s in stats) / calls if calls else None,
        }
        estimated = [(s["stats"]["latency_estimate_s"], s["latency_s"]) for s in samples
                     if "latency_estimate_s" in s.get("stats", {}) and s.get("latency_s")]
        if estimated:  # the trace's estimate; the common latency_estimate_s is the runner's
            out["trace_latency_estimate_s"] = statistics.fmean(e for e, _ in estimated)
            out["trace_latency_estimate_rel_error"] = statistics.fmean(abs(e - m) / m for e, m in estimated)
        return out
