"""Supervised fine-tuning and continued pre-training: negative log-likelihood of tokens.

Both objectives share one signature, `TokenLossInput -> LossOutput`, the one every token-level
offline objective uses, so the loop never knows which it runs.

Normalisation (the trap of gradient accumulation): the loss is the SUM of token NLLs in this
micro-batch divided by `normaliser`, the number of trained tokens in the WHOLE optimizer step
(all micro-batches, all ranks). Summing the micro-batch losses then gives exactly the token mean
over the step, so batch 8 x accumulation 1 and batch 1 x accumulation 8 have the same gradient.
Dividing each micro-batch by its own token count instead would weight short micro-batches up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oxrl.algorithms.output import LossOutput


@dataclass
class TokenLossInput:
    logprobs: torch.Tensor  # [T] log p(token_t | prefix), with grad
    loss_mask: torch.Tensor  # [T] bool: the tokens the data format trains (e.g. assistant turns)
    sequence_mask: torch.Tensor  # [T] bool: every token that has a prediction (all but each sequence's first)
    normaliser: float  # trained tokens in the whole optimizer step


def sft_loss(inp: TokenLossInput) -> LossOutput:
    """Token-mean NLL over the trained tokens: L = -(1/N) sum_{t in mask} log p(x_t | x_<t)."""
    nll = -(inp.logprobs * inp.loss_mask.to(inp.logprobs.dtype)).sum()
    loss = nll / inp.normaliser
    return LossOutput(loss, {"loss": loss.detach(), "nll": loss.detach()})


def cpt_loss(inp: TokenLossInput) -> LossOutput:
    """Continued pre-training: NLL on every predicted token, whatever the format's mask says
    (e.g. chat data trains its prompts and templates too)."""
    nll = -(inp.logprobs * inp.sequence_mask.to(inp.logprobs.dtype)).sum()
    loss = nll / inp.normaliser
    return LossOutput(loss, {"loss": loss.detach(), "nll": loss.detach()})


TOKEN_LOSSES = {"sft": sft_loss, "cpt": cpt_loss}
