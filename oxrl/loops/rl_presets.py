"""RL algorithm presets: a name fills the `rl` fields the user did not set.

    name          advantage     loss   aggregation           clip (low, high)   paper
    grpo          grpo (std)    ppo    seq_mean_token_mean   0.2, 0.2           arXiv:2402.03300
    sgrpo         grpo (std)    ppo    seq_mean_token_mean   0.2, 0.2           arXiv:2402.03300, + KL (k3, 0.04)
    dr_grpo       dr_grpo       ppo    token_mean            0.2, 0.2           arXiv:2503.20783
    dapo          grpo (std)    ppo    token_mean            0.2, 0.28          arXiv:2503.14476
    rloo          rloo          ppo    token_mean            0.2, 0.2           arXiv:2402.14740
    reinforce_pp  reinforce_pp  ppo    token_mean            0.2, 0.2           arXiv:2501.03262
    cispo         grpo (std)    cispo  token_mean            (its own caps)     arXiv:2506.13585
    gspo          grpo (std)    gspo   seq_mean_token_mean   (its own eps)      arXiv:2507.18071
    ppo           gae + critic  ppo    token_mean            0.2, 0.2           arXiv:1707.06347, 2203.02155

Dr. GRPO removes GRPO's per-sequence length normalisation and std division; oxRL's default
aggregation, a token mean over the whole optimizer step, has no per-sequence length term either.
For the paper's exact constant divisor set `rl.aggregation: seq_mean_token_sum_norm` (the constant
is `rl.rollout.max_new_tokens`).

`grpo` leaves out the KL term (kl_coef 0: no reference model is built), as most recent recipes do;
`sgrpo` keeps DeepSeekMath's: beta = 0.04 on the k3 estimator (`rl.kl_estimator`'s default), which
builds a frozen reference model. A `kl_coef` the user sets wins over either preset.
"""

from __future__ import annotations

from oxrl.algorithms.advantages import AdvantageParams
from oxrl.algorithms.policy_loss import PolicyLossParams
from oxrl.config.names import OFFLINE_ALGORITHMS, RL_ALGORITHMS, unknown_algorithm_message
from oxrl.config.schema import RLConfig

_GRPO = {"advantage": "grpo", "policy_loss": "ppo", "aggregation": "seq_mean_token_mean"}

PRESETS: dict[str, dict] = {
    "grpo": _GRPO,
    "sgrpo": {**_GRPO, "kl_coef": 0.04},
    "dr_grpo": {"advantage": "dr_grpo", "policy_loss": "ppo", "aggregation": "token_mean"},
    "dapo": {"advantage": "grpo", "policy_loss": "ppo", "aggregation": "token_mean", "eps_high": 0.28},
    "rloo": {"advantage": "rloo", "policy_loss": "ppo", "aggregation": "token_mean"},
    "reinforce_pp": {"advantage": "reinforce_pp", "policy_loss": "ppo", "aggregation": "token_mean"},
    "cispo": {"advantage": "grpo", "policy_loss": "cispo", "aggregation": "token_mean"},
    "gspo": {"advantage": "grpo", "policy_loss": "gspo", "aggregation": "seq_mean_token_mean"},
    "ppo": {"advantage": "gae", "policy_loss": "ppo", "aggregation": "token_mean"},
}
DEFAULTS = {"eps_low": 0.2, "eps_high": 0.2, "kl_coef": 0.0}
assert tuple(PRESETS) == RL_ALGORITHMS, "keep oxrl.config.names.RL_ALGORITHMS in step with PRESETS"


def is_rl(name: str) -> bool:
    return name.strip().lower() in PRESETS


def resolve(name: str, rl: RLConfig) -> RLConfig:
    """A copy of `rl` with the preset's values wherever the user left a field unset (None)."""
    key = name.strip().lower()  # the config stores names in lower case; library callers may not
    if key not in PRESETS:
        if key in OFFLINE_ALGORITHMS:
            raise ValueError(f"`{name}` is an offline objective, not an RL algorithm; RL presets: {', '.join(PRESETS)}")
        raise ValueError(unknown_algorithm_message(name, "RL algorithm", RL_ALGORITHMS))
    filled = {**DEFAULTS, **PRESETS[key]}
    updates = {key: value for key, value in filled.items() if getattr(rl, key) is None}
    return rl.model_copy(update=updates)


def loss_params(rl: RLConfig) -> PolicyLossParams:
    return PolicyLossParams(
        eps_low=rl.eps_low,
        eps_high=rl.eps_high,
        dual_clip=rl.dual_clip,
        aggregation=rl.aggregation,
        max_len=rl.rollout.max_new_tokens,
        kl_coef=0.0 if rl.kl_in_reward else rl.kl_coef,
        kl_estimator=rl.kl_estimator,
        entropy_coef=rl.entropy_coef,
        tis_cap=rl.tis_cap,
    )


def advantage_params(rl: RLConfig) -> AdvantageParams:
    return AdvantageParams(std_normalise=rl.std_normalise)
