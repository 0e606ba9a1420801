"""RL inputs: prompts (generated task or files) rendered to token ids, and the reward function or environment."""

from __future__ import annotations

import logging

from oxrl.config.schema import Config, RLConfig
from oxrl.data.rl_tasks import RLPrompt, default_rewards, task_prompts
from oxrl.rewards.combine import CombinedReward, RewardSpec, build_reward_fn

logger = logging.getLogger(__name__)


def load_prompts(cfg: Config, rl: RLConfig) -> tuple[list[RLPrompt], list[RLPrompt]]:
    """Training and validation prompts: `rl.task`'s generated ones, those of prompt files (read like offline
    data, `oxrl.data.rl_prompts.load_rl_prompts`), or a VLA's simulator's initial states (oxrl/vla/build.py)."""
    if cfg.vla is not None:
        from oxrl.vla.build import initial_state_prompts

        return initial_state_prompts(cfg)
    if rl.task is not None:
        return task_prompts(rl, cfg.run.seed)
    from oxrl.data.rl_prompts import load_rl_prompts

    loaded = load_rl_prompts(cfg.data, rl, seed=cfg.run.seed)
    return loaded.train, loaded.validation


def reward_specs(cfg: Config, rl: RLConfig) -> list[RewardSpec]:
    """The rewards the run scores with: `rl.rewards`, else the task's default; none for SPIN without either."""
    if cfg.algorithm.name == "spin" and not rl.rewards and rl.task is None:
        return []
    entries = rl.rewards
    if not entries:  # prompt files: the math reward, unless a dataset declares rl2 rows, which name no reward
        formats = {spec.format for spec in cfg.data.train + cfg.data.validation}
        entries = default_rewards(rl.task if rl.task is not None else ("rl2" if "rl2" in formats else "gsm8k"),
                                  rl.answer_format)
    return [RewardSpec(s.name, s.weight, dict(s.kwargs), on_error=rl.on_reward_error, timeout_s=rl.reward_timeout_s)
            for s in entries]


def reward_function(cfg: Config, rl: RLConfig):
    if cfg.vla is not None or rl.env is not None:
        return None  # episodes reward themselves
    specs = reward_specs(cfg, rl)
    if not specs:
        logger.info("rewards: none (spin pairs each own answer with the gold one; name rl.rewards to score them)")
        return CombinedReward([])  # every sample scores 0
    logger.info("rewards: %s", ", ".join(f"{s.name} x{s.weight}" for s in specs))
    return build_reward_fn(specs)


def environment(cfg: Config, tokenizer, processor=None):
    """The episode runner: the multi-turn environment (oxrl/loops/multiturn.py) `rl.env` names, or a VLA's
    simulator (`vla`, oxrl/vla/episodes.py), checked now, before the model loads; None without one."""
    if cfg.vla is not None:
        from oxrl.vla.build import episode_runner

        return episode_runner(cfg, tokenizer, processor)
    rl = cfg.rl
    if rl.env is None:
        return None
    from oxrl.loops.multiturn import load_environment

    env = load_environment(rl.env.path, rl.env.max_turns, tokenizer)
    logger.info("environment: %s, at most %d turns per episode", env.reference, env.max_turns)
    return env
