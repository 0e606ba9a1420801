"""Rewards for RL and the online algorithms: verifiable built-ins (`math`, `format`, `code`, `reasoning_gym`),
model-judged ones (`reward_model`: a trained reward model, RLHF; `judge`: an LLM judge, RLAIF), user
functions loaded by path, weighted combinations. See `oxrl.rewards.base` for the reward signature."""

from oxrl.rewards.base import RewardError, RewardFn, RewardLoadError, batched, is_batched, load_reward_fn
from oxrl.rewards.combine import REWARDS, CombinedReward, RewardOutput, RewardSpec, build_reward_fn, resolve_reward

__all__ = [
    "REWARDS",
    "CombinedReward",
    "RewardError",
    "RewardFn",
    "RewardLoadError",
    "RewardOutput",
    "RewardSpec",
    "batched",
    "build_reward_fn",
    "is_batched",
    "load_reward_fn",
    "resolve_reward",
]
