"""Prompts for RL with verifiable rewards: the `RLPrompt`, generated tasks, and rendering to token ids.

Each prompt is an `RLPrompt`: a chat prompt (`messages`, rendered with the tokenizer's chat template)
or a plain `prompt`, plus `fields` the reward reads (the gold `answer`, `tests`, reasoning-gym
`metadata`, ...) and where it came from (`source`, 1-based `row`, the `column` of its question).
Prompt files (GSM8K, OpenR1 math, RL2) are read by `oxrl.data.rl_prompts`.

Tasks and their default reward (`TASK_REWARDS`, `default_rewards`):

    arithmetic      built in: "What is 12+7?" (1-2 digit + and -), gold "19"   -> math
    gsm8k           file: question, answer ending in "#### 42"              -> math
    openr1          file: problem, solution with a final \\boxed{}             -> math
    <reasoning-gym> generated: basic_arithmetic, chain_sum, countdown, ...   -> reasoning_gym
    rl2             file: prompt or messages, + extra_info dict             -> none: name one

The question is wrapped by a `PromptTemplate`: by default one user message, the question followed
by an instruction to put the final answer in `\\boxed{}` (`answer_format="boxed"`) or to think in
`<think>` tags and answer in `<answer>` tags (`answer_format="tags"`); an optional system message.
RL2 rows carry their own finished prompt and are not wrapped.

`encode_prompts` renders prompts to token ids and fits them into a token budget (`data.max_length`
minus `rl.rollout.max_new_tokens`) by `data.truncation`; see `fit_prompt`. A prompt with images (a
vision-language model's) is rendered with the processor's chat template and expanded by the processor, its
image tensors kept beside its ids; it is never cut (its image tokens must stay whole): too long, it is dropped
(`drop`) or stops the run.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from oxrl.config.schema import RewardConfig, RLConfig
from oxrl.data.errors import DataError
from oxrl.data.types import RLPromptBatch, VisionInputs

logger = logging.getLogger(__name__)

ANSWER_INSTRUCTIONS = {
    "boxed": "Reason step by step, then give your final answer within \\boxed{}.",
    "tags": "Think step by step inside <think> </think> tags, then give your final answer inside <answer> </answer> tags.",
}
TASK_REWARDS: dict[str, str] = {"arithmetic": "math", "gsm8k": "math", "openr1": "math", "reasoning_gym": "reasoning_gym"}
ARITHMETIC_OPTIONS = ("max_operand",)  # the `task_config` keys of the built-in `arithmetic` task
# `rl.validation_size` left unset: a generated task gets this many held-out prompts; prompt files hold
# out a tenth of their rows, at most this many (oxrl/data/rl_prompts.py).
DEFAULT_VALIDATION_SIZE = 100


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
    column: str | None = None  # the column the question came from (error messages)
    images: list = field(default_factory=list)  # decoded images, one per `{"type": "image"}` part of `messages`

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("an RLPrompt has either `messages` or `prompt`, exactly one")
        if self.images and self.messages is None:
            raise ValueError("an RLPrompt with images needs `messages` (the images' places in the chat)")

    @property
    def origin(self) -> str:
        """For error messages: "gsm8k.jsonl row 12"."""
        return f"{self.source} row {self.row}"


def default_rewards(task: str, answer_format: str = "boxed") -> list[RewardConfig]:
    """The reward a task is scored with by default (with `answer_format="tags"`, math reads the `<answer>` tag first)."""
    reward = TASK_REWARDS.get(task)
    if reward is None:
        from oxrl.data.reasoning_gym_tasks import is_dataset

        reward = "reasoning_gym" if is_dataset(task) else None
    if reward is None:
        raise ValueError(
            f"task {task!r} has no default reward: name one in `rl.rewards` (tasks with a default: "
            f"{sorted(TASK_REWARDS)} and the reasoning-gym datasets)"
        )
    prefer_tag = {"prefer": "tag"} if answer_format == "tags" and reward == "math" else {}
    return [RewardConfig(name=reward, kwargs=prefer_tag)]


# ---------------------------------------------------------------------------------------------
# Generated tasks


def task_prompts(rl: RLConfig, seed: int) -> tuple[list[RLPrompt], list[RLPrompt]]:
    """`rl.task`'s training and held-out prompts, in the run's prompt template."""
    validation_size = DEFAULT_VALIDATION_SIZE if rl.validation_size is None else rl.validation_size
    return generate_rl_prompts(rl.task, train_size=rl.task_size, validation_size=validation_size, seed=seed,
                               template=prompt_template(rl), **rl.task_config)


def prompt_template(rl: RLConfig) -> PromptTemplate:
    custom = {"user": rl.prompt_template} if rl.prompt_template is not None else {}
    return PromptTemplate(answer_format=rl.answer_format, system=rl.system_prompt, **custom)


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
    from oxrl.data import reasoning_gym_tasks as gym  # (reasoning-gym: loaded only for a task it names)

    if not gym.is_dataset(task):
        raise ValueError(gym.unknown_task_message(task))
    _check_task_options(task, task_config, gym.options(task))
    train, validation = gym.entries(task, train_size, validation_size, seed, **task_config)

    def to_prompt(entry: dict[str, Any], row: int) -> RLPrompt:
        fields = {"answer": entry["answer"], "metadata": entry["metadata"], "question": entry["question"]}
        return RLPrompt(messages=template.messages(entry["question"]), fields=fields, source=f"reasoning_gym/{task}", row=row)

    return ([to_prompt(entry, row) for row, entry in enumerate(train, start=1)],
            [to_prompt(entry, row) for row, entry in enumerate(validation, start=1)])


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


def plain_text(messages: list[dict[str, Any]]) -> str:
    """A chat prompt as plain text (no chat template): its non-empty contents, one per line."""
    return "\n".join(m["content"] for m in messages if m["content"])


def encode_prompts(
    prompts: list[RLPrompt], tokenizer, *, max_tokens: int | None = None, truncation: str = "error", processor=None,
    completion: str = "rl.rollout.max_new_tokens",
) -> RLPromptBatch:
    """Token ids of each prompt, ready for generation (chat template + generation header).

    With `max_tokens` (`data.max_length` less the completion, which `completion` names in messages), a longer
    prompt is fitted by
    `truncation` (`data.truncation`): cut at its start (`left`, see `fit_prompt`), left out (`drop`,
    counted and logged), or a DataError naming its file, row and column (`error`, and `right`, which
    would cut the question and the generation header).
    """
    ids, kept, texts, visions = [], [], [], []
    cut = dropped = 0
    for prompt in prompts:
        if prompt.images:
            rendered, text, vision = _render_with_images(prompt, processor)
        else:
            (rendered, text), vision = _render(prompt, tokenizer), None
        if max_tokens is not None and len(rendered) > max_tokens:
            fitted = fit_prompt(prompt, tokenizer, max_tokens, truncation, len(rendered), completion)
            if fitted is None:
                dropped += 1
                continue
            cut += 1
            prompt, rendered, text = fitted
        ids.append(rendered)
        kept.append(prompt)
        texts.append(text)
        visions.append(vision)
    if cut:
        logger.warning("cut the start of %d of %d prompts to fit %d tokens (data.truncation=left)", cut, len(prompts), max_tokens)
    if dropped:
        logger.warning("dropped %d of %d prompts longer than %d tokens (data.truncation=drop)", dropped, len(prompts), max_tokens)
        if not kept:
            raise ValueError(f"every prompt is longer than {max_tokens} tokens (data.max_length less the completion, "
                             f"{completion}) and was dropped: raise data.max_length or shorten the completion")
    return RLPromptBatch(ids, texts, [p.fields for p in kept], [p.origin for p in kept],
                         visions if any(v is not None for v in visions) else None)


def message_text(content: str | list[dict[str, Any]]) -> str:
    """A message's text: the content, or its text parts joined (image parts left out)."""
    return content if isinstance(content, str) else "".join(p["text"] for p in content if p["type"] == "text")


def _render_with_images(prompt: RLPrompt, processor) -> tuple[list[int], str, VisionInputs]:
    """An image prompt's ids (each image's placeholder expanded by the processor), its text for the rewards, and
    its images with the processor's tensors."""
    if processor is None:
        raise DataError(prompt.source, prompt.row, "images", "the prompt has images but the model is not a "
                        "vision-language model (its folder has no processor)")
    text = processor.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
    ids, vision = VisionInputs.expand(processor, text, prompt.images)
    return ids, message_text(prompt.messages[-1]["content"]), vision


def _render(prompt: RLPrompt, tokenizer) -> tuple[list[int], str]:
    """The prompt's token ids, and its text as the rewards see it (the last message's content for a chat)."""
    if prompt.messages is not None and tokenizer.chat_template:
        rendered = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(rendered["input_ids"]), message_text(prompt.messages[-1]["content"])
    text = prompt.prompt if prompt.prompt is not None else plain_text(prompt.messages)
    return list(tokenizer(text)["input_ids"]), text


def fit_prompt(
    prompt: RLPrompt, tokenizer, max_tokens: int, truncation: str, length: int,
    completion: str = "rl.rollout.max_new_tokens",
) -> tuple[RLPrompt, list[int], str] | None:
    """A prompt of `length` > `max_tokens` tokens fitted by `truncation`: (the cut prompt, its ids, its text), or
    None to drop it.

    `left` cuts tokens from the start of the last user message's content (of the text, for a plain
    prompt), never the ids of the rendered chat, so that the system prompt, the template's headers and
    the generation header stay whole; the end of the message, where the question and the answer-format
    instruction sit, is kept. A prompt that would need all of that content cut is a DataError.
    """
    if truncation == "drop":
        return None
    where = (prompt.source, prompt.row, prompt.column)
    if prompt.images:
        raise DataError(*where, f"{length} tokens with its images, more than the {max_tokens} that data.max_length "
                        f"leaves after the completion ({completion}); a prompt with images is never cut: set "
                        "data.truncation to drop, raise data.max_length, or lower data.max_image_pixels")
    over = f"{length} tokens, more than the {max_tokens} that data.max_length leaves after the completion ({completion})"
    if truncation in ("error", "right"):
        fix = "set data.truncation to left (cut its start) or drop, or raise data.max_length"
        if truncation == "right":
            fix = ("data.truncation `right` (the default) does not apply to RL prompts, as it would cut the question "
                   "and the generation header: " + fix)
        raise DataError(*where, f"{over}; {fix}")
    if truncation != "left":
        raise ValueError(f"unknown truncation {truncation!r}; expected one of ['left', 'drop', 'error', 'right']")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"data.truncation `left` needs a fast tokenizer (offsets); {type(tokenizer).__name__} is slow")
    chat = prompt.messages is not None and bool(tokenizer.chat_template)
    users = [i for i, m in enumerate(prompt.messages or []) if m["role"] == "user"]
    if chat and not users:
        raise DataError(*where, f"{over}, and it has no user message to cut (data.truncation=left)")
    text = prompt.messages[users[-1]]["content"] if chat else _render(prompt, tokenizer)[1]
    starts = [begin for begin, _ in tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]
    cut = length - max_tokens
    while cut < len(starts):
        rest = text[starts[cut]:]
        if chat:
            messages = [dict(m) for m in prompt.messages]
            messages[users[-1]]["content"] = rest
            candidate = dataclasses.replace(prompt, messages=messages)
        else:
            candidate = dataclasses.replace(prompt, prompt=rest, messages=None)
        ids, shown = _render(candidate, tokenizer)
        if len(ids) <= max_tokens:
            return candidate, ids, shown
        cut += len(ids) - max_tokens  # tokens merge differently at the new start: cut the difference too
    raise DataError(*where, f"{over}, even with all but the last token of its text cut (data.truncation=left): the "
                    "system prompt and the chat template leave no room; raise data.max_length")
