"""Which sampled completions an online algorithm trains on: pure functions of the step's rewards.

Each step samples k completions for every prompt (`group_ids[i]` is the prompt of completion i) and
scores them with any reward (a verifier, a reward model, an LLM judge). Then:

* Online DPO (Guo et al., "Direct Language Model Alignment from Online AI Feedback", arXiv:2402.04792):
  `best_worst_pairs` pairs each prompt's best completion (chosen) with its worst (rejected). A prompt
  whose completions all score the same gives no preference: it is dropped and counted as a tie. Among
  equal best (or worst) scores the first sampled wins, so the choice is deterministic.
* RFT, rejection-sampling fine-tuning (Yuan et al., arXiv:2308.01825): `rejection_sample` keeps the
  completions whose reward reaches a threshold, or only each prompt's best (best-of-k) if it reaches
  it; with `dedupe`, a completion identical to one already kept for the same prompt is dropped (the
  paper trains on distinct reasoning paths). SFT follows on what is kept.
* SPIN (Chen et al., arXiv:2401.01335) needs no selection: every own answer is the rejected side of a
  pair whose chosen side is the prompt's gold answer (oxrl/loops/online.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Pairs:
    chosen: list[int]  # completion index of each pair's chosen side
    rejected: list[int]  # ... and of its rejected side (pair j is chosen[j] vs rejected[j])
    ties: int  # prompts dropped because all their completions scored the same
    reward_gaps: list[float]  # reward(chosen) - reward(rejected) of each pair, all > 0


def best_worst_pairs(rewards: torch.Tensor, group_ids: torch.Tensor) -> Pairs:
    """One (best, worst) pair per prompt of `group_ids` [N] from `rewards` [N]; ties dropped and counted."""
    chosen, rejected, gaps, ties = [], [], [], 0
    for group in torch.unique(group_ids).tolist():  # sorted: pairs in prompt order
        members = (group_ids == group).nonzero()[:, 0]
        scores = rewards[members]
        best, worst = int(members[int(scores.argmax())]), int(members[int(scores.argmin())])
        gap = float(rewards[best] - rewards[worst])
        if gap <= 0:
            ties += 1
            continue
        chosen.append(best)
        rejected.append(worst)
        gaps.append(gap)
    return Pairs(chosen, rejected, ties, gaps)


@dataclass
class Kept:
    indices: list[int]  # the completions to train on, in sampling order
    duplicates: int  # completions that qualified but repeat one already kept for their prompt


def rejection_sample(rewards: torch.Tensor, group_ids: torch.Tensor, completions: list[tuple[int, ...]],
                     keep: str = "threshold", threshold: float | None = 1.0, dedupe: bool = True) -> Kept:
    """The completions RFT keeps. `completions[i]` is completion i's token ids (compared when `dedupe`).

    keep `threshold`: every completion with reward >= `threshold`. keep `best`: per prompt, its first
    highest-scoring completion, if `threshold` is None or its reward >= `threshold`.
    """
    if keep not in ("threshold", "best"):
        raise ValueError(f"keep must be 'threshold' or 'best', got {keep!r}")
    if keep == "threshold" and threshold is None:
        raise ValueError("keep 'threshold' needs a threshold")
    passes = torch.ones_like(rewards, dtype=torch.bool) if threshold is None else rewards >= threshold
    if keep == "best":
        best = torch.zeros_like(passes)
        for group in torch.unique(group_ids).tolist():
            members = (group_ids == group).nonzero()[:, 0]
            best[members[int(rewards[members].argmax())]] = True
        passes &= best
    kept, seen, duplicates = [], set(), 0
    for i in passes.nonzero()[:, 0].tolist():
        key = (int(group_ids[i]), tuple(completions[i]))
        if dedupe and key in seen:
            duplicates += 1
            continue
        seen.add(key)
        kept.append(i)
    return Kept(kept, duplicates)
