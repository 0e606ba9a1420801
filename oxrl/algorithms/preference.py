"""Offline pairwise preference losses: DPO, cDPO, rDPO, SLiC hinge, IPO, SimPO, ORPO.

Every loss has the signature `(PreferenceInput, its own params) -> LossOutput` and is looked up by
name in `PREFERENCE_LOSSES`, with its parameter class (`DPOParams`, ...: what it reads, and nothing
else) and whether it needs a frozen reference model at all (SimPO and ORPO are reference-free).

Conventions (the caller, not this file, must honour them):

* A sequence log-prob is the SUM of the token log-probs of the RESPONSE only: prompt and
  template tokens are excluded, the end-of-turn token (e.g. `<|im_end|>`) is included, because
  the assistant is trained to emit it. `*_tokens` counts exactly those tokens (as a float), so
  `chosen_logps / chosen_tokens` is the mean per-token log-prob that SimPO, ORPO and
  length-normalised IPO use.
* Reduction: `LossOutput.loss` is the SUM over the pairs of this call, and so is every metric
  (e.g. `rewards/accuracy` is the number of pairs ranked right). The caller divides the loss and
  the metrics by the number of pairs in the WHOLE optimizer step (all micro-batches, all ranks):
  then gradient accumulation and data parallelism give exactly the mean over the step, whereas
  dividing each micro-batch by its own size would weight small micro-batches up.
  `count/pairs` is the denominator this call contributes.
* `h` below is the log-ratio margin
  h = [log pi(y_w|x) - log pi_ref(y_w|x)] - [log pi(y_l|x) - log pi_ref(y_l|x)],
  and the implicit reward of a response is beta * [log pi(y|x) - log pi_ref(y|x)].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from oxrl.algorithms.output import LossOutput


@dataclass(frozen=True)
class PreferenceInput:
    chosen_logps: Tensor  # [P] policy log pi(y_w|x), summed over response tokens, with grad
    rejected_logps: Tensor  # [P] policy log pi(y_l|x)
    chosen_tokens: Tensor  # [P] float: trained tokens of y_w
    rejected_tokens: Tensor  # [P] float: trained tokens of y_l
    ref_chosen_logps: Tensor | None = None  # [P] log pi_ref(y_w|x); None for reference-free losses
    ref_rejected_logps: Tensor | None = None  # [P]
    chosen_nll: Tensor | None = None  # [P] ORPO's SFT term, NLL SUM over y_w; None -> -chosen_logps

    def __post_init__(self) -> None:
        shape = self.chosen_logps.shape
        if len(shape) != 1:
            raise ValueError(f"chosen_logps must have shape [pairs], got {tuple(shape)}")
        for name in ("rejected_logps", "chosen_tokens", "rejected_tokens", "ref_chosen_logps", "ref_rejected_logps", "chosen_nll"):
            value = getattr(self, name)
            if value is not None and value.shape != shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {tuple(shape)} like chosen_logps")
        if (self.ref_chosen_logps is None) != (self.ref_rejected_logps is None):
            raise ValueError("give both ref_chosen_logps and ref_rejected_logps, or neither")


# Each loss's own hyper-parameters: the loss reads these and nothing else.


@dataclass(frozen=True)
class BetaParams:
    """hinge's, and the base of the others: beta, the inverse temperature of the implicit reward (IPO's tau; SimPO
    scales mean token log-probs by it, its paper taking 2-2.5). DPO's default is 0.1."""

    beta: float = 0.1

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")


@dataclass(frozen=True)
class DPOParams(BetaParams):
    label_smoothing: float = 0.0  # cDPO: the assumed probability that a label is flipped

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.label_smoothing <= 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5], got {self.label_smoothing}")


@dataclass(frozen=True)
class RDPOParams(BetaParams):
    rdpo_epsilon: float = 0.1  # rDPO: the known label-flip rate

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.rdpo_epsilon < 0.5:
            raise ValueError(f"rdpo_epsilon must be in [0, 0.5) (1 - 2 eps divides the loss), got {self.rdpo_epsilon}")


@dataclass(frozen=True)
class IPOParams(BetaParams):
    # IPO on mean per-token log-probs (TRL's choice) instead of sums (the paper's). False = paper.
    ipo_length_normalise: bool = False


@dataclass(frozen=True)
class SimPOParams(BetaParams):
    simpo_gamma: float = 0.5  # SimPO's target reward margin gamma (not gamma/beta)


@dataclass(frozen=True)
class ORPOParams:
    orpo_lambda: float = 0.1  # ORPO's weight of the odds-ratio term (ORPO has no beta)

    def __post_init__(self) -> None:
        if self.orpo_lambda < 0:
            raise ValueError(f"orpo_lambda must be >= 0, got {self.orpo_lambda}")


def _policy_ref_logratios(batch: PreferenceInput) -> tuple[Tensor, Tensor]:
    """log pi/pi_ref of the chosen and of the rejected response, each [P]."""
    if batch.ref_chosen_logps is None or batch.ref_rejected_logps is None:
        raise ValueError("this loss needs reference log-probs (ref_chosen_logps, ref_rejected_logps)")
    return batch.chosen_logps - batch.ref_chosen_logps, batch.rejected_logps - batch.ref_rejected_logps


def _output(losses: Tensor, chosen_rewards: Tensor, rejected_rewards: Tensor, batch: PreferenceInput, **extra: Tensor) -> LossOutput:
    """Sum the per-pair losses [P] and build the summed metrics shared by every loss."""
    chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
    metrics = {
        "rewards/chosen": chosen_rewards.sum(),
        "rewards/rejected": rejected_rewards.sum(),
        "rewards/margins": (chosen_rewards - rejected_rewards).sum(),
        # Ties count as wrong: a pair is ranked right only when chosen is strictly ahead.
        "rewards/accuracy": (chosen_rewards > rejected_rewards).to(losses.dtype).sum(),
        "logps/chosen": batch.chosen_logps.detach().sum(),
        "logps/rejected": batch.rejected_logps.detach().sum(),
        "count/pairs": torch.tensor(float(losses.numel()), dtype=losses.dtype, device=losses.device),
    }
    metrics.update({name: value.detach().sum() for name, value in extra.items()})
    return LossOutput(losses.sum(), metrics)


def dpo_loss(batch: PreferenceInput, params: DPOParams) -> LossOutput:
    """DPO (Rafailov et al. 2023, arXiv:2305.18290), with cDPO label smoothing.

    l = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)

    eps = `label_smoothing` is cDPO's (Mitchell 2023, "A note on DPO with noisy preferences")
    assumed flip rate: the loss is the cross-entropy against the soft label 1 - eps. eps = 0 is
    DPO; at h = 0 the loss is log 2 whatever eps.
    """
    chosen_logratios, rejected_logratios = _policy_ref_logratios(batch)
    logits = params.beta * (chosen_logratios - rejected_logratios)  # [P] beta h
    eps = params.label_smoothing
    losses = -(1.0 - eps) * F.logsigmoid(logits) - eps * F.logsigmoid(-logits)
    return _output(losses, params.beta * chosen_logratios, params.beta * rejected_logratios, batch)


def rdpo_loss(batch: PreferenceInput, params: RDPOParams) -> LossOutput:
    """Robust DPO (Chowdhury et al. 2024, arXiv:2403.00409).

    l = [(1 - eps) * -log sigmoid(beta h) - eps * -log sigmoid(-beta h)] / (1 - 2 eps)

    Unlike cDPO the flipped-label term is SUBTRACTED: this makes l an unbiased estimate of the
    clean-label DPO loss when labels flip with known probability eps (so one pair's l can be
    negative). eps = 0 is DPO.
    """
    chosen_logratios, rejected_logratios = _policy_ref_logratios(batch)
    logits = params.beta * (chosen_logratios - rejected_logratios)  # [P]
    eps = params.rdpo_epsilon
    losses = ((1.0 - eps) * -F.logsigmoid(logits) - eps * -F.logsigmoid(-logits)) / (1.0 - 2.0 * eps)
    return _output(losses, params.beta * chosen_logratios, params.beta * rejected_logratios, batch)


def hinge_loss(batch: PreferenceInput, params: BetaParams) -> LossOutput:
    """SLiC hinge (Zhao et al. 2023, arXiv:2305.10425) on the reference-normalised margin as in
    RSO (Liu et al. 2023, arXiv:2309.06657): l = max(0, 1 - beta h).

    SLiC's calibration loss max(0, delta - log pi(y_w) + log pi(y_l)) has no reference: it is
    this loss with delta = 1/beta (up to the factor beta) and zero reference log-probs.
    """
    chosen_logratios, rejected_logratios = _policy_ref_logratios(batch)
    losses = torch.relu(1.0 - params.beta * (chosen_logratios - rejected_logratios))  # [P]
    return _output(losses, params.beta * chosen_logratios, params.beta * rejected_logratios, batch)


def ipo_loss(batch: PreferenceInput, params: IPOParams) -> LossOutput:
    """IPO (Azar et al. 2023, arXiv:2310.12036): l = (h - 1/(2 beta))^2, beta = tau.

    The paper's h uses whole-sequence log-probs (sums). With `ipo_length_normalise` each
    log-ratio is divided by its response's token count first (TRL's implementation), which
    changes the scale of h and hence the meaning of beta.
    """
    chosen_logratios, rejected_logratios = _policy_ref_logratios(batch)
    if params.ipo_length_normalise:
        chosen_logratios = chosen_logratios / batch.chosen_tokens
        rejected_logratios = rejected_logratios / batch.rejected_tokens
    losses = (chosen_logratios - rejected_logratios - 1.0 / (2.0 * params.beta)) ** 2  # [P]
    return _output(losses, params.beta * chosen_logratios, params.beta * rejected_logratios, batch)


def simpo_loss(batch: PreferenceInput, params: SimPOParams) -> LossOutput:
    """SimPO (Meng et al. 2024, arXiv:2405.14734), reference-free:

    r(y) = (beta / |y|) log pi(y|x)            (mean per-token log-prob, scaled)
    l = -log sigmoid(r(y_w) - r(y_l) - gamma)

    gamma is the margin itself; the authors' code takes gamma/beta instead.
    """
    chosen_rewards = params.beta * batch.chosen_logps / batch.chosen_tokens  # [P]
    rejected_rewards = params.beta * batch.rejected_logps / batch.rejected_tokens
    losses = -F.logsigmoid(chosen_rewards - rejected_rewards - params.simpo_gamma)
    return _output(losses, chosen_rewards, rejected_rewards, batch)


def _log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x < 0 without cancellation (Maechler 2012): expm1 near 0, log1p far.

    The far branch sees a safe dummy where it is not selected: torch.where's backward still
    multiplies by the unselected branch's derivative, and log1p(-exp(x)) has an infinite one at 0.
    """
    near_zero = x > -math.log(2.0)
    far_x = torch.where(near_zero, torch.full_like(x, -1.0), x)
    return torch.where(near_zero, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(far_x)))


def orpo_loss(batch: PreferenceInput, params: ORPOParams) -> LossOutput:
    """ORPO (Hong et al. 2024, arXiv:2403.07691), reference-free:

    m(y)   = (1/|y|) log pi(y|x)               (mean per-token log-prob; P(y|x) = exp m)
    log odds(y) = m(y) - log(1 - exp m(y))
    l = NLL(y_w) / |y_w| - lambda * log sigmoid(log odds(y_w) - log odds(y_l))

    The SFT term is the per-token mean NLL of the chosen response, as in the paper's L_SFT.
    m is clamped just below 0: a response the policy emits with probability 1 has infinite odds.
    Reported rewards are lambda * m(y) (TRL's convention), whose order matches the odds' order.
    """
    tiny = torch.finfo(batch.chosen_logps.dtype).tiny
    chosen_mean = (batch.chosen_logps / batch.chosen_tokens).clamp(max=-tiny)  # [P]
    rejected_mean = (batch.rejected_logps / batch.rejected_tokens).clamp(max=-tiny)
    log_odds_ratio = (chosen_mean - _log1mexp(chosen_mean)) - (rejected_mean - _log1mexp(rejected_mean))
    chosen_nll = -batch.chosen_logps if batch.chosen_nll is None else batch.chosen_nll
    sft_term = chosen_nll / batch.chosen_tokens  # [P]
    odds_ratio_term = -F.logsigmoid(log_odds_ratio)
    losses = sft_term + params.orpo_lambda * odds_ratio_term
    return _output(
        losses,
        params.orpo_lambda * chosen_mean,
        params.orpo_lambda * rejected_mean,
        batch,
        **{"orpo/nll": sft_term, "orpo/odds_ratio_loss": odds_ratio_term, "orpo/log_odds_ratio": log_odds_ratio},
    )


class PreferenceLoss(NamedTuple):
    loss: Callable[[PreferenceInput, Any], LossOutput]  # (PreferenceInput, an instance of `params`) -> LossOutput
    params: type  # its hyper-parameters, read from the `preference` settings of the same names
    needs_reference: bool  # whether it reads ref_*_logps: the loop builds (and runs) a reference model only if so


PREFERENCE_LOSSES: dict[str, PreferenceLoss] = {
    "dpo": PreferenceLoss(dpo_loss, DPOParams, needs_reference=True),
    "rdpo": PreferenceLoss(rdpo_loss, RDPOParams, needs_reference=True),
    "hinge": PreferenceLoss(hinge_loss, BetaParams, needs_reference=True),
    "ipo": PreferenceLoss(ipo_loss, IPOParams, needs_reference=True),
    "simpo": PreferenceLoss(simpo_loss, SimPOParams, needs_reference=False),
    "orpo": PreferenceLoss(orpo_loss, ORPOParams, needs_reference=False),
}


def preference_loss(name: str, batch: PreferenceInput, params=None) -> LossOutput:
    """Look up `name` in PREFERENCE_LOSSES and apply it, with its own params (default: its defaults); an unknown
    name lists the valid ones, and params of another loss's class are refused."""
    if name not in PREFERENCE_LOSSES:
        raise ValueError(f"unknown preference loss {name!r}; valid: {sorted(PREFERENCE_LOSSES)}")
    loss, params_class, _ = PREFERENCE_LOSSES[name]
    params = params_class() if params is None else params
    if type(params) is not params_class:
        raise TypeError(f"preference loss {name!r} takes {params_class.__name__}, not {type(params).__name__}")
    return loss(batch, params)
