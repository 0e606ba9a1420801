"""`reasoning_gym`: score with reasoning-gym's own `score_answer` for the task that generated the row.

Each task knows how to judge its answers (countdown evaluates the expression, chain_sum compares
numbers, ...), so we do not second-guess it: we extract the answer (the `<answer>` tag, else the
last `\\boxed{}`; reasoning-gym's own prompts use the tag) and hand it to `score_answer` with the
row's entry (`question`, `answer`, `metadata`, as `oxrl.data.rl_tasks` stores them). The task is
`metadata["source_dataset"]` unless `dataset` names it. Scores are in [0, 1] and may be partial.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from oxrl.dependencies import REWARD_PACKAGES, MissingDependencyError, install_hint, require
from oxrl.data.extract import last_boxed, tag_content


def reasoning_gym_reward(
    prompt: str,
    completion: str,
    *,
    answer: Any,
    metadata: dict[str, Any],
    question: str | None = None,
    dataset: str | None = None,
    answer_tag: str = "answer",
) -> float:
    if not isinstance(metadata, dict):
        raise ValueError(f"field 'metadata' must be reasoning-gym's metadata dict, got {type(metadata).__name__}")
    name = dataset or metadata.get("source_dataset")
    if not name:
        raise ValueError("cannot tell which reasoning-gym task made this row: no metadata['source_dataset'] and no `dataset`")
    extracted = tag_content(completion, answer_tag)
    if extracted is None:
        extracted = last_boxed(completion)
    entry = {"question": question if question is not None else prompt, "answer": answer, "metadata": metadata}
    return float(_scorer(name)(extracted, entry))


def check_reasoning_gym_reward(**kwargs: Any) -> None:
    """`reasoning_gym_reward.preflight`: reasoning-gym is installed (checked when the reward is built)."""
    require(*REWARD_PACKAGES["reasoning_gym"], "the `reasoning_gym` reward")


reasoning_gym_reward.preflight = check_reasoning_gym_reward  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=64)
def _scorer(name: str) -> Callable[[str | None, dict[str, Any]], float]:
    # Some tasks read word lists or puzzles when constructed; build each scorer once per process.
    try:
        import reasoning_gym
    except ImportError as error:
        raise MissingDependencyError(f"the `reasoning_gym` reward needs reasoning-gym: {install_hint('reasoning-gym')}") from error
    return reasoning_gym.get_score_answer_fn(name)
