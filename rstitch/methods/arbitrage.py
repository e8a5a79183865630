"""Arbitrage: escalate a step to the target model only where it is expected to do better (Arbitrage
§4; Algorithm 1 in appendix D; docs/step-level.md). `arbitrage_oracle` runs both models and the PRM
at every step, the upper bound a router imitates; `arbitrage` runs the target only when escalating.
"""
from __future__ import annotations

import json
from typing import Any

from rstitch.errors import ConfigError
from rstitch.methods.base import LLM, SLM, register_method, require_number
from rstitch.methods.drafts import Step, Verdict
from rstitch.methods.steps import DEFAULT_PRM, DraftVerifyMethod, StepDecoder, StepMethod, StepRun
from rstitch.scorers.arbitrage_router import ArbitrageRouter

_ROUTERS: dict[str, ArbitrageRouter] = {}  # loaded once per process, like PRMs and model pairs


@register_method("arbitrage_oracle")
class ArbitrageOracle(StepMethod):
    def __init__(self, tau: float = 0.0, prm: Any = None, **step_options: Any):
        super().__init__(**step_options)
        self.tau = require_number("arbitrage_oracle", "tau", tau, infinite_ok=True)  # +-inf: never / always the target
        self.use_prm(DEFAULT_PRM if prm is None else prm)

    def next_step(self, run: StepRun, path: StepDecoder) -> Step:
        """Keep the target's step iff delta = s_target - s_draft > tau (§4.1: Definition 4.1's
        advantage, eq. 4.2; the thresholding policy, eq. 4.4)."""
        draft, target = path.generate(SLM), path.generate(LLM)
        s_draft, s_target = self.last_step_score(run, path, draft), self.last_step_score(run, path, target)
        if s_target - s_draft > self.tau:
            run.log.add(LLM, "escalate", s_draft, s_target)
            return target
        run.log.add(SLM, "accept", s_draft, s_target)
        return draft


@register_method("arbitrage")
class ArbitrageRouted(DraftVerifyMethod):
    def __init__(self, tau: float = 0.5, router: Any = None, **step_options: Any):
        super().__init__(**step_options)
        self.tau = require_number("arbitrage", "tau", tau, infinite_ok=True)  # +-inf: never / always the target
        if router is not None and not isinstance(router, (dict, ArbitrageRouter)):
            raise ConfigError(f"method.router of 'arbitrage' must be a mapping (path, device, dtype), got {router!r}")
        self.router_spec = router if router is not None else {}

    def router(self) -> ArbitrageRouter:
        if isinstance(self.router_spec, ArbitrageRouter):
            return self.router_spec
        key = json.dumps(self.router_spec, sort_keys=True)
        if key not in _ROUTERS:
            try:
                _ROUTERS[key] = ArbitrageRouter(**self.router_spec)
            except TypeError as err:
                raise ConfigError(f"method.router of 'arbitrage': {err}") from None
        return _ROUTERS[key]

    def verify(self, run: StepRun, path: StepDecoder, draft: Step) -> Verdict:
        """y_hat = P(delta > 0) from (problem, earlier steps tagged "Model 0: " / "Model 1: " by who
        wrote them (§6.2), draft step); the target writes the step iff y_hat > tau (§4.2)."""
        history = [(step.source, step.text) for step in path.steps]
        y_hat = self.router().predict(run.ctx.problem, history, draft.text)
        return Verdict(not y_hat > self.tau, y_hat)
