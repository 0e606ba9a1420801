"""Per-token estimators of KL(pi || pi_ref) from sampled-token log-probabilities.

Source: J. Schulman, "Approximating KL Divergence" (blog, 2020,
http://joschu.net/blog/kl-approx.html). For a token y sampled from pi, with
log r = log pi_ref(y) - log pi(y):

    k1 = -log r                      = logp - logp_ref       unbiased, high variance, can be < 0
    k2 = 0.5 (log r)^2               = 0.5 (logp - logp_ref)^2   biased, low variance, >= 0
    k3 = (r - 1) - log r             = exp(logp_ref - logp) - (logp_ref - logp) - 1
                                                                 unbiased, low variance, >= 0

k3 >= 0 because exp(x) >= 1 + x. GRPO (arXiv:2402.03300, eq. 4) puts k3 in the loss;
PPO-RLHF (InstructGPT, arXiv:2203.02155) subtracts k1 from the reward instead
(`kl_penalty_rewards`). All three are exactly 0 where logp == logp_ref.

The estimators are unbiased for KL(pi || pi_ref) only when y ~ pi. In an RL step the
tokens were sampled from the behaviour policy, which is pi only on the first update
of a batch; every library accepts this approximation and so do we.

No clamping: a huge log-ratio means something upstream is broken, and hiding it
behind a clamp would also zero its gradient. Padding is the caller's business (mask
the result, or use `policy_loss.aggregate`).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor



def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = logp - logp_ref, per token (same shape as the inputs)."""
    return logprobs - ref_logprobs


def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = 0.5 (logp - logp_ref)^2, per token. Used as a loss its gradient is
    (logp - logp_ref) grad logp, whose expectation under y ~ pi is exactly grad KL(pi || pi_ref)."""
    return 0.5 * (logprobs - ref_logprobs).square()


def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = exp(logp_ref - logp) - (logp_ref - logp) - 1, per token (GRPO's choice,
    arXiv:2402.03300 eq. 4, there written pi_ref/pi - log(pi_ref/pi) - 1)."""
    log_ratio = ref_logprobs - logprobs  # log(pi_ref / pi)
    return torch.expm1(log_ratio) - log_ratio  # expm1: exact near log_ratio = 0


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": k1, "k2": k2, "k3": k3}


def kl_estimate(name: str, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Dispatch to `KL_ESTIMATORS[name]`; an unknown name raises a ValueError listing the valid ones."""
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {name!r}; valid: {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name](logprobs, ref_logprobs)


def kl_penalty_rewards(
    token_rewards: Tensor,  # [B, T]
    logprobs: Tensor,  # [B, T] behaviour policy log-probs of the sampled tokens
    ref_logprobs: Tensor,  # [B, T]
    beta: float,
    mask: Tensor | None = None,  # [B, T] 1 on trained tokens; None = every token
) -> Tensor:
    """Reward-penalty KL form (InstructGPT arXiv:2203.02155 eq. 2; Ziegler et al. arXiv:1909.08593):

        r'_t = r_t - beta * (logp_t - logp_ref_t)        (k1 per token)

    The penalty is a reward, not a loss: the log-probs are detached so no gradient flows
    through it. Tokens outside `mask` are left unchanged (no penalty on padding).
    """
    penalty = beta * k1(logprobs.detach(), ref_logprobs.detach())  # [B, T]
    if mask is not None:
        penalty = torch.where(mask.bool(), penalty, torch.zeros_like(penalty))
    return token_rewards - penalty
