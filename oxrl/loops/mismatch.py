"""How far the rollout engine's log-probs are from the trainer's, on the tokens the engine sampled.

Two numbers per step, over every sampled token (environment-written tokens of multi-turn episodes have no
engine log-prob and are left out):

    logprob_mismatch/mean_abs   mean |log p_engine(y) - log p_trainer(y)|
    logprob_mismatch/kl         mean k3 estimate of KL(engine || trainer), y ~ engine (0 when they agree)

They are 0 up to float noise when the engine samples from the weights being trained (the built-in
engine, or vLLM after a verified sync); a growing value means the samples are off-policy (stale
weights, kernel or precision differences), which `rl.off_policy_correction` corrects and `rl.strict_on_policy`
refuses. Computed from additive sums, so micro-batches and ranks combine exactly.
"""

from __future__ import annotations

import torch

from oxrl.algorithms.kl import k3
from oxrl.rollout.base import Completion


class OffPolicyError(RuntimeError):
    """`strict_on_policy` found the samples were not drawn from the policy being trained."""


def sampled_logprobs(completions: list[Completion], trainer_logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Engine and trainer log-probs [N] of every sampled token, aligned. Both cover the sampled tokens only:
    environment-written tokens (multi-turn) have no engine log-prob and are never trained."""
    for completion, trainer in zip(completions, trainer_logprobs):
        if len(completion.logprobs) != trainer.numel():
            raise ValueError(f"the engine gave {len(completion.logprobs)} log-probs for a completion with "
                             f"{trainer.numel()} trained tokens")
    engine = [torch.tensor(c.logprobs, dtype=torch.float32) for c in completions]
    return (torch.cat(engine), torch.cat(trainer_logprobs).float()) if engine else (torch.zeros(0), torch.zeros(0))


def mismatch_sums(engine: torch.Tensor, trainer: torch.Tensor) -> dict[str, float]:
    """Additive sums over the given sampled tokens [N] (sum them over micro-batches and ranks)."""
    engine, trainer = engine.detach().float(), trainer.detach().float()
    return {"abs": float((engine - trainer).abs().sum()), "kl": float(k3(engine, trainer).sum()), "tokens": float(engine.numel())}


def mismatch_metrics(sums: dict[str, float]) -> dict[str, float]:
    tokens = max(sums["tokens"], 1.0)
    return {"logprob_mismatch/mean_abs": sums["abs"] / tokens, "logprob_mismatch/kl": sums["kl"] / tokens}


def check_on_policy(mean_abs_gap: float, tolerance: float) -> None:
    """Raise unless the engine sampled from the policy being trained."""
    if not mean_abs_gap <= tolerance:
        raise OffPolicyError(
            f"strict_on_policy: the rollout engine's log-probs differ from the trainer's by {mean_abs_gap:.3g} on "
            f"average (tolerance {tolerance}); the engine is sampling from stale or different weights"
        )
