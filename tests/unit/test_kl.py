"""KL estimators k1/k2/k3 and the reward-penalty form: hand values and properties."""

from __future__ import annotations

import math

import pytest
import torch

from oxrl.algorithms.kl import KL_ESTIMATORS, k1, k2, k3, kl_estimate, kl_penalty_rewards


def test_hand_values():
    # Token a: logp = 0, logp_ref = -1.   Token b: logp = -1, logp_ref = 0.
    logp = torch.tensor([0.0, -1.0])
    ref = torch.tensor([-1.0, 0.0])
    # k1 = logp - ref: a: 0 - (-1) = 1;  b: -1 - 0 = -1
    assert torch.allclose(k1(logp, ref), torch.tensor([1.0, -1.0]))
    # k2 = 0.5 (logp - ref)^2: 0.5 * 1 = 0.5 for both
    assert torch.allclose(k2(logp, ref), torch.tensor([0.5, 0.5]))
    # k3 = exp(ref - logp) - (ref - logp) - 1:
    #   a: e^-1 - (-1) - 1 = 0.3678794;   b: e^1 - 1 - 1 = 0.7182818
    assert torch.allclose(k3(logp, ref), torch.tensor([0.3678794, 0.7182818]), atol=1e-6)


def test_all_zero_when_equal_and_k2_k3_nonnegative():
    torch.manual_seed(0)
    logp = -torch.rand(64) * 5
    for name, estimator in KL_ESTIMATORS.items():
        assert torch.equal(estimator(logp, logp), torch.zeros(64)), name
    ref = -torch.rand(64) * 5
    assert (k2(logp, ref) >= 0).all()
    assert (k3(logp, ref) >= 0).all()


def test_k1_and_k3_are_unbiased_k2_is_not():
    # Exact expectation over a categorical: E_{y~p}[k(y)] = sum_y p(y) k(y).
    # k1 and k3 must equal KL(p || q); k2 only approximates it.
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    true_kl = float(torch.distributions.kl_divergence(
        torch.distributions.Categorical(probs=p), torch.distributions.Categorical(probs=q)
    ))
    expected = {name: float((p * fn(p.log(), q.log())).sum()) for name, fn in KL_ESTIMATORS.items()}
    assert expected["k1"] == pytest.approx(true_kl, abs=1e-6)
    assert expected["k3"] == pytest.approx(true_kl, abs=1e-6)
    assert abs(expected["k2"] - true_kl) > 1e-3


def test_dispatch_unknown_name_lists_valid():
    assert torch.equal(kl_estimate("k1", torch.tensor([0.0]), torch.tensor([-2.0])), torch.tensor([2.0]))
    with pytest.raises(ValueError, match=r"k1.*k2.*k3"):
        kl_estimate("k4", torch.zeros(1), torch.zeros(1))


def test_kl_penalty_rewards_hand_values_mask_and_no_grad():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0, -1.5]])
    # k1 = [0.5, 0, 1.0]; beta 0.1 -> penalty [0.05, 0, 0.1]; rewards - penalty:
    penalised = kl_penalty_rewards(rewards, logp, ref, beta=0.1)
    assert torch.allclose(penalised, torch.tensor([[-0.05, 0.0, 0.9]]))
    assert not penalised.requires_grad  # a reward, not a loss
    # Last position untrained: its reward stays 1.0 and gets no penalty.
    masked = kl_penalty_rewards(rewards, logp, ref, beta=0.1, mask=torch.tensor([[1, 1, 0]]))
    assert torch.allclose(masked, torch.tensor([[-0.05, 0.0, 1.0]]))
    assert math.isclose(float(kl_penalty_rewards(rewards, logp, ref, beta=0.0).sum()), 1.0)
