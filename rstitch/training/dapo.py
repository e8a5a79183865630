"""DAPO's pieces for R-Stitch+'s router (docs/rstitch-plus.md, "Training"); the loop is
fit_rstitch_router.py."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rstitch.config_groups import compose_config
from rstitch.engines import ModelPair, Sampler
from rstitch.grading import grade
from rstitch.latency.model import LatencyModel
from rstitch.methods.base import LLM, DecodeContext
from rstitch.methods.rstitch_plus import RouterDecision, RouterSwitch, routed_decode
from rstitch.scorers.rstitch_router import RStitchRouter

PAPER_LAMBDA = 5e-6  # per ms, for 7B-32B models on GPU
TESTBED_LAMBDA = 2.5e-4  # per ms: a testbed LLM-only trajectory (~750 ms on CPU) pays ~0.19
CLIP_HIGHER = 0.28  # DAPO's upper clip (its lower one is clip_eps, 0.2)


def trajectory_reward(correct: bool, latency_ms: float, lam: float) -> float:
    """R = r_acc - lam * r_acc * L_hat: latency is penalized only when the answer is right."""
    r_acc = float(correct)
    return r_acc - lam * r_acc * latency_ms


def is_informative(rewards: torch.Tensor, tol: float = 1e-9) -> bool:
    """Dynamic sampling: a group whose rewards are all equal has zero advantages everywhere."""
    return bool(rewards.max() - rewards.min() > tol)


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return (rewards - rewards.mean()) / (rewards.std(unbiased=False) + eps)


def dapo_loss(new_log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
              group_ids: torch.Tensor, eps_low: float = 0.2, eps_high: float | None = None) -> tuple[torch.Tensor, dict]:
    """DAPO's clipped surrogate (to minimize), one row per router decision, the ratio clipped to
    [1 - eps_low, 1 + eps_high] (None: eps_low, R-Stitch's eq. 8). Token-level normalization: each
    group's terms are summed over its decisions and divided by their number, then groups averaged."""
    eps_high = eps_low if eps_high is None else eps_high
    ratio = torch.exp(new_log_probs - old_log_probs)
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    per_decision = -torch.minimum(ratio * advantages, clipped * advantages)
    n_groups = int(group_ids.max()) + 1
    group_sum = torch.zeros(n_groups).index_add(0, group_ids, per_decision)
    group_size = torch.bincount(group_ids, minlength=n_groups).clamp(min=1)
    loss = (group_sum / group_size).mean()
    clip_fraction = float(((ratio * advantages) > (clipped * advantages)).float().mean())
    return loss, {"clip_fraction": clip_fraction, "ratio_mean": float(ratio.detach().mean())}


@dataclass
class Rollout:
    decisions: list[RouterDecision]
    correct: bool
    latency_ms: float
    tokens: int
    tokens_llm: int


@dataclass(frozen=True)
class RolloutSettings:
    tau: float  # positions with entropy <= tau go to the SLM without asking the router
    max_new_tokens: int
    temperature: float = 0.0  # token sampling; routing is sampled either way
    grade_answers: bool = True  # False: every rollout counts as correct (random smoke models are never right)


def rollout(prompt_ids: list[int], gold: str, pair: ModelPair, router: RStitchRouter, latency: dict[str, LatencyModel],
            generator: torch.Generator, settings: RolloutSettings, token_seed: int) -> Rollout:
    """One routed decode whose router actions are sampled and recorded (with the log-probability
    and hidden state each read), graded and priced by the latency model."""
    policy = RouterSwitch(router, settings.tau, sample=True, generator=generator, record=True)
    sampler = Sampler(temperature=settings.temperature, seed=token_seed)
    result, _ = routed_decode(prompt_ids, DecodeContext(pair, sampler, settings.max_new_tokens), policy, latency)
    response = pair.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    correct = grade(response, gold) if settings.grade_answers else True
    return Rollout(policy.decisions, correct, 1000 * result.stats["latency_estimate_s"], len(result.token_ids),
                   result.tokens_by(LLM))


def decision_batch(groups: list[tuple[list[Rollout], torch.Tensor]], width: int) -> dict[str, torch.Tensor]:
    """Flatten the kept groups (rollouts, advantages) into one row per router decision; hidden
    states are zero-padded to `width` (the larger model's)."""
    rows = [(d, a, g) for g, (rollouts, advantages) in enumerate(groups) for r, a in zip(rollouts, advantages.tolist()) for d in r.decisions]
    return {"hidden": torch.stack([torch.nn.functional.pad(d.hidden, (0, width - d.hidden.shape[0])) for d, _, _ in rows]),
            "sources": torch.tensor([d.source for d, _, _ in rows]), "actions": torch.tensor([d.action for d, _, _ in rows]),
            "old_log_probs": torch.tensor([d.log_prob for d, _, _ in rows]), "advantages": torch.tensor([a for _, a, _ in rows]),
            "group_ids": torch.tensor([g for _, _, g in rows])}


def dapo_update(router: RStitchRouter, optimizer: torch.optim.Optimizer, data: dict[str, torch.Tensor], updates: int,
                eps_low: float = 0.2, eps_high: float | None = None) -> tuple[float, dict]:
    """`updates` gradient steps on one `decision_batch`; the last loss and its clip statistics."""
    loss, info = torch.tensor(float("nan")), dict[str, float]()  # no update: nan, no statistics
    for _ in range(updates):
        new = router.log_probs(data["hidden"], data["sources"]).gather(1, data["actions"][:, None])[:, 0]
        loss, info = dapo_loss(new, data["old_log_probs"], data["advantages"], data["group_ids"], eps_low, eps_high)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item(), info


def rollout_budget(given: int | None, overrides: list[str]) -> int:
    """The rollouts' token budget: the one given, else the evaluation run's (the config
    `rstitch-run` composes with `overrides`), so the latency term sees untruncated trajectories."""
    if given is not None:
        return given
    return int(compose_config(["logger=none", *overrides])["max_new_tokens"])
