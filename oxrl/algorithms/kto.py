"""KTO: Kahneman-Tversky Optimisation on unpaired desirable / undesirable examples.

Ethayarajh et al. 2024, arXiv:2402.01306, section 4. For an example (x, y):

  r(x, y) = log pi(y|x) - log pi_ref(y|x)                (sequence log-probs, response tokens)
  z0      = max(0, mean_j [log pi(y'_j|x_j) - log pi_ref(y'_j|x_j)]), no gradient
  v(x, y) = lambda_D sigmoid(beta (r - z0))   if y is desirable
            lambda_U sigmoid(beta (z0 - r))   if y is undesirable
  l(x, y) = lambda_y - v(x, y)

z0 is the paper's biased estimate of KL(pi || pi_ref): the pairs (x_j, y'_j) are MISMATCHED, the
caller builds them by pairing prompt j with the completion of example j+1 (mod batch size), so
that y'_j is a plausible but not conditioned-on-x_j response. It is detached: the paper does not
back-propagate through it.

Reduction: like every offline loss here, `loss` and every metric are SUMS over this call's
examples; the caller divides by the number of examples in the whole optimizer step. Per-kind
averages are `rewards/desirable / count/desirable` (and likewise undesirable). `kl` is z0 times
the number of examples, so that dividing by the example count gives the (example-weighted) mean
of the per-micro-batch estimates.

z0 from one micro-batch depends on how the step was split. For an estimate over the whole step
(as TRL all-gathers it across ranks), compute it once with `kto_reference_point` over all the
mismatched pairs and pass it as `reference_point`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from oxrl.algorithms.output import LossOutput


@dataclass(frozen=True)
class KTOInput:
    logps: Tensor  # [B] policy log pi(y_i|x_i), summed over response tokens, with grad
    ref_logps: Tensor  # [B] reference log pi_ref(y_i|x_i)
    labels: Tensor  # [B] bool: True = desirable, False = undesirable
    kl_logps: Tensor | None = None  # [M] policy log pi(y'_j|x_j) on mismatched pairs
    ref_kl_logps: Tensor | None = None  # [M] reference log pi_ref(y'_j|x_j)
    reference_point: Tensor | None = None  # scalar z0 computed elsewhere; replaces kl_logps/ref_kl_logps

    def __post_init__(self) -> None:
        if self.logps.dim() != 1 or self.ref_logps.shape != self.logps.shape or self.labels.shape != self.logps.shape:
            raise ValueError(
                "logps, ref_logps and labels must share one shape [examples], got "
                f"{tuple(self.logps.shape)}, {tuple(self.ref_logps.shape)}, {tuple(self.labels.shape)}"
            )
        if self.labels.dtype != torch.bool:
            raise ValueError(f"labels must be bool (True = desirable), got {self.labels.dtype}")
        has_pairs = self.kl_logps is not None and self.ref_kl_logps is not None
        if has_pairs == (self.reference_point is not None):
            raise ValueError("give either kl_logps and ref_kl_logps (mismatched pairs) or reference_point, not both/neither")
        if has_pairs and self.kl_logps.shape != self.ref_kl_logps.shape:
            raise ValueError(f"kl_logps {tuple(self.kl_logps.shape)} and ref_kl_logps {tuple(self.ref_kl_logps.shape)} differ")


@dataclass(frozen=True)
class KTOParams:
    beta: float = 0.1
    # The paper advises lambda_D n_D / (lambda_U n_U) in [1, 4/3] when the classes are unbalanced.
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.beta <= 0 or self.desirable_weight < 0 or self.undesirable_weight < 0:
            raise ValueError(f"need beta > 0 and non-negative weights, got {self}")


def kto_reference_point(kl_logps: Tensor, ref_kl_logps: Tensor) -> Tensor:
    """z0 = max(0, mean(kl_logps - ref_kl_logps)), detached. [M], [M] -> scalar.

    An empty set of pairs gives z0 = 0 (no evidence that the policy has drifted)."""
    if kl_logps.numel() == 0:
        return kl_logps.new_zeros(())
    return (kl_logps - ref_kl_logps).detach().mean().clamp(min=0.0)


def kto_loss(batch: KTOInput, params: KTOParams) -> LossOutput:
    """KTO loss (arXiv:2402.01306), summed over examples; see the module docstring for the maths.

    A batch of only desirable (or only undesirable) examples is fine: each example's term needs
    only z0, never an example of the other kind."""
    if batch.reference_point is not None:
        z0 = batch.reference_point.detach().to(batch.logps.dtype)
    else:
        z0 = kto_reference_point(batch.kl_logps, batch.ref_kl_logps)
    logratios = batch.logps - batch.ref_logps  # [B] r(x, y)
    desirable = batch.labels
    # Undesirable examples flip the sign: sigmoid(beta (z0 - r)).
    signed_gap = torch.where(desirable, logratios - z0, z0 - logratios)  # [B]
    weights = torch.where(
        desirable,
        torch.full_like(logratios, params.desirable_weight),
        torch.full_like(logratios, params.undesirable_weight),
    )
    losses = weights * (1.0 - torch.sigmoid(params.beta * signed_gap))  # [B]

    rewards = (params.beta * logratios).detach()
    logps = batch.logps.detach()
    desirable_f, undesirable_f = desirable.to(rewards.dtype), (~desirable).to(rewards.dtype)
    metrics = {
        "rewards/desirable": (rewards * desirable_f).sum(),
        "rewards/undesirable": (rewards * undesirable_f).sum(),
        "logps/desirable": (logps * desirable_f).sum(),
        "logps/undesirable": (logps * undesirable_f).sum(),
        "count/desirable": desirable_f.sum(),
        "count/undesirable": undesirable_f.sum(),
        "count/examples": torch.tensor(float(logps.numel()), dtype=logps.dtype, device=logps.device),
        "kl": z0 * logps.numel(),
    }
    return LossOutput(losses.sum(), metrics)
