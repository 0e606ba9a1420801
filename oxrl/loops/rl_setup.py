"""RL inputs: prompts (generated task or files) rendered to token ids, and the reward function or environment."""

from __future__ import annotations

import logging

from oxrl.config.schema import Config, DatasetSpec, RLConfig
from oxrl.data.rl_tasks import PromptTemplate, RLPrompt, default_reward_specs, generate_rl_prompts, read_rl_prompts
from oxrl.rewards.combine import RewardSpec, build_reward_fn
from oxrl.rollout.multiturn import Environment, load_environment

logger = logging.getLogger(__name__)

# `rl.validation_size` left unset: a generated task gets this many held-out prompts; prompt files hold
# out a tenth of their rows, at most this many (so files of fewer than 10 rows train on every row).
DEFAULT_VALIDATION_SIZE = 100
DEFAULT_VALIDATION_ONE_IN = 10


def load_prompts(cfg: Config, rl: RLConfig) -> tuple[list[RLPrompt], list[RLPrompt]]:
    if rl.task is not None:
        validation_size = DEFAULT_VALIDATION_SIZE if rl.validation_size is None else rl.validation_size
        return generate_rl_prompts(rl.task, train_size=rl.task_size, validation_size=validation_size,
                                   seed=cfg.run.seed, template=prompt_template(rl), **rl.task_config)
    if not cfg.data.train:
        raise ValueError("RL needs prompts: set rl.task (e.g. `arithmetic`) or data.train to prompt files")
    train = read_prompt_files(cfg.data.train, rl)
    if cfg.data.validation:
        if rl.validation_size is not None:
            logger.warning("rl.validation_size is ignored: the validation prompts are data.validation")
        return train, read_prompt_files(cfg.data.validation, rl)
    held = validation_split_size(rl.validation_size, len(train))
    logger.info("validation: the first %d of %d prompt rows of data.train are held out", held, len(train))
    return train[held:], train[:held]  # files arrive in a fixed order


def prompt_template(rl: RLConfig) -> PromptTemplate:
    custom = {"user": rl.prompt_template} if rl.prompt_template is not None else {}
    return PromptTemplate(answer_format=rl.answer_format, system=rl.system_prompt, **custom)


def read_prompt_files(specs: list[DatasetSpec], rl: RLConfig) -> list[RLPrompt]:
    """Every row of the prompt files, in order, in `rl.data_format`, wrapped by the `rl` prompt template."""
    template = prompt_template(rl)
    prompts = []
    for spec in specs:
        prompts += read_rl_prompts(spec.path, rl.data_format, split=spec.split, max_rows=spec.max_rows,
                                   columns=spec.columns, template=template)
    return prompts


def validation_split_size(requested: int | None, rows: int) -> int:
    """How many of the `rows` training prompts to hold out for validation (see `RLConfig.validation_size`).

    Unset: a bounded fraction that always leaves training rows. Set: exactly that many, which must
    leave at least one row to train on.
    """
    if requested is None:
        return min(DEFAULT_VALIDATION_SIZE, rows // DEFAULT_VALIDATION_ONE_IN)
    if requested >= rows:
        raise ValueError(
            f"rl.validation_size is {requested} but data.train has {rows} prompt rows: holding out {requested} "
            f"leaves none to train on; set rl.validation_size below {rows} (0 for no validation), leave it unset "
            "(10% of the rows, at most 100), or give data.validation"
        )
    return requested


def reward_function(cfg: Config, rl: RLConfig):
    if rl.rewards:
        specs = [RewardSpec(s.name, s.weight, dict(s.kwargs), on_error=rl.on_reward_error, timeout_s=rl.reward_timeout_s)
                 for s in rl.rewards]
    else:
        task = rl.task if rl.task is not None else ("gsm8k" if rl.data_format in ("auto", "gsm8k", "openr1") else rl.data_format)
        specs = default_reward_specs(task, rl.answer_format)
        for spec in specs:
            spec.on_error = rl.on_reward_error
    logger.info("rewards: %s", ", ".join(f"{s.name} x{s.weight}" for s in specs))
    return build_reward_fn(specs)


def environment(rl: RLConfig, tokenizer) -> Environment | None:
    """The multi-turn environment `rl.env` names (checked now, before the model loads), or None."""
    if rl.env is None:
        return None
    env = load_environment(rl.env.path, rl.env.max_turns, tokenizer)
    logger.info("environment: %s, at most %d turns per episode", env.reference, env.max_turns)
    return env
