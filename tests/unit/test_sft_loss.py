"""SFT/CPT losses against values derived by hand."""

import math

import torch

from oxrl.algorithms.sft import TokenLossInput, cpt_loss, sft_loss


def test_sft_is_token_mean_nll_over_trained_tokens():
    # Probabilities 1/2, 1/4, 1/8 on the trained tokens -> NLLs ln2, 2 ln2, 3 ln2; one untrained
    # token with p = 1/16 is ignored. Mean over 3 trained tokens = 6 ln2 / 3 = 2 ln2.
    logprobs = torch.tensor([0.0, -math.log(2), -math.log(4), -math.log(16), -math.log(8)])
    loss_mask = torch.tensor([False, True, True, False, True])
    seq_mask = torch.tensor([False, True, True, True, True])
    out = sft_loss(TokenLossInput(logprobs, loss_mask, seq_mask, normaliser=3))
    assert math.isclose(out.loss.item(), 2 * math.log(2), rel_tol=1e-6)


def test_sft_divides_by_the_step_normaliser_not_the_micro_batch():
    # The same micro-batch inside a step of 6 trained tokens contributes half as much.
    logprobs = torch.tensor([0.0, -math.log(2), -math.log(4), -math.log(8)])
    mask = torch.tensor([False, True, True, True])
    out = sft_loss(TokenLossInput(logprobs, mask, mask, normaliser=6))
    assert math.isclose(out.loss.item(), 6 * math.log(2) / 6, rel_tol=1e-6)


def test_cpt_trains_every_predicted_token():
    # All four predicted tokens: ln2 + 2ln2 + 4ln2 + 3ln2 = 10 ln2 over 4 tokens.
    logprobs = torch.tensor([0.0, -math.log(2), -math.log(4), -math.log(16), -math.log(8)])
    loss_mask = torch.tensor([False, True, True, False, True])
    seq_mask = torch.tensor([False, True, True, True, True])
    out = cpt_loss(TokenLossInput(logprobs, loss_mask, seq_mask, normaliser=4))
    assert math.isclose(out.loss.item(), 10 * math.log(2) / 4, rel_tol=1e-6)


def test_gradient_pushes_trained_tokens_up_only():
    logprobs = torch.tensor([0.0, -1.0, -2.0], requires_grad=True)
    mask = torch.tensor([False, True, False])
    sft_loss(TokenLossInput(logprobs, mask, torch.tensor([False, True, True]), normaliser=1)).loss.backward()
    # dL/dlogp = -1 on the trained token, 0 elsewhere.
    assert logprobs.grad.tolist() == [0.0, -1.0, 0.0]
