"""A policy loss with a parameter of its own, as an extension: REINFORCE with a capped importance weight.

    extensions: [examples/extensions/capped_reinforce.py]
    rl: {policy_loss: capped_reinforce, policy_loss_params: {max_weight: 2.0}}

    w_t = sg(min(r_t, max_weight)),  r_t = pi(y_t) / pi_old(y_t)
    L_t = -w_t A_t log pi(y_t)

the CISPO form (arXiv:2506.13585 eq. 4) with an upper bound only, set by the loss's own parameter:
every token keeps a gradient, and a stale sample weighs at most `max_weight`. `finish` adds what every
loss shares (truncated IS, the `rl.aggregation`, the KL and entropy terms) and the common metrics.
"""

from dataclasses import dataclass

import torch

from oxrl.algorithms.policy_loss import PolicyLossInput, PolicyLossParams, finish
from oxrl.extensions import register_policy_loss


@dataclass(frozen=True)
class CappedReinforceParams:
    max_weight: float = 2.0

    def __post_init__(self) -> None:
        if not self.max_weight > 0:
            raise ValueError(f"max_weight must be > 0, got {self.max_weight}")


@register_policy_loss("capped_reinforce", params=CappedReinforceParams)
def capped_reinforce(inp: PolicyLossInput, params: PolicyLossParams, own: CappedReinforceParams):
    trained = inp.mask.bool()
    log_ratio = torch.where(trained, inp.logprobs.detach() - inp.old_logprobs, torch.zeros_like(inp.logprobs))
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(max=own.max_weight)
    logprobs = torch.where(trained, inp.logprobs, torch.zeros_like(inp.logprobs))
    per_token = -weight * inp.advantages.detach() * logprobs
    capped = (ratio > own.max_weight).float()
    return finish(inp, params, per_token, ratio, {"capped_frac": capped[trained].mean() if trained.any() else capped.sum()})
