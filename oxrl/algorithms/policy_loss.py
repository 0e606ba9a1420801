"""Policy-gradient losses: PPO-clip, CISPO, GSPO, with one aggregation and one set of extras.

Every loss is `POLICY_LOSSES[name](PolicyLossInput, PolicyLossParams) -> (loss, metrics)`:
the loss builds a per-token objective [B, T]; then, in one place (`finish`), the
optional off-policy correction weighs (or drops) its tokens, `aggregate` reduces it,
and the KL-to-reference and entropy terms are added:

    loss = aggregate(off_policy_weight * per_token_pg)
           + kl_coef * aggregate(KL_est(logp, logp_ref))
           - entropy_coef * aggregate(entropy)

Normalisation (why `normaliser` is an input): the returned loss is this micro-batch's
SHARE of the optimizer step's loss: per-token sums divided by a count over the WHOLE
step (all micro-batches, all data-parallel ranks). Summing the losses of the step's
micro-batches then gives exactly the loss of one big batch, so accumulation 8 x 1 ==
1 x 8. Use `local_normaliser(mask, aggregation)` on every micro-batch, sum (and
all-reduce) them. DDP/FSDP average gradients over ranks, so the strategy multiplies
the loss by the world size to turn that average back into the sum.

Metrics are detached 0-dim tensors (no GPU sync here; the logger calls .item()) and,
like the loss, ADDITIVE over the step's micro-batches and ranks: each is this
micro-batch's share of a step-wide mean, divided by the same `normaliser`. Under
token_mean that is a mean over the step's tokens; under the two seq_* modes a mean
over sequences of per-sequence token means. Sum them; don't average them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from oxrl.algorithms.kl import KL_ESTIMATORS, k3, kl_estimate


@dataclass
class PolicyLossInput:
    logprobs: Tensor  # [B, T] current policy, sampled tokens, with grad
    old_logprobs: Tensor  # [B, T] the proximal policy (the trainer's, before this step's update), no grad
    advantages: Tensor  # [B, T] (0 off-mask; `broadcast_to_tokens` for outcome advantages)
    mask: Tensor  # [B, T] bool or 0/1: tokens that are trained
    normaliser: float  # step-wide count, see `aggregate` / `local_normaliser`
    ref_logprobs: Tensor | None = None  # [B, T] reference policy, for the KL term/metric
    entropy: Tensor | None = None  # [B, T] per-token entropy of the current policy
    behaviour_logprobs: Tensor | None = None  # [B, T] the engine's log-probs as it sampled: the behaviour policy

    def __post_init__(self) -> None:
        shape = tuple(self.logprobs.shape)
        for name in ("old_logprobs", "advantages", "mask", "ref_logprobs", "entropy", "behaviour_logprobs"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(f"PolicyLossInput.{name} has shape {tuple(value.shape)}, expected {shape} like logprobs")


@dataclass(frozen=True)
class PolicyLossParams:
    # Clip bounds of whichever loss runs: PPO's ratio, CISPO's IS weight, GSPO's sequence ratio, each kept
    # in [1 - eps_low, 1 + eps_high]. These defaults are PPO's; the RL presets (oxrl/config/rl_presets.py)
    # give cispo 1.0 / 4.0 and gspo its paper's 3e-4 / 4e-4 (arXiv:2507.18071 sec. 5.1).
    eps_low: float = 0.2
    eps_high: float = 0.2  # DAPO clip-higher (arXiv:2503.14476): 0.28
    dual_clip: float | None = None  # Dual-clip PPO c > 1 (arXiv:1912.09729), A < 0 only; None = off
    aggregation: str = "token_mean"  # one of AGGREGATIONS
    max_len: int | None = None  # constant divisor of seq_mean_token_sum_norm (Dr. GRPO)
    kl_coef: float = 0.0  # weight of the KL(pi || pi_ref) loss term; needs ref_logprobs
    kl_estimator: str = "k3"  # one of KL_ESTIMATORS (GRPO uses k3)
    entropy_coef: float = 0.0  # entropy bonus weight; needs entropy
    # Samples drawn by a behaviour policy other than the proximal one (a stale version, another engine's
    # kernels): one of OFF_POLICY_CORRECTIONS, its bound C > 1 on the weight pi_old / pi_behaviour, and a
    # bound on a sequence's KL(behaviour || proximal) beyond which it is dropped whole. Needs behaviour_logprobs.
    off_policy_correction: str = "none"
    off_policy_cap: float = 2.0
    off_policy_max_kl: float | None = None
    # The own parameters of a loss an extension registers with a parameter class (oxrl/extensions.py).
    policy_loss_params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.aggregation!r}; valid: {sorted(AGGREGATIONS)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {self.kl_estimator!r}; valid: {sorted(KL_ESTIMATORS)}")
        if self.aggregation == "seq_mean_token_sum_norm" and not (self.max_len and self.max_len > 0):
            raise ValueError("aggregation 'seq_mean_token_sum_norm' needs max_len > 0 (e.g. the max response length)")
        for name in ("eps_low", "eps_high"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if self.off_policy_correction not in OFF_POLICY_CORRECTIONS:
            raise ValueError(f"unknown off-policy correction {self.off_policy_correction!r}; "
                             f"valid: {', '.join(OFF_POLICY_CORRECTIONS)}")
        if not self.off_policy_cap > 1:
            raise ValueError(f"off_policy_cap must be > 1, got {self.off_policy_cap}")
        if self.off_policy_max_kl is not None and self.off_policy_max_kl <= 0:
            raise ValueError(f"off_policy_max_kl must be > 0 (or None), got {self.off_policy_max_kl}")


# ----------------------------------------------------------------------------- aggregation


def _token_sum(values: Tensor, mask: Tensor, max_len: int | None) -> Tensor:
    return values.sum(dim=1)


def _token_mean(values: Tensor, mask: Tensor, max_len: int | None) -> Tensor:
    return values.sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def _token_sum_over_max_len(values: Tensor, mask: Tensor, max_len: int | None) -> Tensor:
    assert max_len is not None  # checked by PolicyLossParams / aggregate
    return values.sum(dim=1) / max_len


# Each maps masked per-token values [B, T] to per-sequence contributions [B]; the
# contributions are then summed and divided by the step-wide `normaliser`.
AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, int | None], Tensor]] = {
    # DAPO (arXiv:2503.14476 eq. 8): every token of the step weighs the same.
    # normaliser = number of trained tokens in the step.
    "token_mean": _token_sum,
    # Original GRPO (arXiv:2402.03300 eq. 3): mean over each sequence's tokens, then
    # mean over sequences. normaliser = number of sequences in the step.
    "seq_mean_token_mean": _token_mean,
    # Dr. GRPO (arXiv:2503.20783 sec. 3.2): per-sequence token SUM over a constant
    # (max_len) - no length bias. normaliser = number of sequences in the step.
    "seq_mean_token_sum_norm": _token_sum_over_max_len,
}


def aggregate(
    values: Tensor, mask: Tensor, mode: str, normaliser: float, max_len: int | None = None
) -> Tensor:
    """Reduce per-token values [B, T] over trained tokens to a scalar; see AGGREGATIONS.

    Off-mask values are ignored even if they are inf/NaN (selected away, not multiplied by 0).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; valid: {sorted(AGGREGATIONS)}")
    if mode == "seq_mean_token_sum_norm" and not (max_len and max_len > 0):
        raise ValueError("aggregation 'seq_mean_token_sum_norm' needs max_len > 0")
    if normaliser <= 0:
        raise ValueError(f"normaliser must be > 0, got {normaliser}")
    trained = mask.bool()
    masked = torch.where(trained, values, torch.zeros_like(values))
    return AGGREGATIONS[mode](masked, trained, max_len).sum() / normaliser


def local_normaliser(mask: Tensor, mode: str) -> float:
    """This micro-batch's part of the step-wide normaliser: trained tokens for token_mean,
    sequences with at least one trained token otherwise (all-padding rows don't count).
    Sum it over the step's micro-batches and ranks before calling a loss."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; valid: {sorted(AGGREGATIONS)}")
    trained = mask.bool()
    count = trained.sum() if mode == "token_mean" else trained.any(dim=1).sum()
    return float(count)


# ----------------------------------------------------------------------------- shared plumbing


def _metric(values: Tensor, inp: PolicyLossInput, params: PolicyLossParams) -> Tensor:
    """This micro-batch's additive share of the step-wide mean of a per-token quantity."""
    # seq_mean_token_sum_norm's /max_len would turn a fraction into a length-dependent
    # number; metrics use the plain per-sequence mean with the same normaliser instead.
    mode = "token_mean" if params.aggregation == "token_mean" else "seq_mean_token_mean"
    return aggregate(values.detach().float(), inp.mask, mode, inp.normaliser).detach()


def _clipped_surrogate(
    ratio: Tensor, inp: PolicyLossInput, params: PolicyLossParams
) -> tuple[Tensor, dict[str, Tensor]]:
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) per token [B, T], and the fractions of
    tokens whose clip is active (zero gradient): high (A > 0, r > 1 + eps_high), low (A < 0, r < 1 - eps_low)."""
    advantages, eps_low, eps_high = inp.advantages.detach(), params.eps_low, params.eps_high
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    metrics = {
        "clip_frac_high": _metric(((advantages > 0) & (ratio > 1 + eps_high)).float(), inp, params),
        "clip_frac_low": _metric(((advantages < 0) & (ratio < 1 - eps_low)).float(), inp, params),
    }
    return -torch.minimum(unclipped, clipped), metrics


def _log_ratio(inp: PolicyLossInput, trained: Tensor) -> Tensor:
    """log(pi / pi_old) per token, 0 off-mask so padding garbage can't overflow exp()."""
    log_ratio = inp.logprobs - inp.old_logprobs.detach()
    return torch.where(trained, log_ratio, torch.zeros_like(log_ratio))


OFF_POLICY_CORRECTIONS = ("none", "tis", "decoupled", "mask")


def off_policy_weight(proximal: Tensor, behaviour: Tensor, trained: Tensor,
                      params: PolicyLossParams) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The correction for tokens sampled by a behaviour policy mu (a stale version, another engine) while
    the loss's ratio is taken against the proximal policy pi_old: per token [B, T] the weight, detached,
    and which tokens are kept (bool), from w = pi_old / mu and the bound C = `off_policy_cap`:

        tis        min(w, C)                           truncated IS (IMPALA, arXiv:1802.01561; Yao et al. 2025)
        decoupled  w, tokens with w > C dropped         decoupled PPO (arXiv:2110.00641), as AReaL bounds it
                                                       (arXiv:2505.24298 sec. 5: `behav_imp_weight_cap`)
        mask       w, tokens with w outside [1/C, C]   IcePop's two-sided mask (arXiv:2510.18855 sec. 3)
                   dropped

    With `off_policy_max_kl`, a sequence whose mean k3 estimate of KL(mu || pi_old) over its tokens
    exceeds it is dropped whole (the whole trajectory came from too far). Computed in log space and
    selected with `where`, so an overflowing w (a token mu found unlikely) never becomes inf or NaN.
    Metrics, per token: the mean weight, the fraction truncated (tis) and the fraction dropped."""
    log_w = torch.where(trained, proximal - behaviour, torch.zeros_like(proximal)).detach()
    log_cap = math.log(params.off_policy_cap)
    kept = trained.clone()
    truncated = torch.zeros_like(trained)
    if params.off_policy_correction == "tis":
        truncated = trained & (log_w > log_cap)
        log_w = log_w.clamp(max=log_cap)
    elif params.off_policy_correction == "decoupled":
        kept = trained & (log_w <= log_cap)
    elif params.off_policy_correction == "mask":
        kept = trained & (log_w.abs() <= log_cap)
    else:
        raise ValueError(f"unknown off-policy correction {params.off_policy_correction!r}; "
                         f"valid: {', '.join(OFF_POLICY_CORRECTIONS[1:])}")
    if params.off_policy_max_kl is not None:
        per_token_kl = torch.where(trained, k3(behaviour.detach(), proximal.detach()), torch.zeros_like(log_w))
        sequence_kl = per_token_kl.sum(dim=1) / trained.sum(dim=1).clamp(min=1)  # [B]
        kept = kept & (sequence_kl <= params.off_policy_max_kl)[:, None]
    weight = torch.exp(torch.where(kept, log_w, torch.zeros_like(log_w)))  # 1 where dropped: never overflows
    metrics = {"off_policy/weight_mean": torch.where(kept, weight, torch.zeros_like(weight)),
               "off_policy/truncated_frac": truncated.float(), "off_policy/dropped_frac": (trained & ~kept).float()}
    return weight, kept, metrics


def finish(
    inp: PolicyLossInput,
    params: PolicyLossParams,
    per_token_pg: Tensor,  # [B, T] the loss's objective, to be minimised
    ratio: Tensor,  # [B, T] the importance ratio the loss used (for metrics)
    metrics: dict[str, Tensor],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Off-policy correction, aggregation, KL and entropy terms, shared metrics: one home for all losses."""
    trained = inp.mask.bool()
    agg = dict(mode=params.aggregation, normaliser=inp.normaliser, max_len=params.max_len)

    # The train/inference mismatch itself is logged once, by the loop (oxrl/loops/rl_update.py); corrected here on request.
    if params.off_policy_correction != "none":
        if inp.behaviour_logprobs is None:
            raise ValueError(f"off_policy_correction {params.off_policy_correction!r} needs "
                             "PolicyLossInput.behaviour_logprobs")
        weight, kept, correction_metrics = off_policy_weight(inp.old_logprobs, inp.behaviour_logprobs, trained, params)
        # Dropped tokens are selected away, not multiplied by 0: their per-token loss may be inf.
        per_token_pg = torch.where(kept, per_token_pg * weight, torch.zeros_like(per_token_pg))
        metrics.update({key: _metric(value, inp, params) for key, value in correction_metrics.items()})

    pg_loss = aggregate(per_token_pg, inp.mask, **agg)
    loss = pg_loss
    metrics["pg_loss"] = pg_loss.detach()

    if inp.ref_logprobs is not None:
        # Padding is zeroed first: garbage there could overflow exp() and poison gradients with NaN.
        logprobs = torch.where(trained, inp.logprobs, torch.zeros_like(inp.logprobs))
        ref_logprobs = torch.where(trained, inp.ref_logprobs.detach(), torch.zeros_like(logprobs))
        kl_to_ref = kl_estimate(params.kl_estimator, logprobs, ref_logprobs)  # [B, T]
        metrics["kl_ref"] = _metric(kl_to_ref, inp, params)
        if params.kl_coef != 0:
            loss = loss + params.kl_coef * aggregate(kl_to_ref, inp.mask, **agg)
    elif params.kl_coef != 0:
        raise ValueError("kl_coef is set but PolicyLossInput.ref_logprobs is None")

    if inp.entropy is not None:
        metrics["entropy"] = _metric(inp.entropy, inp, params)
        if params.entropy_coef != 0:
            loss = loss - params.entropy_coef * aggregate(inp.entropy, inp.mask, **agg)
    elif params.entropy_coef != 0:
        raise ValueError("entropy_coef is set but PolicyLossInput.entropy is None")

    # KL(old || new) by k3 with y ~ old: how far this update has moved the policy.
    metrics["approx_kl"] = _metric(k3(inp.old_logprobs, inp.logprobs.detach()), inp, params)
    metrics["ratio_mean"] = _metric(ratio.detach(), inp, params)
    return loss, metrics


# ----------------------------------------------------------------------------- losses


def ppo(inp: PolicyLossInput, params: PolicyLossParams) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman et al., arXiv:1707.06347 eq. 7), with asymmetric clip
    (DAPO clip-higher, arXiv:2503.14476) and optional dual clip (Ye et al., arXiv:1912.09729):

        r_t  = exp(logp_t - logp_old_t)
        L_t  = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)
        dual clip, A_t < 0 only:  L_t = min(L_t, -c A_t)   (caps the loss at c |A_t|)

    Clipped tokens (A > 0 and r > 1 + eps_high; A < 0 and r < 1 - eps_low; dual: A < 0
    and r > c) get zero gradient. Metrics: clip_frac_high, clip_frac_low, dual_clip_frac.
    """
    ratio = torch.exp(_log_ratio(inp, inp.mask.bool()))  # [B, T]
    per_token, metrics = _clipped_surrogate(ratio, inp, params)
    if params.dual_clip is not None:
        negative = inp.advantages < 0
        capped = torch.minimum(per_token, -params.dual_clip * inp.advantages.detach())
        per_token = torch.where(negative, capped, per_token)
        metrics["dual_clip_frac"] = _metric((negative & (ratio > params.dual_clip)).float(), inp, params)
    return finish(inp, params, per_token, ratio, metrics)


def cispo(inp: PolicyLossInput, params: PolicyLossParams) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv:2506.13585 eqs. 4-5): clip the importance-sampling WEIGHT,
    not the update, and stop its gradient:

        w_t = sg(clip(r_t, 1 - eps_low, 1 + eps_high))
        L_t = -w_t A_t logp_t          grad L_t = -w_t A_t grad logp_t

    Every token keeps a gradient (PPO zeroes clipped ones, which in long reasoning are
    often the rare "fork" tokens). The loss VALUE contains logp, so it is not comparable
    with PPO's. Metrics: clip_frac_high/low = weight truncated above/below (any sign of A).
    MiniMax-M1 sets no lower bound (eps_low >= 1) and does not publish eps_high (the cispo preset: 1.0 / 4.0).
    """
    trained = inp.mask.bool()
    ratio = torch.exp(_log_ratio(inp, trained)).detach()
    weight = ratio.clamp(1 - params.eps_low, 1 + params.eps_high)
    logprobs = torch.where(trained, inp.logprobs, torch.zeros_like(inp.logprobs))
    per_token = -weight * inp.advantages.detach() * logprobs
    metrics = {
        "clip_frac_high": _metric((ratio > 1 + params.eps_high).float(), inp, params),
        "clip_frac_low": _metric((ratio < 1 - params.eps_low).float(), inp, params),
    }
    return finish(inp, params, per_token, ratio, metrics)


def gspo(inp: PolicyLossInput, params: PolicyLossParams) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al., arXiv:2507.18071), token-level form "GSPO-token" (eqs. 13-14):

        s_i    = exp( 1/|y_i| sum_t (logp_{i,t} - logp_old_{i,t}) )      sequence ratio
        s_i,t  = sg(s_i) * pi(y_t) / sg(pi(y_t))                          value = s_i
        L_i,t  = -min(s_i,t A_i,t, clip(s_i,t, 1 - eps_low, 1 + eps_high) A_i,t)

    grad s_i,t = s_i grad logp_t, so with a per-sequence advantage and the paper's
    per-sequence mean (aggregation "seq_mean_token_mean") this is exactly GSPO; other
    aggregations weigh sequences by length. A whole sequence is clipped or not. The paper's eps are
    3e-4 / 4e-4 (the gspo preset): a sequence ratio, a mean over tokens, moves far less than a token's.
    """
    trained = inp.mask.bool()
    log_ratio = _log_ratio(inp, trained)  # [B, T]
    seq_log_ratio = log_ratio.sum(dim=1) / trained.sum(dim=1).clamp(min=1)  # [B]
    # Adding the detached sequence term last keeps the value exact (verl#2775).
    token_log_ratio = inp.logprobs - inp.logprobs.detach() + seq_log_ratio.detach()[:, None]
    token_log_ratio = torch.where(trained, token_log_ratio, torch.zeros_like(token_log_ratio))
    ratio = torch.exp(token_log_ratio)  # [B, T], value s_i on every trained token
    per_token, metrics = _clipped_surrogate(ratio, inp, params)
    return finish(inp, params, per_token, ratio, metrics)


PolicyLoss = Callable[[PolicyLossInput, PolicyLossParams], tuple[Tensor, dict[str, Tensor]]]
POLICY_LOSSES: dict[str, PolicyLoss] = {"ppo": ppo, "cispo": cispo, "gspo": gspo}


def policy_loss(
    name: str, inp: PolicyLossInput, params: PolicyLossParams = PolicyLossParams()
) -> tuple[Tensor, dict[str, Tensor]]:
    """`POLICY_LOSSES[name](inp, params)`; unknown names raise listing the valid ones."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; valid: {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[name](inp, params)
