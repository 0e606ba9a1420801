"""Bradley-Terry reward-model loss: score gaps chosen so that sigmoid is 3/4, 1/2 or 1/4."""

from __future__ import annotations

import math

import pytest
import torch

from oxrl.algorithms.reward_model import RewardModelInput, bradley_terry_loss

LN3 = math.log(3.0)


def t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_hand_values_with_margin():
    # A: gap 2 - (2 - ln 3) = ln 3, m = 0 -> -log(3/4) = ln(4/3).
    # B: gap 1 - 0 = 1, m = 1 -> -log sigmoid(0) = ln 2.
    # C: gap 0 - ln 3 = -ln 3, m = 0 -> -log(1/4) = ln 4 (ranked wrong).   Sum: ln(4/3 * 2 * 4) = ln(32/3).
    batch = RewardModelInput(t([2.0, 1.0, 0.0]), t([2 - LN3, 0.0, LN3]), margin=t([0.0, 1.0, 0.0]))
    out = bradley_terry_loss(batch)
    assert out.loss.item() == pytest.approx(math.log(32 / 3), abs=1e-12)
    m = out.metrics
    assert m["rewards/accuracy"].item() == 2.0  # A and B; the margin does not change who ranks first
    assert m["rewards/margins"].item() == pytest.approx(LN3 + 1 - LN3)  # raw score gaps, summed
    assert m["rewards/chosen"].item() == pytest.approx(3.0)
    assert m["count/pairs"].item() == 3.0


def test_no_margin_is_plain_bradley_terry():
    # Gap 1, no margin: -log sigmoid(1) = log(1 + e^-1).
    out = bradley_terry_loss(RewardModelInput(t([1.0]), t([0.0])))
    assert out.loss.item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-12)
    # A zero margin is the same as none.
    assert bradley_terry_loss(RewardModelInput(t([1.0]), t([0.0]), t([0.0]))).loss.item() == pytest.approx(out.loss.item())


def test_gradient_hand_values():
    # d/ds_c -log sigmoid(s_c - s_r) = -(1 - sigmoid(gap)) = -(1 - 3/4) = -1/4 at gap ln 3; +1/4 for s_r.
    chosen = torch.tensor([LN3], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([0.0], dtype=torch.float64, requires_grad=True)
    bradley_terry_loss(RewardModelInput(chosen, rejected)).loss.backward()
    assert chosen.grad.item() == pytest.approx(-0.25) and rejected.grad.item() == pytest.approx(0.25)


def test_batch_equals_sum_of_single_pairs():
    torch.manual_seed(0)
    chosen, rejected, margin = (torch.randn(5, dtype=torch.float64) for _ in range(3))
    whole = bradley_terry_loss(RewardModelInput(chosen, rejected, margin))
    parts = [bradley_terry_loss(RewardModelInput(chosen[i : i + 1], rejected[i : i + 1], margin[i : i + 1])) for i in range(5)]
    assert torch.allclose(whole.loss, sum(p.loss for p in parts))
    for key, value in whole.metrics.items():
        assert torch.allclose(value, sum(p.metrics[key] for p in parts)), key


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="shape"):
        RewardModelInput(t([1.0, 2.0]), t([1.0]))
    with pytest.raises(ValueError, match="shape"):
        RewardModelInput(t([1.0]), t([1.0]), margin=t([1.0, 2.0]))
