"""The one output type of every offline loss function."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class LossOutput:
    # Scalar. Each family documents its reduction: SFT/CPT return their share of the step's
    # token mean (already divided by the step-wide normaliser); preference, KTO, RM and KD
    # return sums that the caller divides. Either way the loop can sum micro-batch outputs.
    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)  # detached scalars, additive like the loss
