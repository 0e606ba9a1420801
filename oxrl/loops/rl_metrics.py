"""What one RL step reports about its rollouts, and how ranks' metrics combine into the step's."""

from __future__ import annotations

import torch

from oxrl.loops.mismatch import mismatch_metrics, mismatch_sums, sampled_logprobs


def rollout_metrics(rollout) -> dict[str, float]:
    """Rewards, lengths, advantages (RL), and (with old log-probs) the engine/trainer mismatch and KL to the reference."""
    lengths = torch.tensor([c.num_sampled for c in rollout.completions], dtype=torch.float32)  # sampled tokens
    rewards = rollout.rewards
    metrics = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "truncated_fraction": sum(c.finish_reason == "length" for c in rollout.completions) / len(rollout.completions),
    }
    if rollout.advantages is not None:  # (online algorithms train on examples, without advantages)
        advantages = torch.cat(rollout.advantages)
        metrics.update({"advantage/mean": float(advantages.mean()),
                        "advantage/std": float(advantages.std()) if advantages.numel() > 1 else 0.0,
                        "advantage/abs_max": float(advantages.abs().max())})
    old, ref = rollout.old_logprobs, rollout.ref_logprobs
    if old is not None:  # else the update measures the engine/trainer mismatch (oxrl/loops/mismatch.py)
        metrics.update(mismatch_metrics(mismatch_sums(*sampled_logprobs(rollout.completions, old))))
    if ref is not None and old is not None:  # (without old log-probs the loss reports kl_ref)
        kl = torch.cat([o - f for o, f in zip(old, ref)])
        metrics["kl_ref/k1_mean"] = float(kl.mean()) if kl.numel() else 0.0
    return metrics


def global_metrics(strategy, metrics: dict[str, float], rewards: torch.Tensor) -> dict[str, float]:
    """Step metrics over all ranks: means of the ranks' means (every rank holds as many completions),
    maxima for `*max*` keys, and the reward spread from the gathered rewards."""
    if strategy.world_size == 1:
        return metrics
    per_rank = strategy.gather_objects(metrics)
    combined = {}
    for key in metrics:
        values = [m[key] for m in per_rank]
        combined[key] = max(values) if "max" in key else sum(values) / len(values)
    everyone = torch.cat(strategy.gather_objects(rewards))
    combined["reward/std"] = float(everyone.std()) if everyone.numel() > 1 else 0.0
    return combined
