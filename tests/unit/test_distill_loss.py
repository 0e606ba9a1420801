"""Distillation divergences, derived by hand on 2- and 3-word vocabularies:
teacher logits (0, 0) -> p_T = (1/2, 1/2); student logits (ln 3, 0) -> p_S = (3/4, 1/4);
teacher logits (ln 2, 0, 0) -> p_T = (1/2, 1/4, 1/4); student logits (0, 0, 0) -> p_S = (1/3, 1/3, 1/3)."""

from __future__ import annotations

import math

import pytest
import torch

from oxrl.algorithms.distill import DISTILL_LOSSES, DistillInput, DistillParams, distill_loss

LN2, LN3 = math.log(2.0), math.log(3.0)

# KL(T || S) = 1/2 ln((1/2)/(3/4)) + 1/2 ln((1/2)/(1/4)) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3)
FORWARD_2 = 0.5 * math.log(4 / 3)
# KL(S || T) = 3/4 ln((3/4)/(1/2)) + 1/4 ln((1/4)/(1/2)) = 3/4 ln(3/2) - 1/4 ln 2 = 3/4 ln 3 - ln 2
REVERSE_2 = 0.75 * LN3 - LN2
# beta = 1/2: M = (5/8, 3/8).  KL(T||M) = 1/2 ln(4/5) + 1/2 ln(4/3);  KL(S||M) = 3/4 ln(6/5) + 1/4 ln(2/3)
JSD_HALF_2 = 0.5 * (0.5 * math.log(4 / 5) + 0.5 * math.log(4 / 3)) + 0.5 * (0.75 * math.log(6 / 5) + 0.25 * math.log(2 / 3))
# beta = 1/4: M = 1/4 p_T + 3/4 p_S = (1/8 + 9/16, 1/8 + 3/16) = (11/16, 5/16).
# KL(T||M) = 1/2 ln(8/11) + 1/2 ln(8/5);  KL(S||M) = 3/4 ln(12/11) + 1/4 ln(4/5);  JSD = 1/4 KL(T||M) + 3/4 KL(S||M)
JSD_QUARTER_2 = 0.25 * (0.5 * math.log(8 / 11) + 0.5 * math.log(8 / 5)) + 0.75 * (0.75 * math.log(12 / 11) + 0.25 * math.log(4 / 5))
# 3 words: KL(T || S) = 1/2 ln(3/2) + 2 * 1/4 ln(3/4) = 1/2 ln(9/8);  KL(S || T) = 1/3 [ln(2/3) + 2 ln(4/3)] = 1/3 ln(32/27)
FORWARD_3, REVERSE_3 = 0.5 * math.log(9 / 8), math.log(32 / 27) / 3


def two_word_batch() -> DistillInput:
    # Rows 0 and 2 are the hand-derived pair; row 1 is garbage that the mask must drop.
    student = torch.tensor([[LN3, 0.0], [9.0, -9.0], [LN3, 0.0]], dtype=torch.float64)
    teacher = torch.tensor([[0.0, 0.0], [-9.0, 9.0], [0.0, 0.0]], dtype=torch.float64)
    return DistillInput(student, teacher, torch.tensor([True, False, True]))


@pytest.mark.parametrize(
    "name, beta, per_token",
    [("forward_kl", 0.5, FORWARD_2), ("reverse_kl", 0.5, REVERSE_2), ("jsd", 0.5, JSD_HALF_2), ("jsd", 0.25, JSD_QUARTER_2)],
)
def test_two_word_hand_values_summed_over_masked_tokens(name, beta, per_token):
    out = distill_loss(name, two_word_batch(), DistillParams(jsd_beta=beta))
    assert out.loss.item() == pytest.approx(2 * per_token, abs=1e-12)
    assert out.metrics["count/tokens"].item() == 2.0
    assert out.metrics["distill/divergence"].item() == pytest.approx(2 * per_token, abs=1e-12)


def test_three_word_hand_values():
    batch = DistillInput(torch.zeros(1, 3, dtype=torch.float64), torch.tensor([[LN2, 0.0, 0.0]], dtype=torch.float64), torch.tensor([True]))
    assert distill_loss("forward_kl", batch, DistillParams()).loss.item() == pytest.approx(FORWARD_3, abs=1e-12)
    assert distill_loss("reverse_kl", batch, DistillParams()).loss.item() == pytest.approx(REVERSE_3, abs=1e-12)


def test_temperature_divides_logits_and_is_not_squared_into_the_loss():
    # Student (2 ln 3, 0) at T = 2 is (ln 3, 0) at T = 1, so the loss is the T = 1 value with no T^2 factor.
    batch = DistillInput(torch.tensor([[2 * LN3, 0.0]], dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64), torch.tensor([True]))
    assert distill_loss("forward_kl", batch, DistillParams(temperature=2.0)).loss.item() == pytest.approx(FORWARD_2, abs=1e-12)


def test_forward_kl_gradient_is_student_minus_teacher_probabilities():
    # d/dz_S KL(p_T || softmax(z_S)) = p_S - p_T = (3/4 - 1/2, 1/4 - 1/2) = (1/4, -1/4).
    student = torch.tensor([[LN3, 0.0]], dtype=torch.float64, requires_grad=True)
    teacher = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    distill_loss("forward_kl", DistillInput(student, teacher, torch.tensor([True])), DistillParams()).loss.backward()
    assert student.grad.tolist() == [pytest.approx([0.25, -0.25])]
    assert teacher.grad is None  # the teacher is a constant


@pytest.mark.parametrize("name", sorted(DISTILL_LOSSES))
def test_zero_when_student_equals_teacher_positive_otherwise(name):
    torch.manual_seed(0)
    logits = torch.randn(4, 7, dtype=torch.float64)
    mask = torch.ones(4, dtype=torch.bool)
    assert distill_loss(name, DistillInput(logits, logits.clone(), mask), DistillParams()).loss.abs().item() < 1e-12
    other = logits + torch.randn(4, 7, dtype=torch.float64)
    assert distill_loss(name, DistillInput(other, logits, mask), DistillParams()).loss.item() > 0


def test_jsd_limits_at_beta_zero_and_one():
    # JSD(beta) = beta KL(T||S) + O(beta^2) near 0 and (1 - beta) KL(S||T) + O((1 - beta)^2) near 1,
    # so JSD/beta -> forward KL and JSD/(1 - beta) -> reverse KL, while JSD itself -> 0.
    batch = two_word_batch()
    small = 1e-5
    near_zero = distill_loss("jsd", batch, DistillParams(jsd_beta=small)).loss.item()
    near_one = distill_loss("jsd", batch, DistillParams(jsd_beta=1 - small)).loss.item()
    assert near_zero / small == pytest.approx(2 * FORWARD_2, rel=1e-3)
    assert near_one / small == pytest.approx(2 * REVERSE_2, rel=1e-3)
    assert near_zero < 1e-4 and near_one < 1e-4
    for beta in (0.0, 1.0):
        with pytest.raises(ValueError, match="forward_kl"):
            DistillParams(jsd_beta=beta)


@pytest.mark.parametrize("name", sorted(DISTILL_LOSSES))
def test_chunked_equals_unchunked_values_and_gradients(name):
    torch.manual_seed(1)
    student = torch.randn(7, 11, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(7, 11, dtype=torch.float64)
    mask = torch.tensor([True, False, True, True, True, False, True])
    results = []
    for chunk_size in (None, 2):
        student.grad = None
        out = distill_loss(name, DistillInput(student, teacher, mask), DistillParams(temperature=1.5, jsd_beta=0.3, chunk_size=chunk_size))
        out.loss.backward()
        results.append((out.loss.detach(), student.grad.clone()))
    assert torch.allclose(results[0][0], results[1][0]) and torch.allclose(results[0][1], results[1][1])
    assert (results[0][1][~mask] == 0).all()  # masked-out positions get no gradient


@pytest.mark.parametrize("name", sorted(DISTILL_LOSSES))
def test_batch_equals_sum_of_single_tokens(name):
    torch.manual_seed(2)
    student, teacher = torch.randn(5, 6, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)
    mask = torch.tensor([True, True, False, True, True])
    params = DistillParams(jsd_beta=0.7)
    whole = distill_loss(name, DistillInput(student, teacher, mask), params).loss
    parts = sum(distill_loss(name, DistillInput(student[i : i + 1], teacher[i : i + 1], mask[i : i + 1]), params).loss for i in range(5))
    assert torch.allclose(whole, parts)


def test_empty_mask_gives_zero_that_backpropagates():
    student = torch.randn(3, 4, requires_grad=True)
    out = distill_loss("jsd", DistillInput(student, torch.randn(3, 4), torch.zeros(3, dtype=torch.bool)), DistillParams(chunk_size=2))
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.metrics["count/tokens"].item() == 0.0
    assert (student.grad == 0).all()


def test_unknown_loss_and_bad_inputs():
    batch = two_word_batch()
    with pytest.raises(ValueError, match="valid: .*'forward_kl'.*'jsd'.*'reverse_kl'"):
        distill_loss("kl", batch, DistillParams())
    with pytest.raises(ValueError, match="shape"):
        DistillInput(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        DistillInput(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2))
