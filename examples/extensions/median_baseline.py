"""An advantage estimator as an extension: each completion's reward minus its group's median.

    extensions: [examples/extensions/median_baseline.py]
    rl: {advantage: median_baseline}

A_i = r_i - median{r_j : j in i's group}: a baseline a single outlier in the group does not move (the
GRPO mean does). Written per completion ([B] -> [B]); `outcome_on_tokens` gives the value to every
trained token of the completion, as the built-in group estimators do.
"""

import torch

from oxrl.algorithms.advantages import AdvantageInput, AdvantageParams, outcome_on_tokens
from oxrl.extensions import register_advantage


def median_baseline(inp: AdvantageInput, params: AdvantageParams) -> torch.Tensor:
    rewards = inp.rewards.float()
    advantages = torch.empty_like(rewards)
    for group in inp.group_ids.unique():
        members = inp.group_ids == group
        # The lower median for an even group (torch.median), so a group of two keeps one at 0.
        advantages[members] = rewards[members] - rewards[members].median()
    return advantages


register_advantage("median_baseline")(outcome_on_tokens(median_baseline))
