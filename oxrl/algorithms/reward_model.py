"""Reward-model training: the Bradley-Terry pairwise loss on scalar scores.

Reduction: like every offline loss here, `loss` and every metric are SUMS over this call's pairs;
the caller divides by the number of pairs in the whole optimizer step (`count/pairs` is this
call's share), which keeps gradient accumulation and data parallelism exact. Mean accuracy is
`rewards/accuracy / count/pairs`, mean score margin `rewards/margins / count/pairs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from oxrl.algorithms.output import LossOutput


@dataclass(frozen=True)
class RewardModelInput:
    chosen_scores: Tensor  # [P] scalar reward r(x, y_w) from the value head, with grad
    rejected_scores: Tensor  # [P] r(x, y_l)
    margin: Tensor | None = None  # [P] optional required gap m >= 0 (e.g. from a preference strength rating)

    def __post_init__(self) -> None:
        shape = self.chosen_scores.shape
        if len(shape) != 1 or self.rejected_scores.shape != shape or (self.margin is not None and self.margin.shape != shape):
            raise ValueError(
                "chosen_scores, rejected_scores (and margin) must share one shape [pairs], got "
                f"{tuple(shape)}, {tuple(self.rejected_scores.shape)}"
                + ("" if self.margin is None else f", {tuple(self.margin.shape)}")
            )


def bradley_terry_loss(batch: RewardModelInput) -> LossOutput:
    """Pairwise Bradley-Terry loss, summed over pairs.

    l = -log sigmoid(r(x, y_w) - r(x, y_l) - m)

    Bradley & Terry (1952) model P(y_w > y_l) = sigmoid(r_w - r_l); InstructGPT (Ouyang et al.
    2022, arXiv:2203.02155, eq. 1) trains reward models with its negative log-likelihood. The
    margin m (Llama 2, Touvron et al. 2023, arXiv:2307.09288, eq. 2) asks for a larger gap on
    pairs rated as clearly better; m = 0 (or None) is the plain loss.
    """
    score_gap = batch.chosen_scores - batch.rejected_scores  # [P]
    target_gap = score_gap if batch.margin is None else score_gap - batch.margin
    losses = -F.logsigmoid(target_gap)
    gap = score_gap.detach()
    metrics = {
        # Accuracy is on the raw scores: the margin shapes the loss, not which answer ranks first.
        "rewards/accuracy": (gap > 0).to(gap.dtype).sum(),
        "rewards/margins": gap.sum(),
        "rewards/chosen": batch.chosen_scores.detach().sum(),
        "rewards/rejected": batch.rejected_scores.detach().sum(),
        "count/pairs": torch.tensor(float(gap.numel()), dtype=gap.dtype, device=gap.device),
    }
    return LossOutput(losses.sum(), metrics)
