import pytest
import torch

from rstitch.methods.base import LLM, SLM
from rstitch.methods.rstitch_plus import RouterDecision
from rstitch.scorers.rstitch_router import RouterConfig, RStitchRouter
from rstitch.training import dapo
from rstitch.training.dapo import dapo_loss


def test_reward_penalizes_latency_only_when_correct():
    assert dapo.trajectory_reward(True, 2000.0, 1e-4) == pytest.approx(0.8)
    assert dapo.trajectory_reward(False, 2000.0, 1e-4) == 0.0
    assert dapo.trajectory_reward(False, 10.0, 1e-4) == dapo.trajectory_reward(False, 5000.0, 1e-4)


def test_group_advantages_are_normalized_and_dynamic_sampling_drops_flat_groups():
    rewards = torch.tensor([1.0, 0.0, 0.8, 0.0])
    adv = dapo.group_advantages(rewards)
    assert adv.mean().abs() < 1e-6 and adv.std(unbiased=False) == pytest.approx(1.0, abs=1e-4)
    assert adv.argmax() == 0 and adv[1] == adv[3] < 0
    assert dapo.is_informative(rewards)
    assert not dapo.is_informative(torch.zeros(8))  # all wrong
    assert not dapo.is_informative(torch.full((8,), 0.93))  # all right, same latency


def test_default_clip_is_symmetric_as_in_eq_8():
    # ratio 1.25 with A > 0: outside [0.8, 1.2], clipped, no gradient; 1.15 is still pushed up.
    ratios = torch.tensor([1.25, 1.15, 0.75, 0.85])
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    new = ratios.log().requires_grad_()
    loss, info = dapo_loss(new, torch.zeros(4), advantages, torch.zeros(4, dtype=torch.long))
    loss.backward()
    assert new.grad[0] == 0 and new.grad[2] == 0
    assert new.grad[1] < 0 and new.grad[3] > 0
    assert info["clip_fraction"] == pytest.approx(0.5)


def test_clip_higher_is_asymmetric():
    # ratio 1.25 with A > 0: inside [0.8, 1.28], still pushed up. ratio 1.3: clipped, no gradient.
    # ratio 0.75 with A < 0: below 1 - eps_low, clipped, no gradient. ratio 0.85: still pushed down.
    ratios = torch.tensor([1.25, 1.3, 0.75, 0.85])
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    new = ratios.log().requires_grad_()
    loss, info = dapo_loss(new, torch.zeros(4), advantages, torch.zeros(4, dtype=torch.long), 0.2, dapo.CLIP_HIGHER)
    loss.backward()
    grads = new.grad
    assert grads[0] < 0 and grads[3] > 0  # descent raises log-prob 0, lowers log-prob 3
    assert grads[1] == 0 and grads[2] == 0
    assert info["clip_fraction"] == pytest.approx(0.5)


def test_rollouts_use_the_runs_budget():
    assert dapo.rollout_budget(None, []) == 512  # conf/config.yaml
    assert dapo.rollout_budget(None, ["max_new_tokens=3000"]) == 3000
    assert dapo.rollout_budget(None, ["experiment=rstitch_paper_plus"]) == 8192
    assert dapo.rollout_budget(64, ["experiment=rstitch_paper_plus"]) == 64


def test_token_level_normalization_within_groups():
    # Group 0: a rollout with 3 decisions (A=+1) and one with 1 decision (A=-1); group 1: 2 decisions.
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, 0.5, -0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    lp = torch.zeros(6)  # ratio 1: per-decision term is -A
    loss, _ = dapo_loss(lp, lp, adv, groups)
    group0 = -(1 + 1 + 1 - 1) / 4  # the 3-decision rollout weighs 3x, not 1x as in per-sample means
    group1 = -(0.5 - 0.5) / 2
    assert loss.item() == pytest.approx((group0 + group1) / 2)
    per_sample_mean = (-(1.0) + 1.0) / 2
    assert loss.item() != pytest.approx((per_sample_mean + group1) / 2)


def test_one_update_moves_the_policy_toward_positive_advantage_actions():
    torch.manual_seed(0)
    router = RStitchRouter(RouterConfig(6, 10))
    n = 24
    sources = torch.tensor([SLM] * n)  # Algorithm 1 consults the router on SLM states only
    hidden = torch.randn(n, 10)
    hidden[:, 6:] = 0.0  # SLM states padded to a wider batch
    with torch.no_grad():
        old_all = router.log_probs(hidden, sources)
    actions = torch.randint(0, 2, (n,))
    old = old_all.gather(1, actions[:, None])[:, 0]
    advantages = torch.where(torch.arange(n) % 3 == 0, 1.0, -1.0)
    groups = torch.arange(n) // 8
    optimizer = torch.optim.SGD(router.parameters(), lr=0.05)
    data = {"hidden": hidden, "sources": sources, "actions": actions, "old_log_probs": old, "advantages": advantages,
            "group_ids": groups}
    loss, info = dapo.dapo_update(router, optimizer, data, updates=1)
    assert loss == pytest.approx(-(advantages.view(3, 8).mean(1).mean().item()), abs=1e-6)  # ratio 1 at the first step
    assert info["ratio_mean"] == pytest.approx(1.0)
    with torch.no_grad():
        after = router.log_probs(hidden, sources).gather(1, actions[:, None])[:, 0]
    change = after - old
    assert (change * advantages).sum() > 0
    assert change[advantages > 0].mean() > 0 > change[advantages < 0].mean()


def test_decision_batch_flattens_kept_groups():
    def rollout(n_decisions, source):
        decisions = [RouterDecision(source, torch.ones(4 if source == SLM else 6), LLM, -0.5) for _ in range(n_decisions)]
        return dapo.Rollout(decisions, True, 10.0, 5, 1)

    kept = [([rollout(2, SLM), rollout(1, LLM)], torch.tensor([0.7, -0.7])), ([rollout(3, LLM)], torch.tensor([0.0]))]
    data = dapo.decision_batch(kept, width=6)
    assert data["hidden"].shape == (6, 6) and data["hidden"][0, 4:].abs().sum() == 0
    assert data["group_ids"].tolist() == [0, 0, 0, 1, 1, 1]
    assert data["advantages"].tolist() == pytest.approx([0.7, 0.7, -0.7, 0, 0, 0])
    assert data["sources"].tolist() == [SLM, SLM, LLM, LLM, LLM, LLM]
