"""Every valid `algorithm.name`, declared once and grouped by family.

The config checks names here when it loads (no torch import needed); the registries that implement
them (`oxrl.loops.objectives`, `oxrl.loops.preference_objectives`, `oxrl.loops.rl_presets`) assert
at import that they implement exactly these names, so a name cannot be valid in one place only.
"""

from __future__ import annotations

import difflib
import importlib.util

SUPERVISED = ("sft", "cpt")
PREFERENCE = ("dpo", "rdpo", "hinge", "ipo", "simpo", "orpo", "kto")
REWARD_MODEL = ("rm",)
DISTILLATION = ("kd_forward", "kd_reverse", "kd_jsd")
# RL presets; their batches are sized by the `rl` section. `sgrpo` is GRPO with its paper's KL term.
RL_ALGORITHMS = ("grpo", "sgrpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "cispo", "gspo", "ppo")

ALGORITHM_GROUPS: dict[str, tuple[str, ...]] = {
    "supervised": SUPERVISED,
    "preference": PREFERENCE,
    "reward model": REWARD_MODEL,
    "distillation": DISTILLATION,
    "RL": RL_ALGORITHMS,
}
OFFLINE_ALGORITHMS = SUPERVISED + PREFERENCE + REWARD_MODEL + DISTILLATION
ALL_ALGORITHMS = OFFLINE_ALGORITHMS + RL_ALGORITHMS


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


# Each tracker is named after its package and its extra (`pip install 'oxrl[wandb]'`); TensorBoard is
# written through `torch.utils.tensorboard`, which needs the `tensorboard` package.
TRACKERS = ("mlflow", "tensorboard", "wandb")


def check_trackers(names: list[str]) -> None:
    """A ValueError naming the trackers in `names` whose package is not installed (a lookup, no import)."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"tracker package not installed: {', '.join(missing)} (pip install 'oxrl[{','.join(missing)}]')")
