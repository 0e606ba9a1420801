"""Advantage estimators: hand-derived values, edge cases, GAE against a plain loop."""

from __future__ import annotations

import pytest
import torch

from oxrl.algorithms.advantages import (
    OUTCOME_ESTIMATORS,
    AdvantageParams,
    broadcast_to_tokens,
    outcome_advantages,
    gae,
    place_outcome_reward,
    whiten,
)

# Two interleaved groups of 4, listed out of order: id 7 has rewards [1, 0, 0, 1],
# id 3 has four equal rewards 0.1 (whose float mean is not exactly 0.1).
GROUP_IDS = torch.tensor([7, 3, 7, 3, 7, 3, 7, 3])
REWARDS = torch.tensor([1.0, 0.1, 0.0, 0.1, 0.0, 0.1, 1.0, 0.1])
GROUP_7 = GROUP_IDS == 7
GROUP_3 = GROUP_IDS == 3


def test_grpo_unbiased_std():
    # Group 7: mean 0.5, deviations +-0.5, sum of squares 4 * 0.25 = 1,
    # unbiased var 1/3, std 0.5773503 -> A = +-0.5 / 0.5773503 = +-0.8660254.
    adv = outcome_advantages("grpo", REWARDS, GROUP_IDS)
    assert torch.allclose(adv[GROUP_7], torch.tensor([0.8660254, -0.8660254, -0.8660254, 0.8660254]), atol=1e-5)
    assert torch.equal(adv[GROUP_3], torch.zeros(4))  # equal rewards: exactly 0


def test_grpo_biased_std_and_no_std():
    # Biased: var 1/4, std 0.5 -> A = +-1.
    adv = outcome_advantages("grpo", REWARDS, GROUP_IDS, AdvantageParams(unbiased_std=False))
    assert torch.allclose(adv[GROUP_7], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    # Without std normalisation: r - mean = +-0.5.
    adv = outcome_advantages("grpo", REWARDS, GROUP_IDS, AdvantageParams(std_normalise=False))
    assert torch.allclose(adv[GROUP_7], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    assert torch.equal(adv[GROUP_3], torch.zeros(4))


def test_dr_grpo_is_centred_reward():
    adv = outcome_advantages("dr_grpo", REWARDS, GROUP_IDS)
    assert torch.allclose(adv[GROUP_7], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    assert torch.equal(adv[GROUP_3], torch.zeros(4))


def test_rloo_leave_one_out():
    # r = 1: others [0, 0, 1] average 1/3 -> A = 1 - 1/3 = 2/3.
    # r = 0: others [1, 0, 1] average 2/3 -> A = 0 - 2/3 = -2/3.
    adv = outcome_advantages("rloo", REWARDS, GROUP_IDS)
    assert torch.allclose(adv[GROUP_7], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    assert torch.equal(adv[GROUP_3], torch.zeros(4))


def test_group_of_one_gets_zero():
    # Group 0 = [1, 0]; group 1 = [5] alone.
    rewards, ids = torch.tensor([1.0, 0.0, 5.0]), torch.tensor([0, 0, 1])
    # rloo, n = 2: 1 - 0 = 1 and 0 - 1 = -1.
    assert torch.allclose(outcome_advantages("rloo", rewards, ids), torch.tensor([1.0, -1.0, 0.0]))
    # grpo: mean 0.5, unbiased var (0.25 + 0.25) / 1 = 0.5, std 0.7071068 -> +-0.7071068.
    assert torch.allclose(outcome_advantages("grpo", rewards, ids), torch.tensor([0.7071068, -0.7071068, 0.0]), atol=1e-5)
    assert torch.allclose(outcome_advantages("dr_grpo", rewards, ids), torch.tensor([0.5, -0.5, 0.0]))


def test_reinforce_pp_batch_normalisation():
    # No group baseline, rewards [1, 2, 3, 6]: batch mean 3, deviations [-2, -1, 0, 3],
    # squares 4 + 1 + 0 + 9 = 14, unbiased var 14/3, std 2.1602469.
    rewards, ids = torch.tensor([1.0, 2.0, 3.0, 6.0]), torch.tensor([0, 0, 1, 1])
    adv = outcome_advantages("reinforce_pp", rewards, ids, AdvantageParams(group_baseline=False))
    assert torch.allclose(adv, torch.tensor([-0.9258201, -0.4629100, 0.0, 1.3887301]), atol=1e-5)
    # Group baseline first, rewards [1, 3 | 10, 14]: centred [-1, 1, -2, 2], batch mean 0,
    # squares 1 + 1 + 4 + 4 = 10, unbiased var 10/3, std 1.8257419.
    rewards = torch.tensor([1.0, 3.0, 10.0, 14.0])
    adv = outcome_advantages("reinforce_pp", rewards, ids)
    assert torch.allclose(adv, torch.tensor([-0.5477226, 0.5477226, -1.0954451, 1.0954451]), atol=1e-5)
    # Whole batch equal: exactly 0.
    assert torch.equal(outcome_advantages("reinforce_pp", torch.full((4,), 0.3), ids), torch.zeros(4))


@pytest.mark.parametrize("name", sorted(OUTCOME_ESTIMATORS))
def test_no_nan_on_equal_rewards_and_integer_rewards(name):
    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = outcome_advantages(name, torch.full((6,), 0.7), ids)
    assert torch.equal(adv, torch.zeros(6))
    adv = outcome_advantages(name, torch.tensor([1, 0, 1, 0, 0, 0]), ids)  # int rewards work
    assert adv.is_floating_point() and torch.isfinite(adv).all()


def test_unknown_estimator_lists_valid():
    with pytest.raises(ValueError, match=r"dr_grpo.*grpo.*reinforce_pp.*rloo"):
        outcome_advantages("ppo", REWARDS, GROUP_IDS)


def test_broadcast_every_trained_token_gets_the_advantage():
    adv = torch.tensor([0.5, -1.0, 2.0])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    per_token = broadcast_to_tokens(adv, mask)
    assert torch.equal(per_token, torch.tensor([[0.0, 0.5, 0.5, 0.0], [-1.0] * 4, [0.0] * 4]))
    # The original oxRL bug: advantage on the last token only. Every trained token must have it.
    trained = mask.bool()
    assert torch.equal(per_token[trained], adv[:, None].expand(-1, 4)[trained])


def test_place_outcome_reward_on_last_trained_token():
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0])
    mask = torch.tensor([
        [1, 1, 0, 0],  # ended early, right padding
        [1, 1, 1, 1],  # truncated at max length: reward on the final kept token
        [0, 0, 0, 0],  # nothing trained: no reward anywhere
        [0, 1, 0, 1],  # hole in the middle (e.g. tool output): last 1 wins
    ])
    expected = torch.tensor([
        [0.0, 1.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 2.0],
        [0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 4.0],
    ])
    assert torch.equal(place_outcome_reward(rewards, mask), expected)


def test_gae_hand_values():
    # Three real tokens then one padding position holding garbage that must be ignored.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # gamma 0.9, lam 0.8, V after the last real token = 0:
    #   delta_2 = 1 + 0.9*0 - 0.7 = 0.3     A_2 = 0.3
    #   delta_1 = 0 + 0.9*0.7 - 0.6 = 0.03  A_1 = 0.03 + 0.72*0.3 = 0.246
    #   delta_0 = 0 + 0.9*0.6 - 0.5 = 0.04  A_0 = 0.04 + 0.72*0.246 = 0.21712
    # returns = A + V = [0.21712 + 0.5, 0.246 + 0.6, 0.3 + 0.7] = [0.71712, 0.846, 1.0]
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert torch.allclose(adv, torch.tensor([[0.21712, 0.246, 0.3, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.71712, 0.846, 1.0, 0.0]]), atol=1e-6)
    # gamma = lam = 1: A_t = (sum of rewards from t on) - V_t = 1 - V_t.
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.4, 0.3, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))


def gae_reference(token_rewards, values, mask, gamma, lam):
    """Plain loop: keep each row's trained tokens, run textbook GAE on that short list
    (terminal after its last element), scatter back."""
    advantages = torch.zeros_like(token_rewards)
    returns = torch.zeros_like(token_rewards)
    for b in range(token_rewards.shape[0]):
        positions = [t for t in range(token_rewards.shape[1]) if mask[b, t]]
        running = 0.0
        for k in reversed(range(len(positions))):
            t = positions[k]
            next_value = float(values[b, positions[k + 1]]) if k + 1 < len(positions) else 0.0
            delta = float(token_rewards[b, t]) + gamma * next_value - float(values[b, t])
            running = delta + gamma * lam * running
            advantages[b, t] = running
            returns[b, t] = running + float(values[b, t])
    return advantages, returns


def test_gae_matches_loop_on_ragged_masks():
    torch.manual_seed(0)
    batch, length = 6, 9
    token_rewards = torch.randn(batch, length)
    values = torch.randn(batch, length)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for b, n in enumerate([9, 5, 1, 0, 7, 3]):  # full row, ragged lengths, an empty row
        mask[b, :n] = True
    mask[4, 2:4] = False  # a hole inside a response (tool output)
    mask[5] = torch.tensor([0, 0, 1, 1, 1, 0, 0, 0, 0], dtype=torch.bool)  # left offset
    for gamma, lam in [(1.0, 0.95), (0.99, 0.9), (1.0, 1.0)]:
        adv, ret = gae(token_rewards, values, mask, gamma, lam)
        ref_adv, ref_ret = gae_reference(token_rewards, values, mask, gamma, lam)
        assert torch.allclose(adv, ref_adv, atol=1e-5)
        assert torch.allclose(ret, ref_ret, atol=1e-5)


def test_gae_on_outcome_reward_and_detached_values():
    mask = torch.tensor([[1, 1, 1, 0]])
    values = torch.zeros(1, 4, requires_grad=True)
    token_rewards = place_outcome_reward(torch.tensor([2.0]), mask)
    adv, _ = gae(token_rewards, values, mask, gamma=1.0, lam=1.0)
    # V = 0, gamma = lam = 1: every real token's advantage is the final reward 2.
    assert torch.equal(adv, torch.tensor([[2.0, 2.0, 2.0, 0.0]]))
    assert not adv.requires_grad


def test_whiten_over_masked_tokens():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 50.0, 50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # Trained values 1, 2, 3: mean 2, unbiased std 1 -> -1, 0, 1.
    assert torch.allclose(whiten(x, mask), torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), atol=1e-6)
    assert torch.allclose(whiten(x, mask, shift_mean=False), torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]), atol=1e-6)
    assert torch.equal(whiten(torch.full((2, 3), 0.1), mask), torch.zeros(2, 3))


# ----------------------------------------------------------------------------- one signature for every estimator


def test_every_estimator_takes_token_rewards_and_returns_token_advantages():
    from oxrl.algorithms.advantages import ADVANTAGES, RolloutRewards, estimate_advantages

    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]]).bool()
    # Two groups of two. Returns (sums of token rewards): 1 and 0 in group 0; 2 and 2 in group 1.
    token_rewards = torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    inp = RolloutRewards(token_rewards, mask, torch.tensor([0, 0, 1, 1]))
    out = estimate_advantages("dr_grpo", inp)
    # r - mean(group): +0.5 / -0.5 on every trained token of group 0; group 1's rewards are equal: 0.
    expected = torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.equal(out.advantages, expected) and out.returns is None
    assert set(ADVANTAGES) == {"grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"}


def test_gae_estimator_credits_each_token_and_needs_values():
    from oxrl.algorithms.advantages import AdvantageParams, RolloutRewards, estimate_advantages

    # One row: a per-token reward of 1 on the first token, the outcome 2 on the last, V = 0, gamma = lam = 1:
    # A_t = sum of rewards from t on = [3, 2, 2]; returns = A + V.
    inp = RolloutRewards(torch.tensor([[1.0, 0.0, 2.0]]), torch.ones(1, 3).bool(), torch.tensor([0]), torch.zeros(1, 3))
    out = estimate_advantages("gae", inp, AdvantageParams(gamma=1.0, lam=1.0, whiten_advantages=False))
    assert torch.equal(out.advantages, torch.tensor([[3.0, 2.0, 2.0]]))
    assert torch.equal(out.returns, torch.tensor([[3.0, 2.0, 2.0]]))
    whitened = estimate_advantages("gae", inp, AdvantageParams(gamma=1.0, lam=1.0))
    # mean 7/3, unbiased std of (3, 2, 2) = sqrt(1/3): (3 - 7/3) / 0.57735 = 1.1547, (2 - 7/3) / 0.57735 = -0.57735
    assert torch.allclose(whitened.advantages, torch.tensor([[1.1547, -0.57735, -0.57735]]), atol=1e-4)
    with pytest.raises(ValueError, match="needs the critic's values"):
        estimate_advantages("gae", RolloutRewards(inp.token_rewards, inp.mask, inp.group_ids))
