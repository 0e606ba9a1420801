"""`rl.task` naming a reasoning-gym dataset (chain_sum, countdown, ...): its training and held-out entries.

reasoning-gym (the `rl` extra) generates each dataset procedurally from a seed; an entry is a dict with the
`question`, the gold `answer` and the `metadata` its scorer reads (oxrl/rewards/gym_reward.py). This module knows
reasoning-gym only: `oxrl.data.rl_tasks` imports it for a task other than the built-in `arithmetic`, and wraps the
entries in its prompt template.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any


def is_dataset(task: str) -> bool:
    """Whether `task` is one of reasoning-gym's datasets (False when reasoning-gym is not installed)."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        return False
    return task in DATASETS


def unknown_task_message(task: str) -> str:
    """Why `task` is neither `arithmetic` nor a reasoning-gym dataset, with the closest name or the install command."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        from oxrl.dependencies import install_hint

        return (f"unknown generated task {task!r}: expected 'arithmetic' (reasoning-gym, for its datasets, is not "
                f"installed: {install_hint('reasoning-gym')})")
    close = difflib.get_close_matches(task, ["arithmetic", *DATASETS], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"unknown generated task {task!r}.{hint} Expected 'arithmetic' or a reasoning-gym dataset: {', '.join(sorted(DATASETS))}"


def options(name: str) -> tuple[str, ...]:
    """The dataset's `rl.task_config` keys: every field of its config class but `size` and `seed`, which are ours."""
    from reasoning_gym.factory import DATASETS

    return tuple(f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in ("size", "seed"))


def entries(name: str, train_size: int, validation_size: int, seed: int,
            **config: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`train_size` training entries and `validation_size` held-out ones, no question in both, deterministic by
    `seed`."""
    import reasoning_gym

    try:
        train = list(reasoning_gym.create_dataset(name, size=train_size, seed=seed, **config))
    except AssertionError as error:  # reasoning-gym's config `validate()` checks with asserts
        raise ValueError(f"rl.task_config {config} is not valid for reasoning-gym {name!r}: {error}") from error
    # reasoning-gym draws item i from Random(seed + i), so seeds 0 and 1 give the same items shifted by
    # one. The validation seed starts after the training items' seeds; questions seen in training are
    # skipped all the same (small tasks repeat questions from different seeds).
    seen = {entry["question"] for entry in train}
    candidates = reasoning_gym.create_dataset(name, size=10 * validation_size + 100, seed=seed + train_size, **config)
    validation = []
    for index in range(len(candidates)):
        if len(validation) == validation_size:
            break
        entry = candidates[index]
        if entry["question"] not in seen:
            seen.add(entry["question"])
            validation.append(entry)
    if len(validation) < validation_size:
        raise ValueError(
            f"reasoning-gym {name!r}: found only {len(validation)} validation questions not in the "
            f"{train_size} training ones; the task's question space is too small: make it harder or the sets smaller"
        )
    return train, validation
