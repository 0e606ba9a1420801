"""KTO: values derived by hand with beta = 1 and gaps chosen so that every sigmoid is 1/2, 3/4
or 1/4 (sigmoid(ln 3) = 3/4, sigmoid(-ln 3) = 1/4)."""

from __future__ import annotations

import math

import pytest
import torch

from oxrl.algorithms.kto import KTOInput, KTOParams, kto_loss, kto_reference_point

LN3 = math.log(3.0)


def t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_mixed_batch_hand_values():
    # Mismatched pairs: policy-minus-reference log-probs 1 and 3 -> mean 2 -> z0 = max(0, 2) = 2.
    # Desirable example: r = (2 + ln 3) - 0 -> r - z0 = ln 3 -> 1 - 3/4 = 1/4, weight 1.
    # Undesirable example: r = 0 - (ln 3 - 2) = 2 - ln 3 -> z0 - r = ln 3 -> 1 - 3/4 = 1/4, weight 2 -> 1/2.
    batch = KTOInput(
        logps=t([2 + LN3, 0.0]), ref_logps=t([0.0, LN3 - 2]), labels=torch.tensor([True, False]),
        kl_logps=t([-4.0, -2.0]), ref_kl_logps=t([-5.0, -5.0]),
    )
    out = kto_loss(batch, KTOParams(beta=1.0, desirable_weight=1.0, undesirable_weight=2.0))
    assert out.loss.item() == pytest.approx(0.75, abs=1e-12)
    m = out.metrics
    assert m["kl"].item() == pytest.approx(2.0 * 2)  # z0 times the 2 examples
    assert m["rewards/desirable"].item() == pytest.approx(2 + LN3)
    assert m["rewards/undesirable"].item() == pytest.approx(2 - LN3)
    assert m["count/desirable"].item() == 1.0 and m["count/undesirable"].item() == 1.0
    assert m["logps/desirable"].item() == pytest.approx(2 + LN3) and m["logps/undesirable"].item() == 0.0


def test_only_desirable_batch_with_negative_kl_estimate():
    # Mean mismatched log-ratio (-1 - 3) / 2 = -2 < 0 -> z0 = 0. r = 0 for both -> 1 - sigmoid(0) = 1/2 each.
    batch = KTOInput(
        logps=t([-3.0, -8.0]), ref_logps=t([-3.0, -8.0]), labels=torch.tensor([True, True]),
        kl_logps=t([-1.0, -3.0]), ref_kl_logps=t([0.0, 0.0]),
    )
    out = kto_loss(batch, KTOParams(beta=1.0, undesirable_weight=5.0))
    assert out.loss.item() == pytest.approx(1.0, abs=1e-12)
    assert out.metrics["kl"].item() == 0.0
    assert out.metrics["count/undesirable"].item() == 0.0 and out.metrics["rewards/undesirable"].item() == 0.0


def test_only_undesirable_batch_raising_the_reward_raises_the_loss():
    # z0 = mean(0.5, 1.5) = 1.  r = 1 -> 1 - sigmoid(0) = 1/2, times weight 2 -> 1.
    # r = 1 + ln 3 -> 1 - sigmoid(z0 - r) = 1 - sigmoid(-ln 3) = 3/4, times 2 -> 3/2.   Sum 5/2.
    batch = KTOInput(
        logps=t([1.0, 1 + LN3]), ref_logps=t([0.0, 0.0]), labels=torch.tensor([False, False]),
        kl_logps=t([0.5, 1.5]), ref_kl_logps=t([0.0, 0.0]),
    )
    out = kto_loss(batch, KTOParams(beta=1.0, undesirable_weight=2.0))
    assert out.loss.item() == pytest.approx(2.5, abs=1e-12)
    assert out.metrics["count/desirable"].item() == 0.0


def test_gradients_hand_values_direction_and_detached_reference_point():
    # beta = 1, z0 = 0 (mismatched log-ratios are 0), r = 0 for both examples:
    # d/dr [1 - sigmoid(r)] = -sigmoid(0)(1 - sigmoid(0)) = -1/4 (desirable, raise it);
    # d/dr [1 - sigmoid(-r)] = +1/4 (undesirable, lower it).
    logps = torch.tensor([-2.0, -2.0], dtype=torch.float64, requires_grad=True)
    kl_logps = torch.tensor([-1.0, -1.0], dtype=torch.float64, requires_grad=True)
    batch = KTOInput(logps, t([-2.0, -2.0]), torch.tensor([True, False]), kl_logps, t([-1.0, -1.0]))
    kto_loss(batch, KTOParams(beta=1.0)).loss.backward()
    assert logps.grad.tolist() == pytest.approx([-0.25, 0.25])
    assert kl_logps.grad is None  # z0 carries no gradient, as in the paper


def test_given_reference_point_matches_and_batch_equals_sum_of_examples():
    torch.manual_seed(0)
    n = 6
    logps, ref_logps = -torch.rand(n, dtype=torch.float64) * 10, -torch.rand(n, dtype=torch.float64) * 10
    labels = torch.tensor([True, False, True, True, False, False])
    kl_logps, ref_kl_logps = logps.roll(1) + 0.5, ref_logps.roll(1)
    params = KTOParams(beta=0.3, desirable_weight=1.3, undesirable_weight=0.8)
    whole = kto_loss(KTOInput(logps, ref_logps, labels, kl_logps, ref_kl_logps), params)
    z0 = kto_reference_point(kl_logps, ref_kl_logps)
    given = kto_loss(KTOInput(logps, ref_logps, labels, reference_point=z0), params)
    assert torch.allclose(given.loss, whole.loss)
    parts = [kto_loss(KTOInput(logps[i : i + 1], ref_logps[i : i + 1], labels[i : i + 1], reference_point=z0), params) for i in range(n)]
    assert torch.allclose(sum(p.loss for p in parts), whole.loss)
    for key, value in whole.metrics.items():
        assert torch.allclose(sum(p.metrics[key] for p in parts), value), key


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="bool"):
        KTOInput(t([-1.0]), t([-1.0]), torch.tensor([1]), reference_point=torch.tensor(0.0))
    with pytest.raises(ValueError, match="either"):
        KTOInput(t([-1.0]), t([-1.0]), torch.tensor([True]))
    with pytest.raises(ValueError, match="either"):
        KTOInput(t([-1.0]), t([-1.0]), torch.tensor([True]), t([-1.0]), t([-1.0]), torch.tensor(0.0))
    with pytest.raises(ValueError, match="shape"):
        KTOInput(t([-1.0, -2.0]), t([-1.0]), torch.tensor([True]), reference_point=torch.tensor(0.0))
