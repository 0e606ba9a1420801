"""The clipped value loss against hand-derived numbers."""

import torch

from oxrl.algorithms.value_loss import ValueLossInput, value_loss


def test_unclipped_is_half_squared_error_mean():
    # Errors 1 and 3 on two trained tokens, third token untrained: (1 + 9) / 2 / 2 tokens = 2.5.
    inp = ValueLossInput(values=torch.tensor([[1.0, 3.0, 100.0]]), old_values=torch.tensor([[1.0, 3.0, 0.0]]),
                         returns=torch.tensor([[0.0, 0.0, 0.0]]), mask=torch.tensor([[1, 1, 0]]), normaliser=2)
    loss, _ = value_loss(inp, clip_eps=None)
    assert abs(loss.item() - 2.5) < 1e-6


def test_clipping_takes_the_pessimistic_branch():
    # V_old = 0, V = 1, eps = 0.2, R = 1: unclipped error 0, clipped V = 0.2 -> error 0.64.
    # max(0, 0.64) / 2 = 0.32, and the gradient w.r.t. V is 0 (the clipped branch is constant in V).
    values = torch.tensor([[1.0]], requires_grad=True)
    inp = ValueLossInput(values=values, old_values=torch.tensor([[0.0]]), returns=torch.tensor([[1.0]]),
                         mask=torch.tensor([[1]]), normaliser=1)
    loss, metrics = value_loss(inp, clip_eps=0.2)
    loss.backward()
    assert abs(loss.item() - 0.32) < 1e-6 and values.grad.item() == 0.0 and metrics["critic/clip_frac"].item() == 1.0


def test_inside_the_clip_range_the_gradient_is_the_error():
    # V = 0.1 within 0.2 of V_old = 0; R = 1: loss = 0.5 * 0.81, dL/dV = V - R = -0.9.
    values = torch.tensor([[0.1]], requires_grad=True)
    inp = ValueLossInput(values=values, old_values=torch.tensor([[0.0]]), returns=torch.tensor([[1.0]]),
                         mask=torch.tensor([[1]]), normaliser=1)
    loss, _ = value_loss(inp, clip_eps=0.2)
    loss.backward()
    assert abs(loss.item() - 0.405) < 1e-6 and abs(values.grad.item() + 0.9) < 1e-6
