"""The PPO critic's loss: clipped value regression (Schulman et al., arXiv:1707.06347, with the
value clipping of the PPO reference implementation, as used for RLHF in arXiv:2203.02155).

    L_V = 1/2 * max( (V - R)^2 , (V_old + clip(V - V_old, -eps, eps) - R)^2 )

per trained token, summed and divided by `normaliser` (trained tokens in the whole optimizer step,
like every oxRL loss, so accumulation is exact). `eps = None` turns clipping off (plain squared
error). R is the GAE lambda-return (`oxrl.algorithms.advantages.gae`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class ValueLossInput:
    values: Tensor  # [B, T] current critic, with grad
    old_values: Tensor  # [B, T] critic when the rollouts were scored, no grad
    returns: Tensor  # [B, T] regression targets
    mask: Tensor  # [B, T] trained tokens
    normaliser: float  # trained tokens in the whole optimizer step


def value_loss(inp: ValueLossInput, clip_eps: float | None = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    trained = inp.mask.bool()
    unclipped = (inp.values - inp.returns) ** 2
    if clip_eps is None:
        per_token = unclipped
        clipped_frac = torch.zeros(())
    else:
        clipped_values = inp.old_values + (inp.values - inp.old_values).clamp(-clip_eps, clip_eps)
        clipped = (clipped_values - inp.returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clipped_frac = ((clipped > unclipped) & trained).sum().float().detach() / inp.normaliser
    loss = 0.5 * torch.where(trained, per_token, torch.zeros_like(per_token)).sum() / inp.normaliser
    error = torch.where(trained, (inp.values.detach() - inp.returns).abs(), torch.zeros_like(per_token)).sum()
    return loss, {"critic/loss": loss.detach(), "critic/clip_frac": clipped_frac, "critic/abs_error": error / inp.normaliser}
