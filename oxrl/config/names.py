"""Every name a config chooses from, declared once: `algorithm.name` grouped by family, and the
choices of every other field that names an implementation (an advantage estimator, a strategy...).

The config checks names here when it loads (no torch import needed): the schema's `Literal`s are
built from these tuples. tests/unit/test_declared_once.py checks that the registries that implement them
(`oxrl.loops.objectives`, `oxrl.config.rl_presets`, `oxrl.algorithms.*`, ...) implement exactly these
names, so a name cannot be valid in one place only. The four kinds an extension may add to
(oxrl/extensions.py) also accept the names registered at run time (`REGISTERED`, `choices`).
"""

from __future__ import annotations

import difflib
import importlib.util

SUPERVISED = ("sft", "cpt")
PREFERENCE = ("dpo", "rdpo", "hinge", "ipo", "simpo", "orpo", "kto")
REWARD_MODEL = ("rm",)
DISTILLATION = ("kd_forward", "kd_reverse", "kd_jsd")
# RL presets; their batches are sized by the `rl` section. `sgrpo` is GRPO with its paper's KL term.
# `rlhf` and `rlaif` are GRPO whose reward is a trained reward model / an LLM judge (oxrl/rewards).
RL_ALGORITHMS = ("grpo", "sgrpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "cispo", "gspo", "ppo", "rlhf", "rlaif")
# Sampled on the fly like RL, trained with an offline objective on the samples (oxrl/loops/online.py).
ONLINE = ("online_dpo", "rft", "spin")

ALGORITHM_GROUPS: dict[str, tuple[str, ...]] = {
    "supervised": SUPERVISED,
    "preference": PREFERENCE,
    "reward model": REWARD_MODEL,
    "distillation": DISTILLATION,
    "RL": RL_ALGORITHMS,
    "online": ONLINE,
}
OFFLINE_ALGORITHMS = SUPERVISED + PREFERENCE + REWARD_MODEL + DISTILLATION
SAMPLING_ALGORITHMS = RL_ALGORITHMS + ONLINE  # the ones that run the rollout loop (oxrl/loops/rl.py)
# The offline objectives that train against no fixed model (no reference, no teacher): the others need one, so the
# memory estimate counts it before the objective is built (tests/unit/test_declared_once.py checks the objectives).
REFERENCE_FREE = ("sft", "cpt", "simpo", "orpo", "rm")
ALL_ALGORITHMS = OFFLINE_ALGORITHMS + SAMPLING_ALGORITHMS


def canonical_algorithm(name: str) -> str:
    """`name` in its canonical (lower-case) spelling; ValueError with a suggestion and every valid name if unknown."""
    if not isinstance(name, str):
        raise ValueError(f"expected an algorithm name (a string), got {type(name).__name__}")
    canonical = name.strip().lower()
    if canonical not in ALL_ALGORITHMS:
        raise ValueError(unknown_algorithm_message(name))
    return canonical


def unknown_algorithm_message(name: str, family: str = "algorithm", valid: tuple[str, ...] = ALL_ALGORITHMS) -> str:
    """The error for an unknown name, e.g. "unknown algorithm `grpoo`. Did you mean `grpo`? Valid names: ...".

    `valid` narrows the suggestion to one family (e.g. only the RL presets); the listing always shows
    every group, so a name from the wrong family is easy to spot.
    """
    close = difflib.get_close_matches(str(name).strip().lower(), valid, n=1)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    groups = "; ".join(f"{group}: {', '.join(names)}" for group, names in ALGORITHM_GROUPS.items())
    return f"unknown {family} `{name}`.{hint} Valid names: {groups}"


# The other choices, each beside the field it is the choice of and the code that implements it.
DEVICES = ("auto", "cpu", "cuda")  # run.device (oxrl.training.distributed)
DTYPES = ("auto", "float32", "bfloat16", "float16")  # model.dtype, rl.rollout.vllm.dtype: torch dtype names
ATTN_IMPLEMENTATIONS = ("auto", "packed_sdpa", "sdpa", "eager", "flash_attention_2")  # model.attn_implementation
LORA_SAVE_MODES = ("merged", "adapter")  # lora.save (oxrl.models.save)
LR_SCHEDULES = ("constant", "linear", "cosine")  # train.optim.schedule (oxrl.training.optim)
MIXED_PRECISION_MODES = ("auto", "no", "bf16")  # train.mixed_precision (the strategies)
REFERENCE_MODES = ("frozen_copy", "lora_disabled", "precomputed")  # preference.reference (oxrl.models.reference)
ROLLOUT_ENGINES = ("hf", "vllm")  # rl.rollout.engine (oxrl.rollout.build.ENGINES)
ROLLOUT_DECODES = ("auto", "generate", "static", "compiled")  # rl.rollout.decode (oxrl.rollout.hf.static_decoder)
ROLLOUT_PRECISIONS = ("auto", "trainer", "bf16")  # rl.rollout.precision (oxrl.models.precision.samples_from_bf16_copy)
REWARD_ERROR_MODES = ("raise", "zero")  # rl.on_reward_error (oxrl.rewards.combine)
ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gae")  # rl.advantage (advantages.ADVANTAGES)
CRITIC_BACKBONES = ("separate", "shared")  # rl.critic_backbone (gae's critic)
NEEDS_VALUES = frozenset({"gae"})  # the advantage estimators that read a critic's values (PPO's critic is built)
POLICY_LOSS_NAMES = ("ppo", "cispo", "gspo")  # rl.policy_loss (policy_loss.POLICY_LOSSES)
# rl.aggregation (policy_loss.AGGREGATIONS)
AGGREGATION_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_ESTIMATOR_NAMES = ("k1", "k2", "k3")  # rl.kl_estimator (kl.KL_ESTIMATORS)
OFF_POLICY_CORRECTIONS = ("none", "tis", "decoupled", "mask")  # rl.off_policy_correction (policy_loss.off_policy_weight)
ANSWER_FORMATS = ("boxed", "tags")  # rl.answer_format (oxrl.data.rl_tasks.ANSWER_INSTRUCTIONS)
ONLINE_PAIR_LOSSES = ("dpo", "rdpo", "hinge", "ipo", "simpo", "orpo")  # online.loss (preference.PREFERENCE_LOSSES)
RFT_KEEP_RULES = ("threshold", "best")  # online.keep (oxrl.algorithms.online.rejection_sample)
STRATEGY_NAMES = ("auto", "single", "fsdp2", "deepspeed")  # strategy.name (oxrl.training.build)
LAUNCHERS = ("local", "ray")  # run.launcher: this process (or torchrun's), or Ray worker groups (oxrl/cluster)
RAY_LAYOUTS = ("disaggregated", "colocated")  # ray.layout (oxrl/cluster/placement.py)
ROLLOUT_SPLITS = ("prompts", "steps")  # ray.rollout_split (oxrl/cluster/remote_engine.py)
ROBOT_ENVIRONMENTS = ("reach", "pusht", "panda-push", "panda-reach")  # vla.env's built-ins (oxrl.vla.envs.BUILT_IN), or module:factory
ROBOT_FORMATS = ("lerobot",)  # robot demonstrations (oxrl/vla/lerobot.py), read by `sft` with a `vla` section
ACTION_BINNINGS = ("uniform", "uniform_q99", "quantile")  # vla.binning (oxrl.vla.action_tokens.ActionTokenizer)
EPISODE_REWARDS = ("success", "env", "env_max")  # vla.reward (oxrl.vla.episodes.VLAEpisodes.run)
ZERO_STAGES = (2, 3)  # strategy.zero_stage (oxrl.training.deepspeed_strategy)
# rl.rewards[].name's built-in rewards (oxrl.rewards.combine.REWARDS); any other name is a reference to code
REWARD_NAMES = ("math", "format", "code", "reasoning_gym", "judge", "reward_model")


# The kinds an extension adds to (oxrl/extensions.py): kind -> name -> what the config needs of it (a policy
# loss's parameter class), filled as extensions register, so the config validates a name without importing
# the registry's code.
REGISTERED: dict[str, dict[str, object]] = {"advantage": {}, "policy_loss": {}, "reward": {}, "engine": {}}
BUILTIN = {"advantage": ADVANTAGE_ESTIMATORS, "policy_loss": POLICY_LOSS_NAMES, "engine": ROLLOUT_ENGINES,
           "reward": REWARD_NAMES}


def declare(kind: str, name: str, builtin: tuple[str, ...] | list[str], info: object = None) -> None:
    """Record that an extension registered `name` of `kind`; a built-in or already registered name is an error."""
    from oxrl.user_code import ExtensionError

    taken = [*builtin, *REGISTERED[kind]]
    if name in taken:
        raise ExtensionError(f"{kind} {name!r} is already registered (taken: {', '.join(taken)}): choose another name")
    REGISTERED[kind][name] = info


def choices(kind: str) -> tuple[str, ...]:
    """The valid names of `kind`: the built-ins, then those the loaded extensions registered."""
    return (*BUILTIN[kind], *REGISTERED[kind])


# Each tracker is named after its package and its extra (oxrl.dependencies.EXTRAS); TensorBoard is
# written through `torch.utils.tensorboard`, which needs the `tensorboard` package.
TRACKERS = ("mlflow", "tensorboard", "wandb")


def check_trackers(names: list[str]) -> None:
    """A ValueError naming the trackers in `names` whose package is not installed (a lookup, no import)."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        from oxrl.dependencies import install_hint

        hints = "; ".join(install_hint(name) for name in missing)
        raise ValueError(f"tracker package not installed: {', '.join(missing)} ({hints})")
