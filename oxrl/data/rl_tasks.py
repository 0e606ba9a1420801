"""Prompts for RL with verifiable rewards: from files (GSM8K, OpenR1 math, RL2) or generated offline.

Each prompt is an `RLPrompt`: a chat prompt (`messages`, rendered later with the tokenizer's chat
template) or a plain `prompt`, plus `fields` the reward reads (the gold `answer`, `tests`,
reasoning-gym `metadata`, ...) and where it came from (`source`, 1-based `row`).

Tasks and their default reward (`TASK_REWARDS`, `default_reward_specs`):

    arithmetic      built in: "What is 12+7?" (1-2 digit + and -), gold "19"   -> math
    gsm8k           file: question, answer ending in "#### 42"              -> math
    openr1          file: problem, solution with a final \\boxed{}             -> math
    <reasoning-gym> generated: basic_arithmetic, chain_sum, countdown, ...   -> reasoning_gym
    rl2             file: prompt or messages, + extra_info dict             -> none: name one

The question is wrapped by a `PromptTemplate`: by default one user message, the question followed
by an instruction to put the final answer in `\\boxed{}` (`answer_format="boxed"`) or to think in
`<think>` tags and answer in `<answer>` tags (`answer_format="tags"`); an optional system message.
RL2 rows carry their own finished prompt and are not wrapped.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from oxrl.data.errors import DataError
from oxrl.data.formats import _kind
from oxrl.data.types import RLPromptBatch
from oxrl.data.formats import _RowChecker as RowChecker  # shared row validation (file, row, field in every error)
from oxrl.rewards import RewardSpec
from oxrl.rewards.extract import last_boxed

logger = logging.getLogger(__name__)

ANSWER_INSTRUCTIONS = {
    "boxed": "Reason step by step, then give your final answer within \\boxed{}.",
    "tags": "Think step by step inside <think> </think> tags, then give your final answer inside <answer> </answer> tags.",
}
TASK_REWARDS: dict[str, str] = {"arithmetic": "math", "gsm8k": "math", "openr1": "math", "reasoning_gym": "reasoning_gym"}
FILE_FORMATS = ("gsm8k", "openr1", "rl2")
ARITHMETIC_OPTIONS = ("max_operand",)  # the `task_config` keys of the built-in `arithmetic` task


@dataclass(frozen=True)
class PromptTemplate:
    """How a question becomes a chat prompt. `user` is formatted with `{question}` and `{instruction}`."""

    answer_format: Literal["boxed", "tags"] = "boxed"
    system: str | None = None
    user: str = "{question}\n\n{instruction}"

    def __post_init__(self) -> None:
        if self.answer_format not in ANSWER_INSTRUCTIONS:
            raise ValueError(f"answer_format must be one of {sorted(ANSWER_INSTRUCTIONS)}, got {self.answer_format!r}")

    def messages(self, question: str) -> list[dict[str, str]]:
        user = self.user.format(question=question.strip(), instruction=ANSWER_INSTRUCTIONS[self.answer_format])
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": user}]


@dataclass
class RLPrompt:
    messages: list[dict[str, str]] | None = None  # chat prompt, or:
    prompt: str | None = None  # plain text prompt (no chat template)
    fields: dict[str, Any] = field(default_factory=dict)  # what rewards read: answer, tests, metadata, ...
    source: str = ""
    row: int = -1  # 1-based row in `source`

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("an RLPrompt has either `messages` or `prompt`, exactly one")

    @property
    def origin(self) -> str:
        """For error messages: "gsm8k.jsonl row 12"."""
        return f"{self.source} row {self.row}"


def default_reward_specs(task: str, answer_format: str = "boxed") -> list[RewardSpec]:
    """The reward a task is scored with by default (with `answer_format="tags"`, math reads the `<answer>` tag first)."""
    reward = TASK_REWARDS.get(task) or ("reasoning_gym" if _is_reasoning_gym_task(task) else None)
    if reward is None:
        raise ValueError(
            f"task {task!r} has no default reward: name one in `rl.rewards` (tasks with a default: "
            f"{sorted(TASK_REWARDS)} and the reasoning-gym datasets)"
        )
    prefer_tag = {"prefer": "tag"} if answer_format == "tags" and reward == "math" else {}
    return [RewardSpec(reward, kwargs=prefer_tag)]


# ---------------------------------------------------------------------------------------------
# Files


def read_rl_prompts(
    path: str,
    format: Literal["auto", "gsm8k", "openr1", "rl2"] = "auto",
    *,
    split: str = "train",
    max_rows: int | None = None,
    columns: dict[str, str] | None = None,
    template: PromptTemplate | None = None,
) -> list[RLPrompt]:
    """Read RL prompts from a local file or saved dataset (what `oxrl.data.read` reads).

    `auto` picks the format from the columns; `columns` renames columns first, e.g.
    `{"question": "prompt"}` turns plain question/answer rows into rl2 rows (prompt + answer).
    """
    from oxrl.config.schema import DatasetSpec
    from oxrl.data.read import read_dataset

    if format != "auto" and format not in FILE_FORMATS:
        raise ValueError(f"unknown RL prompt format {format!r}; expected 'auto' or one of {FILE_FORMATS}")
    template = template or PromptTemplate()
    raw = read_dataset(DatasetSpec(path=path, split=split, max_rows=max_rows, columns=columns or {}))
    chosen = _detect_format(raw.columns, raw.location) if format == "auto" else format
    convert = {"gsm8k": _gsm8k_row, "openr1": _openr1_row, "rl2": _rl2_row}[chosen]
    prompts = []
    for row in raw.rows:
        if row.error is not None:
            raise row.error
        prompts.append(convert(dict(row.values), RowChecker(raw.location, row.number), template))
    logger.info("%s: %d %s prompts", raw.location, len(prompts), chosen)
    return prompts


def _detect_format(columns: list[str], location: str) -> str:
    if {"question", "answer"} <= set(columns):
        return "gsm8k"
    if {"problem", "solution"} <= set(columns):
        return "openr1"
    if "prompt" in columns or "messages" in columns:
        return "rl2"
    raise DataError(
        location, None, None,
        f"cannot tell the RL prompt format from the columns {columns}: expected question+answer (gsm8k), "
        "problem+solution (openr1), or prompt/messages (+ extra_info) (rl2)",
    )


def _gsm8k_row(values: dict[str, Any], where: RowChecker, template: PromptTemplate) -> RLPrompt:
    question = where.string(values, "question")
    solution = where.string(values, "answer")
    if "####" not in solution:
        raise where.fail(
            "answer",
            f"expected GSM8K's final '#### <answer>' line, got {solution[-80:]!r} (for rows whose answer is "
            "the gold answer itself, rename `question` to `prompt`: they are then rl2 rows)",
        )
    gold = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not gold:
        raise where.fail("answer", "nothing after '####'")
    fields = {**values, "answer": gold, "solution": solution}
    del fields["question"]
    return RLPrompt(messages=template.messages(question), fields=fields, source=where.location, row=where.row)


def _openr1_row(values: dict[str, Any], where: RowChecker, template: PromptTemplate) -> RLPrompt:
    problem = where.string(values, "problem")
    solution = where.string(values, "solution")
    # The solution's last \boxed{} is the gold answer; OpenR1-Math's own `answer` column is the fallback.
    gold = last_boxed(solution)
    if gold is None and isinstance(values.get("answer"), str) and values["answer"].strip():
        gold = values["answer"].strip()
    if gold is None:
        raise where.fail("solution", "no \\boxed{} answer in the solution (and no `answer` column)")
    fields = {key: value for key, value in values.items() if key != "problem"}
    fields["answer"] = gold
    return RLPrompt(messages=template.messages(problem), fields=fields, source=where.location, row=where.row)


def _rl2_row(values: dict[str, Any], where: RowChecker, template: PromptTemplate) -> RLPrompt:
    extra = values.pop("extra_info", None)
    if isinstance(extra, str):  # a CSV cell, or a dataset that stored it as JSON text
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError as error:
            raise where.fail("extra_info", f"expected an object (or JSON object text), got {extra[:60]!r}") from error
    if extra is not None and not isinstance(extra, dict):
        raise where.fail("extra_info", f"expected an object, got {_kind(extra)}")
    # Arrow gives every row of a dict column the union of all rows' keys, filling the absent ones with
    # null; a null in extra_info therefore means "absent" and is dropped.
    extra_fields = {key: value for key, value in (extra or {}).items() if value is not None}
    if isinstance(values.get("prompt"), list) and values.get("messages") is None:
        values["messages"] = values.pop("prompt")  # verl keeps the chat prompt in `prompt`
    prompt = where.prompt(values)  # a string, or checked messages
    fields = {key: value for key, value in values.items() if key not in ("prompt", "messages")} | extra_fields
    if isinstance(prompt, str):
        return RLPrompt(prompt=prompt, fields=fields, source=where.location, row=where.row)
    return RLPrompt(messages=prompt, fields=fields, source=where.location, row=where.row)


# ---------------------------------------------------------------------------------------------
# Generated tasks


def generate_rl_prompts(
    task: str,
    *,
    train_size: int,
    validation_size: int,
    seed: int = 0,
    template: PromptTemplate | None = None,
    **task_config: Any,
) -> tuple[list[RLPrompt], list[RLPrompt]]:
    """Train and validation prompts of a generated task, deterministic by `seed`, no question in both.

    `task` is `arithmetic` (built in; `task_config`: `max_operand`, default 99) or a reasoning-gym
    dataset name (`task_config` goes to its config, e.g. `min_terms=2` for chain_sum).
    """
    if train_size <= 0 or validation_size < 0:
        raise ValueError(f"train_size must be > 0 and validation_size >= 0, got {train_size} and {validation_size}")
    template = template or PromptTemplate()
    if task == "arithmetic":
        _check_task_options(task, task_config, ARITHMETIC_OPTIONS)
        return _arithmetic(train_size, validation_size, seed, template, **task_config)
    if _is_reasoning_gym_task(task):
        return _reasoning_gym(task, train_size, validation_size, seed, template, **task_config)
    raise ValueError(_unknown_task_message(task))


def _unknown_task_message(task: str) -> str:
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        return f"unknown generated task {task!r}: expected 'arithmetic' (reasoning-gym, for its datasets, is not installed)"
    close = difflib.get_close_matches(task, ["arithmetic", *DATASETS], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"unknown generated task {task!r}.{hint} Expected 'arithmetic' or a reasoning-gym dataset: {', '.join(sorted(DATASETS))}"


def _check_task_options(task: str, options: dict[str, Any], valid: tuple[str, ...]) -> None:
    """Unknown `rl.task_config` keys are named (with the closest valid one) instead of failing as a TypeError."""
    for key in options:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"rl.task_config: task {task!r} has no option {key!r}.{hint} Its options: {', '.join(valid)}")


def _arithmetic(
    train_size: int, validation_size: int, seed: int, template: PromptTemplate, max_operand: int = 99
) -> tuple[list[RLPrompt], list[RLPrompt]]:
    # Every question is an index into the space of (a, b, op): sampling indices without replacement
    # makes the prompts distinct and train/validation disjoint by construction. Subtractions keep
    # a >= b, so answers are never negative (kinder to a 135M model, and still a skill to learn).
    width = max_operand + 1
    additions = width * width
    subtractions = width * (width + 1) // 2
    total = train_size + validation_size
    if total > additions + subtractions:
        raise ValueError(f"arithmetic with max_operand={max_operand} has only {additions + subtractions} distinct questions, asked for {total}")
    indices = random.Random(seed).sample(range(additions + subtractions), total)
    prompts = []
    for position, index in enumerate(indices):
        if index < additions:
            a, b = divmod(index, width)
            question, answer = f"What is {a}+{b}?", a + b
        else:
            a, b = _pair_from_triangle(index - additions)
            question, answer = f"What is {a}-{b}?", a - b
        split_row = position + 1 if position < train_size else position - train_size + 1
        prompts.append(RLPrompt(messages=template.messages(question), fields={"answer": str(answer)}, source="arithmetic", row=split_row))
    return prompts[:train_size], prompts[train_size:]


def _pair_from_triangle(index: int) -> tuple[int, int]:
    """The index-th pair (a, b) with 0 <= b <= a, counting row by row: (0,0), (1,0), (1,1), (2,0), ..."""
    a = 0
    while index > a:
        index -= a + 1
        a += 1
    return a, index


def _is_reasoning_gym_task(task: str) -> bool:
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        return False
    return task in DATASETS


def _reasoning_gym(
    name: str, train_size: int, validation_size: int, seed: int, template: PromptTemplate, **config: Any
) -> tuple[list[RLPrompt], list[RLPrompt]]:
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    # `size` and `seed` are ours to set; everything else in the dataset's config class is an option.
    options = tuple(f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in ("size", "seed"))
    _check_task_options(name, config, options)
    try:
        train_entries = list(reasoning_gym.create_dataset(name, size=train_size, seed=seed, **config))
    except AssertionError as error:  # reasoning-gym's config `validate()` checks with asserts
        raise ValueError(f"rl.task_config {config} is not valid for reasoning-gym {name!r}: {error}") from error
    # reasoning-gym draws item i from Random(seed + i), so seeds 0 and 1 give the same items shifted by
    # one. The validation seed starts after the training items' seeds; questions seen in training are
    # skipped all the same (small tasks repeat questions from different seeds).
    seen = {entry["question"] for entry in train_entries}
    candidates = reasoning_gym.create_dataset(name, size=10 * validation_size + 100, seed=seed + train_size, **config)
    validation_entries = []
    for index in range(len(candidates)):
        if len(validation_entries) == validation_size:
            break
        entry = candidates[index]
        if entry["question"] not in seen:
            seen.add(entry["question"])
            validation_entries.append(entry)
    if len(validation_entries) < validation_size:
        raise ValueError(
            f"reasoning-gym {name!r}: found only {len(validation_entries)} validation questions not in the "
            f"{train_size} training ones; the task's question space is too small: make it harder or the sets smaller"
        )

    def to_prompt(entry: dict[str, Any], row: int) -> RLPrompt:
        fields = {"answer": entry["answer"], "metadata": entry["metadata"], "question": entry["question"]}
        return RLPrompt(messages=template.messages(entry["question"]), fields=fields, source=f"reasoning_gym/{name}", row=row)

    train = [to_prompt(entry, row) for row, entry in enumerate(train_entries, start=1)]
    validation = [to_prompt(entry, row) for row, entry in enumerate(validation_entries, start=1)]
    return train, validation


def encode_prompts(prompts: list[RLPrompt], tokenizer) -> RLPromptBatch:
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
