"""RL algorithm presets: a name fills the `rl` fields the user did not set, and a setting the resulting
algorithm does not read is an error, not silence.

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
offline objective on the samples (oxrl/loops/online.py): `resolve_online` refuses every policy-gradient
setting (`POLICY_GRADIENT_ONLY`) set for them, and fills nothing.

`resolve` runs when the config is validated (`oxrl.config.schema.Config`), so the `rl` section of an
RL config is always resolved. Pure data: no torch here.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

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

# Settings that only some choices read: field -> (the choices under which it is read, why). A choice is
# a deciding `rl` field and the values (or a test of the value) under which the field is read; all must
# hold. Any other field is read by every RL algorithm. A field that differs from its default where it is
# not read is an error (a saved config.yaml lists every key, at its default where unused).
_GAE = {"advantage": ("gae",)}
_SEPARATE_CRITIC = {"advantage": ("gae",), "critic_backbone": ("separate",)}
_SHARED_CRITIC = {"advantage": ("gae",), "critic_backbone": ("shared",)}
_CRITIC = "only advantage `gae` (ppo) trains a critic"


def _positive(value: float) -> bool:
    return value > 0


_CORRECTED = ("tis", "decoupled", "mask")  # every off_policy_correction but `none`


READ_ONLY_WITH: dict[str, tuple[dict[str, tuple | Callable[[Any], bool]], str]] = {
    "gamma": (_GAE, "gamma is GAE's discount, used only with advantage `gae` (ppo)"),
    "lam": (_GAE, "lam is GAE's lambda, used only with advantage `gae` (ppo)"),
    "whiten_advantages": (_GAE, "it whitens GAE's token advantages; the outcome estimators normalise their own way"),
    "critic_backbone": (_GAE, _CRITIC),
    "value_clip": (_GAE, _CRITIC),
    "critic_warmup_steps": (_GAE, _CRITIC),
    "critic_model": (_SEPARATE_CRITIC, "only a `separate` critic of advantage `gae` is a model of its own"),
    "critic_lr": (_SEPARATE_CRITIC, "only a `separate` critic of advantage `gae` has an optimizer of its own"),
    "critic_max_grad_norm": (_SEPARATE_CRITIC, "only a `separate` critic of advantage `gae` is clipped on its own"),
    "value_coef": (_SHARED_CRITIC, "it weighs the value loss in the one loss of a `shared` critic of advantage `gae`"),
    "std_normalise": ({"advantage": ("grpo",)}, "only the `grpo` estimator divides by the group's reward std"),
    "dual_clip": ({"policy_loss": ("ppo",)}, "dual clip caps PPO's clipped surrogate; cispo and gspo have none"),
    "kl_estimator": ({"kl_coef": _positive, "kl_in_reward": (False,)},
                     "it estimates the KL loss term: with kl_coef 0 there is none, and kl_in_reward uses k1 as a "
                     "reward penalty"),
    "kl_in_reward": ({"kl_coef": _positive},
                     "it says where the KL to the reference goes, and with kl_coef 0 there is none"),
    "on_policy_tolerance": ({"strict_on_policy": (True,)}, "it is the tolerance of strict_on_policy"),
    "off_policy_cap": ({"off_policy_correction": _CORRECTED}, "it bounds the weight of an off-policy correction"),
    "off_policy_max_kl": ({"off_policy_correction": _CORRECTED}, "it drops sequences for an off-policy correction"),
    "accept_uncorrected": ({"max_staleness": _positive, "off_policy_correction": ("none",)},
                           "it accepts stale samples (max_staleness >= 1) trained with no off-policy correction"),
}


# The `rl` settings only a policy-gradient update reads (the rest, the rollout and the rewards, the online
# algorithms read too). `env` too: an online algorithm trains on single-turn samples.
POLICY_GRADIENT_ONLY = ("advantage", "gamma", "lam", "whiten_advantages", "critic_model", "critic_backbone", "critic_lr",
                        "critic_max_grad_norm", "value_coef", "value_clip", "critic_warmup_steps", "std_normalise",
                        "policy_loss", "eps_low", "eps_high", "dual_clip", "aggregation", "kl_coef", "kl_estimator",
                        "kl_in_reward", "entropy_coef", "strict_on_policy", "on_policy_tolerance",
                        "off_policy_correction", "off_policy_cap", "off_policy_max_kl", "accept_uncorrected", "env")


def resolve_online(name: str, rl: RLConfig) -> RLConfig:
    """`rl` unchanged for an online algorithm, or a ValueError naming every policy-gradient setting it has set."""
    assert name in ONLINE, name
    defaults = type(rl).model_fields
    unread = [f"rl.{field} = {getattr(rl, field)!r} is not read by `{name}`, which trains "
              f"{'SFT' if name == 'rft' else 'a preference loss'} on its samples, not a policy gradient"
              for field in POLICY_GRADIENT_ONLY
              if getattr(rl, field) != defaults[field].get_default(call_default_factory=True)]
    if unread:
        raise ValueError("; ".join(unread))
    if name == "spin" and rl.max_staleness:
        raise ValueError(f"rl.max_staleness = {rl.max_staleness} is not read by `spin`: its opponent answers every "
                         "prompt of an iteration, and becomes the policy only at the iteration's end")
    return rl


def is_rl(name: str) -> bool:
    """Whether `name` samples its training data on the fly (the rollout loop): an RL preset or an online algorithm."""
    key = name.strip().lower()
    return key in PRESETS or key in ONLINE


def resolve(name: str, rl: RLConfig) -> RLConfig:
    """A copy of `rl` with the preset's values wherever the user left a field unset (None); a ValueError
    naming every set field that the resolved algorithm does not read. Resolving twice changes nothing."""
    key = name.strip().lower()  # the config stores names in lower case; library callers may not
    if key not in PRESETS:
        if key in OFFLINE_ALGORITHMS:
            raise ValueError(f"`{name}` is an offline objective, not an RL algorithm; RL presets: {', '.join(PRESETS)}")
        raise ValueError(unknown_algorithm_message(name, "RL algorithm", RL_ALGORITHMS))
    filled = {**DEFAULTS, **PRESETS[key]}
    resolved = rl.model_copy(update={field: value for field, value in filled.items() if getattr(rl, field) is None})
    unread = unread_settings(key, resolved)
    if unread:
        raise ValueError("; ".join(unread))
    if resolved.max_staleness and resolved.off_policy_correction == "none" and not resolved.accept_uncorrected:
        raise ValueError(f"rl.max_staleness = {resolved.max_staleness} trains `{name}` on samples up to "
                         f"{resolved.max_staleness} policy versions old: set rl.off_policy_correction (decoupled, tis "
                         "or mask), or rl.accept_uncorrected: true to train on them as if on-policy")
    return resolved


def preset_values(name: str) -> dict[str, Any]:
    """The `rl` fields an RL algorithm's preset fills when they are left unset, with its values ({} for others)."""
    key = name.strip().lower()
    return {**DEFAULTS, **PRESETS[key]} if key in PRESETS else {}


def unread_settings(name: str, rl: BaseModel) -> list[str]:
    """One line per field of the resolved `rl` that differs from its default but is not read (READ_ONLY_WITH)."""
    lines = []
    for field, (choices, why) in READ_ONLY_WITH.items():
        value = getattr(rl, field)
        if value == type(rl).model_fields[field].get_default(call_default_factory=True):
            continue
        unmet = [f"{deciding} `{getattr(rl, deciding)}`" for deciding, allowed in choices.items()
                 if not (allowed(getattr(rl, deciding)) if callable(allowed) else getattr(rl, deciding) in allowed)]
        if unmet:
            lines.append(f"rl.{field} = {value!r} is not read by `{name}` ({', '.join(unmet)}): {why}")
    return lines
