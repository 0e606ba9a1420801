"""RL algorithm presets: a name fills the `rl` fields the user did not set. Which of them the resulting
algorithm reads is declared beside each setting (`ReadOnly` in oxrl/config/schema.py).

    name          advantage     loss   aggregation           eps_low, eps_high   paper
    grpo          grpo (std)    ppo    seq_mean_token_mean   0.2, 0.2            arXiv:2402.03300
    sgrpo         grpo (std)    ppo    seq_mean_token_mean   0.2, 0.2            arXiv:2402.03300, + KL (k3, 0.04)
    dr_grpo       dr_grpo       ppo    token_mean            0.2, 0.2            arXiv:2503.20783
    dapo          grpo (std)    ppo    token_mean            0.2, 0.28           arXiv:2503.14476
    rloo          rloo          ppo    token_mean            0.2, 0.2            arXiv:2402.14740
    reinforce_pp  reinforce_pp  ppo    token_mean            0.2, 0.2            arXiv:2501.03262
    cispo         grpo (std)    cispo  token_mean            1.0, 4.0            arXiv:2506.13585
    gspo          grpo (std)    gspo   seq_mean_token_mean   3e-4, 4e-4          arXiv:2507.18071
    ppo           gae + critic  ppo    token_mean            0.2, 0.2            arXiv:1707.06347, 2203.02155
    rlhf          grpo (std)    ppo    seq_mean_token_mean   0.2, 0.2            GRPO on a reward model (2203.02155)
    rlaif         grpo (std)    ppo    seq_mean_token_mean   0.2, 0.2            GRPO on an LLM judge (2309.00267)

`rl.eps_low`/`rl.eps_high` are the clip bounds of whichever policy loss is chosen: PPO's ratio clip,
CISPO's clip of its importance-sampling weight, GSPO's clip of its sequence ratio. CISPO (MiniMax-M1)
imposes no lower bound (eps_low 1.0: the weight is never below 0 anyway) and does not publish its
eps_high; 4.0 is a loose cap chosen here, tune it. GSPO's 3e-4 / 4e-4 are its paper's (sec. 5.1): a
sequence ratio, a mean over tokens, moves far less than a token ratio.

Dr. GRPO removes GRPO's per-sequence length normalisation and std division; oxRL's default
aggregation, a token mean over the whole optimizer step, has no per-sequence length term either.
For the paper's exact constant divisor set `rl.aggregation: seq_mean_token_sum_norm` (the constant
is `rl.rollout.max_new_tokens`).

`grpo` leaves out the KL term (kl_coef 0: no reference model is built), as most recent recipes do;
`sgrpo` keeps DeepSeekMath's: beta = 0.04 on the k3 estimator (`rl.kl_estimator`'s default), which
builds a frozen reference model. A `kl_coef` the user sets wins over either preset.

`rlhf` and `rlaif` are GRPO named after their reward: the config requires a `reward_model` / `judge`
reward in `rl.rewards` (oxrl/rewards/reward_model_reward.py, judge.py).

The online algorithms (`online_dpo`, `rft`, `spin`) sample through the same `rl` section but train an
offline objective on the samples (oxrl/loops/online.py): no preset fills their `rl` section, and the
settings of the policy-gradient update are refused for them.

`resolve` runs when the config is validated (`oxrl.config.schema.Config`), so the `rl` section of an
RL config is always resolved. Pure data: no torch here.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from oxrl.config.names import OFFLINE_ALGORITHMS, ONLINE, RL_ALGORITHMS, unknown_algorithm_message

# The `rl` section, oxrl.config.schema.RLConfig (the schema imports this module, so not the other way round).
RLConfig = TypeVar("RLConfig", bound=BaseModel)

_GRPO = {"advantage": "grpo", "policy_loss": "ppo", "aggregation": "seq_mean_token_mean"}

PRESETS: dict[str, dict] = {
    "grpo": _GRPO,
    "sgrpo": {**_GRPO, "kl_coef": 0.04},
    "dr_grpo": {"advantage": "dr_grpo", "policy_loss": "ppo", "aggregation": "token_mean"},
    "dapo": {"advantage": "grpo", "policy_loss": "ppo", "aggregation": "token_mean", "eps_high": 0.28},
    "rloo": {"advantage": "rloo", "policy_loss": "ppo", "aggregation": "token_mean"},
    "reinforce_pp": {"advantage": "reinforce_pp", "policy_loss": "ppo", "aggregation": "token_mean"},
    "cispo": {"advantage": "grpo", "policy_loss": "cispo", "aggregation": "token_mean",
              "eps_low": 1.0, "eps_high": 4.0},
    "gspo": {"advantage": "grpo", "policy_loss": "gspo", "aggregation": "seq_mean_token_mean",
             "eps_low": 3e-4, "eps_high": 4e-4},
    "ppo": {"advantage": "gae", "policy_loss": "ppo", "aggregation": "token_mean"},
    "rlhf": _GRPO,
    "rlaif": _GRPO,
}
DEFAULTS = {"eps_low": 0.2, "eps_high": 0.2, "kl_coef": 0.0}


def is_rl(name: str) -> bool:
    """Whether `name` samples its training data on the fly (the rollout loop): an RL preset or an online algorithm."""
    key = name.strip().lower()
    return key in PRESETS or key in ONLINE


def resolve(name: str, rl: RLConfig) -> RLConfig:
    """A copy of `rl` with the preset's values wherever the user left a field unset (None); a ValueError for
    stale samples without a correction. Resolving twice changes nothing."""
    key = name.strip().lower()  # the config stores names in lower case; library callers may not
    if key not in PRESETS:
        if key in OFFLINE_ALGORITHMS:
            raise ValueError(f"`{name}` is an offline objective, not an RL algorithm; RL presets: {', '.join(PRESETS)}")
        raise ValueError(unknown_algorithm_message(name, "RL algorithm", RL_ALGORITHMS))
    filled = {**DEFAULTS, **PRESETS[key]}
    resolved = rl.model_copy(update={field: value for field, value in filled.items() if getattr(rl, field) is None})
    if resolved.max_staleness and resolved.off_policy_correction == "none" and not resolved.accept_uncorrected:
        raise ValueError(f"rl.max_staleness = {resolved.max_staleness} trains `{name}` on samples up to "
                         f"{resolved.max_staleness} policy versions old: set rl.off_policy_correction (decoupled, tis "
                         "or mask), or rl.accept_uncorrected: true to train on them as if on-policy")
    return resolved


def preset_values(name: str) -> dict[str, Any]:
    """The `rl` fields an RL algorithm's preset fills when they are left unset, with its values ({} for others)."""
    key = name.strip().lower()
    return {**DEFAULTS, **PRESETS[key]} if key in PRESETS else {}
