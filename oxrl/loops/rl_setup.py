"""RL inputs: prompts (generated task or files) rendered to token ids, and the reward function or environment."""

from __future__ import annotations

import logging

from oxrl.config.schema import Config, RLConfig
from oxrl.data.rl_tasks import PromptTemplate, RLPrompt, default_reward_specs, generate_rl_prompts, read_rl_prompts
from oxrl.loops.rl import RLPromptBatch
from oxrl.rewards.combine import RewardSpec, build_reward_fn
from oxrl.rollout.multiturn import Environment, load_environment

logger = logging.getLogger(__name__)


def load_prompts(cfg: Config, rl: RLConfig) -> tuple[list[RLPrompt], list[RLPrompt]]:
    custom = {"user": rl.prompt_template} if rl.prompt_template is not None else {}
    template = PromptTemplate(answer_format=rl.answer_format, system=rl.system_prompt, **custom)
    if rl.task is not None:
        return generate_rl_prompts(rl.task, train_size=rl.task_size, validation_size=rl.validation_size,
                                   seed=cfg.run.seed, template=template, **rl.task_config)
    if not cfg.data.train:
        raise ValueError("RL needs prompts: set rl.task (e.g. `arithmetic`) or data.train to prompt files")

    def read(specs) -> list[RLPrompt]:
        return [p for spec in specs for p in read_rl_prompts(spec.path, rl.data_format, split=spec.split,
                                                                 max_rows=spec.max_rows, template=template)]

    train = read(cfg.data.train)
    val = read(cfg.data.validation)
    if not val and rl.validation_size:
        val, train = train[: rl.validation_size], train[rl.validation_size :]  # files arrive in a fixed order
    return train, val


def reward_function(cfg: Config, rl: RLConfig):
    if rl.rewards:
        specs = [RewardSpec(s.name, s.weight, dict(s.kwargs), on_error=rl.on_reward_error) for s in rl.rewards]
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


def encode(prompts: list[RLPrompt], tokenizer) -> RLPromptBatch:
    """Token ids of each prompt, ready for generation (chat template + generation header)."""
    ids, texts = [], []
    for prompt in prompts:
        if prompt.messages is not None and tokenizer.chat_template:
            ids.append(list(tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=True,
                                                          return_dict=True)["input_ids"]))
            texts.append(prompt.messages[-1]["content"])
        else:
            text = prompt.prompt if prompt.prompt is not None else "\n".join(m["content"] for m in prompt.messages)
            ids.append(tokenizer(text)["input_ids"])
            texts.append(text)
    return RLPromptBatch(ids, texts, [p.fields for p in prompts], [p.origin for p in prompts])
