"""An advantage estimator as an extension: each completion's reward minus its group's median, with a
parameter of its own.

    extensions: [examples/extensions/median_baseline.py]
    rl: {advantage: median_baseline, advantage_params: {clip: 2.0}}

A_i = r_i - median{r_j : j in i's group}: a baseline a single outlier in the group does not move (the
GRPO mean does), and with `clip` the advantage itself bounded to [-clip, clip], so one outlier cannot
dominate the step either. Written per completion ([B] -> [B]); `outcome_on_tokens` gives the value to
every trained token of the completion, as the built-in group estimators do.
"""

from dataclasses import dataclass

import torch

from oxrl.algorithms.advantages import AdvantageInput, AdvantageParams, outcome_on_tokens
from oxrl.extensions import register_advantage


@dataclass(frozen=True)
class MedianBaselineParams:
    clip: float | None = None  # bound |A_i| by this; null: no bound

    def __post_init__(self) -> None:
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"clip must be > 0 or null, got {self.clip}")


def median_baseline(inp: AdvantageInput, params: AdvantageParams, own: MedianBaselineParams) -> torch.Tensor:
    rewards = inp.rewards.float()
    advantages = torch.empty_like(rewards)
    for group in inp.group_ids.unique():
        members = inp.group_ids == group
        # The lower median for an even group (torch.median), so a group of two keeps one at 0.
        advantages[members] = rewards[members] - rewards[members].median()
    return advantages if own.clip is None else advantages.clamp(-own.clip, own.clip)


register_advantage("median_baseline", params=MedianBaselineParams)(outcome_on_tokens(median_baseline))
