"""The numbers an evaluation reports from scored completions. The RL loop's held-out evaluation
(`evaluate` in oxrl/loops/rl.py) and `oxrl eval` both sample with `sample_and_reward` and summarise here.

A completion is *correct* when it has full marks (>= 1) on the first reward: the correctness reward
(`math`, `reasoning_gym`, an environment's `score`); with several rewards, name that one first.

    summarise(completions, scored) = {
        "accuracy":                 fraction of correct completions (one greedy sample per prompt: greedy accuracy)
        "reward/mean":              mean total (weighted) reward
        "reward/<label>":           each reward's mean, when there are several
        "response_length/mean":     sampled tokens per completion; also "response_length/max"
        "truncated_fraction":       completions cut off at max_new_tokens
        "pass@k":                   k = 1, 2, 4, ..., n when every prompt has n > 1 samples (pass_at_k.py)
    }
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import torch

from oxrl.algorithms.pass_at_k import pass_at_k

if TYPE_CHECKING:
    from oxrl.rewards.combine import RewardOutput
    from oxrl.rollout.base import Completion


def correct_flags(components: dict[str, list[float]]) -> list[bool]:
    """Per completion: full marks on the first (correctness) reward."""
    first = next(iter(components.values()), [])
    return [score >= 1.0 for score in first]


def accuracy_of(components: dict[str, list[float]]) -> float:
    """Fraction of completions with full marks on the first (correctness) reward."""
    flags = correct_flags(components)
    return sum(flags) / len(flags) if flags else 0.0


def pass_ks(n: int) -> list[int]:
    """The k reported for n samples per prompt: powers of two below n, and n itself (n = 6: 1, 2, 4, 6)."""
    ks = [1 << power for power in range(n.bit_length()) if 1 << power < n]
    return ks + [n]


def summarise(completions: list[Completion], scored: RewardOutput) -> dict[str, float]:
    """The module docstring's metrics of completions and their rewards (in the same order)."""
    if not completions:
        return {}
    lengths = [c.num_sampled for c in completions]
    metrics = {
        "accuracy": accuracy_of(scored.components),
        "reward/mean": sum(scored.totals) / len(scored.totals),
        **({f"reward/{label}": sum(s) / len(s) for label, s in scored.components.items()} if len(scored.components) > 1 else {}),
        "response_length/mean": sum(lengths) / len(lengths),
        "response_length/max": float(max(lengths)),
        "truncated_fraction": sum(c.finish_reason == "length" for c in completions) / len(completions),
    }
    samples, correct = Counter(), Counter()
    for completion, is_correct in zip(completions, correct_flags(scored.components)):
        samples[completion.prompt_index] += 1
        correct[completion.prompt_index] += is_correct
    prompts = sorted(samples)
    n, c = torch.tensor([samples[p] for p in prompts]), torch.tensor([correct[p] for p in prompts])
    if int(n.min()) > 1:
        for k in pass_ks(int(n.min())):
            metrics[f"pass@{k}"] = float(pass_at_k(n, c, k).mean())
    return metrics
