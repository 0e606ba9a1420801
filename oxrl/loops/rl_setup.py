"""RL inputs and models: prompts (generated task or files) rendered to token ids, the reward function or environment,
and the policy with its reference, critic and rollout engine."""

from __future__ import annotations

import logging

from oxrl.config.names import ONLINE
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
    if not entries and rl.task is not None:
        entries = default_rewards(rl.task, rl.answer_format)
    elif not entries:  # prompt files: the math reward, unless a dataset declares rl2 rows, which name no reward
        formats = {spec.format for spec in cfg.data.train + cfg.data.validation}
        entries = default_rewards("rl2" if "rl2" in formats else "gsm8k", rl.answer_format)
    return [RewardSpec(s.name, s.weight, dict(s.kwargs), on_error=rl.on_reward_error, timeout_s=rl.reward_timeout_s)
            for s in entries]


def reward_function(cfg: Config, rl: RLConfig):
    if cfg.vla is not None or cfg.environment is not None:
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
    if cfg.environment is None:
        return None
    from oxrl.loops.multiturn import load_environment

    env = load_environment(cfg.environment.path, cfg.environment.max_turns, tokenizer)
    logger.info("environment: %s, at most %d turns per episode", env.reference, env.max_turns)
    return env


def read_prompts(cfg: Config, strategy, tokenizer, processor=None):
    """Before any model loads: the episode runner (or None), the training and validation prompts as token ids,
    and the longest packed micro-batch they can make (for the memory estimate; None with an episode runner, whose
    turns are not known in advance). What the run cannot serve is refused here."""
    from oxrl.data.rl_tasks import encode_prompts

    rl = cfg.rl
    if processor is not None and cfg.critic == "separate":
        raise ValueError("rl.critic_backbone `separate` loads the critic as a text model (a token classifier), "
                         "which cannot read a vision-language policy's images; use rl.critic_backbone: shared (a "
                         "value head on the policy's own hidden states) or an advantage estimator without a critic "
                         "(e.g. grpo)")
    env = environment(cfg, tokenizer, processor)
    if env is not None and rl.rollout.engine == "hf" and strategy.shards_parameters and strategy.world_size > 1:
        # Ranks finish their episodes after different numbers of turns, hence different numbers of
        # `generate` calls; with sharded weights each decoding step is a collective and would hang.
        raise ValueError("rl.env with the built-in `hf` engine needs unsharded weights under torchrun: use "
                         "strategy.name `deepspeed` with zero_stage 2, or one process")
    train, validation = load_prompts(cfg, rl)
    # A prompt leaves room for its completion within data.max_length; a longer one follows data.truncation.
    first_turn, completion = cfg.read("rl.rollout.max_new_tokens"), "rl.rollout.max_new_tokens"
    if first_turn is None:  # under `vla` a turn samples one action chunk, whose length the environment sets
        first_turn = env.turn_tokens
        completion = f"an action chunk's {first_turn} tokens, vla.chunk x the action's dimensions"
        if cfg.data.max_length <= first_turn:  # (the config checks rl.rollout.max_new_tokens itself)
            raise ValueError(f"data.max_length ({cfg.data.max_length}) must exceed {completion}: a prompt gets the "
                             "tokens the completion leaves")
    budget = {"max_tokens": cfg.data.max_length - first_turn, "truncation": cfg.data.truncation,
              "processor": processor, "completion": completion}
    train, validation = encode_prompts(train, tokenizer, **budget), encode_prompts(validation, tokenizer, **budget)
    if cfg.environment is not None and (train.vision or validation.vision):
        raise ValueError("rl.env (multi-turn episodes) takes text prompts only; these prompts have images")
    logger.info("RL prompts: %d train / %d validation", len(train.prompt_ids), len(validation.prompt_ids))
    if cfg.algorithm.name == "spin":
        from oxrl.loops.online import spin_iteration_steps

        # iteration ends fit, or refused now
        spin_iteration_steps(cfg, len(train.prompt_ids), validating=bool(validation.prompt_ids))
    # A micro-batch packs completions of the longest prompt at most (an episode's turns: unknown, the worst case).
    longest = max((len(ids) for ids in train.prompt_ids + validation.prompt_ids), default=0)
    row_tokens = None if env is not None else cfg.train.micro_batch_size_per_device * (longest + rl.rollout.max_new_tokens)
    return env, train, validation, row_tokens


def rl_handles(cfg: Config, strategy, tokenizer, reward_fn, env, train_prompts: int, remote=None, processor=None):
    """The policy, its frozen reference (KL), the critic (PPO) and the rollout engine, loaded for the RL loop; for
    an online algorithm the policy, its method (with the loss's reference) and the engine. Under Ray (`remote`)
    the engine is the rollout workers, shared by every rank."""
    from oxrl.loops.rl import RLHandles
    from oxrl.models.load import load_model
    from oxrl.models.source import resolve_source
    from oxrl.training.strategy import SingleDevice

    rl, device = cfg.rl, strategy.device
    shared_head = cfg.critic == "shared"
    if shared_head and not isinstance(strategy, SingleDevice):
        raise ValueError("rl.critic_backbone `shared` trains in one process only for now (strategy `single`): the value "
                         "head is not sharded with the policy under fsdp2/deepspeed. Use rl.critic_backbone: separate")
    model = load_model(cfg.model, device, cfg.lora)
    if cfg.algorithm.name in ONLINE:
        from oxrl.loops.online import build_online

        online, sampled = build_online(cfg, model, tokenizer, strategy, train_prompts)
        engine = _rollout_engine(cfg, sampled, tokenizer, strategy, remote, processor)
        return RLHandles(cfg, model, strategy, engine, reward_fn, env, tokenizer=tokenizer, online=online,
                         shared_rollouts=remote is not None, ahead=_sampled_ahead(cfg))
    reference = None
    if rl.kl_coef > 0:  # beta = 0 builds no reference at all
        from oxrl.models.reference import build_reference

        # With LoRA the base weights never move: the policy with its adapters off is the reference, as in DPO.
        reference = build_reference("lora_disabled" if cfg.lora.enabled else "frozen_copy", model, [],
                                    cfg.train.micro_batch_size_per_device, strategy)
    critic = None
    if shared_head:  # PPO's critic as a head on the policy's backbone (saved beside a final folder: reused from one)
        from oxrl.loops.critic import SharedValueHead
        from oxrl.models.value_head import attach_value_head

        critic = SharedValueHead(attach_value_head(model, resolve_source(cfg.model.name_or_path).path), rl.value_coef,
                                 rl.value_clip)
    elif cfg.critic == "separate":  # PPO's critic as a model of its own
        from oxrl.loops.critic import Critic
        from oxrl.models.critic import load_critic

        source = resolve_source(rl.critic_model or cfg.model.name_or_path).path
        critic = Critic.configured(load_critic(source, device, cfg.model.trust_remote_code), strategy, cfg)
    engine = _rollout_engine(cfg, model, tokenizer, strategy, remote, processor)
    return RLHandles(cfg, model, strategy, engine, reward_fn, env, reference, critic, tokenizer,
                     shared_rollouts=remote is not None, ahead=_sampled_ahead(cfg))


def _sampled_ahead(cfg: Config):
    """`rl.max_staleness` >= 1: the schedule that samples steps ahead of the update (oxrl/loops/pipeline.py)."""
    if not cfg.rl.max_staleness:
        return None
    from oxrl.loops.pipeline import RolloutPipeline

    return RolloutPipeline.of


def _rollout_engine(cfg: Config, model, tokenizer, strategy, remote, processor=None):
    """The rollout engine sampling from `model`: built here, or the Ray rollout workers (`remote`, which load the
    processor themselves)."""
    from oxrl.rollout.build import build_engine

    if remote is None:
        rollout = cfg.rl.rollout.model_copy(update={"precision": cfg.engine_precision})
        return build_engine(rollout, model, tokenizer, strategy, cfg.run.seed, processor)
    from oxrl.models.precision import uses_bf16

    # The probe's tolerance is that of the precision the trainers compute in (bf16 rounds the probe too).
    dtype = ("bfloat16" if uses_bf16(cfg.train.mixed_precision, strategy.device.type)
             else str(next(model.parameters()).dtype).removeprefix("torch."))
    return remote.engine(model, tokenizer, strategy, dtype, cfg.rl.rollout.vllm.sync_check_tolerance)
