"""RL prompts from files, through the reader, hold-out and mixing of offline data (`oxrl.data.build`).

Each dataset of `data.train` is read by `oxrl.data.read` (`path`, `split`, `max_rows`, `columns`) and
its rows become `RLPrompt`s by the dataset's `format` (`auto` picks one from the columns):

| format   | columns                                      | prompt                        | fields (rewards read them)   |
|----------|----------------------------------------------|-------------------------------|------------------------------|
| `gsm8k`  | question, answer ending in "#### 42"         | the question, in the template | answer "42", solution, rest  |
| `openr1` | problem, solution with a final \\boxed{}      | the problem, in the template  | answer (last box), rest      |
| `rl2`    | prompt (text or messages) or messages; extra_info | as given (a chat's last assistant turn: the `response` field) | other columns + extra_info   |

The template is `rl.prompt_template` / `answer_format` / `system_prompt` (`prompt_template`). With
`chat_template: false` a chat prompt becomes plain text, its contents joined by newlines.

A row of any format may carry `images` (a vision-language model's prompts, e.g. Geometry3K's `prompt` +
`images` + `answer`): they are decoded once and bounded by `data.max_image_pixels` (`oxrl.data.images`), and the
prompt becomes a chat whose image parts stand where its `<image>` markers were, or open the first user message
when it has none (`oxrl.data.formats.prompt_messages_with_images`, the rules offline rows follow).

Then as for offline data: an invalid row stops the run, or with `data.skip_invalid_rows` is skipped
and counted; the validation prompts are `data.validation`, else `data.validation_fraction` of each
dataset (seeded, before mixing), else the first `rl.validation_size` rows (`validation_split_size`);
the other prompts are mixed by `weight` into `data.num_examples` prompts, deterministically by seed
(`oxrl.data.mix`). A generated task (`rl.task`) replaces all of this. Rendering to token ids, and
fitting prompts into `data.max_length`, is `oxrl.data.rl_tasks.encode_prompts`'s.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oxrl.config.schema import RL_PROMPT_FORMATS, DataConfig, DatasetSpec, RLConfig
from oxrl.data.build import INVALID_ROW, distinct_names, hold_out, parse_rows
from oxrl.data.errors import DataError
from oxrl.data.formats import _kind, prompt_messages_with_images
from oxrl.data.images import decode_images
from oxrl.data.formats import _RowChecker as RowChecker  # shared row validation (file, row, field in every error)
from oxrl.data.mix import mix
from oxrl.data.read import Row, read_dataset
from oxrl.data.rl_tasks import DEFAULT_VALIDATION_SIZE, PromptTemplate, RLPrompt, plain_text, prompt_template
from oxrl.data.extract import last_boxed

logger = logging.getLogger(__name__)

# `rl.validation_size` left unset: prompt files hold out a tenth of their rows, at most DEFAULT_VALIDATION_SIZE
# (so files of fewer than 10 rows train on every row).
DEFAULT_VALIDATION_ONE_IN = 10


@dataclass
class LoadedPrompts:
    train: list[RLPrompt]  # the mixture, dataset by dataset (the step sampler shuffles)
    validation: list[RLPrompt]
    counts: dict[str, int]  # training prompts each dataset contributes (after mixing)
    skipped: dict[str, int]  # rows skipped, by reason: invalid_row


def load_rl_prompts(data: DataConfig, rl: RLConfig, *, seed: int) -> LoadedPrompts:
    """Training and validation prompts of the `data` files (module docstring). Where a run's prompts come from (these
    files, `rl.task`'s generator, a VLA's simulator) is `oxrl.loops.rl_setup.load_prompts`'s choice."""
    if rl.task is not None:
        raise ValueError(f"rl.task {rl.task!r} generates its own prompts (oxrl.data.rl_tasks.task_prompts); "
                         "load_rl_prompts reads prompt files (oxrl.loops.rl_setup.load_prompts picks the source)")
    template = prompt_template(rl)
    if not data.train:
        raise ValueError("RL needs prompts: set rl.task (e.g. `arithmetic`) or data.train to prompt files")
    skipped: Counter[str] = Counter()

    def read(spec: DatasetSpec) -> list[RLPrompt]:
        prompts, invalid = read_prompt_dataset(spec, template, data.skip_invalid_rows, data.max_image_pixels)
        if invalid:
            skipped[INVALID_ROW] += invalid
        return prompts

    names = distinct_names(data.train)
    per_dataset = {name: read(spec) for name, spec in zip(names, data.train)}
    if data.validation:  # the held-out set (the config refuses data.validation_fraction or rl.validation_size beside it)
        validation = [prompt for spec in data.validation for prompt in read(spec)]
    elif data.validation_fraction:
        per_dataset, validation = hold_out(per_dataset, data.validation_fraction, seed)
    else:
        rows = sum(len(prompts) for prompts in per_dataset.values())
        per_dataset, validation = _first_rows(per_dataset, validation_split_size(rl.validation_size, rows))
        logger.info("validation: the first %d of %d prompt rows of data.train are held out", len(validation), rows)
    weights = {name: spec.weight for name, spec in zip(names, data.train)}
    train, counts = mix(per_dataset, weights, total=data.num_examples, seed=seed)
    logger.info("RL prompts: %d training / %d validation; per dataset %s; skipped %s",
                len(train), len(validation), counts, dict(skipped) or "none")
    return LoadedPrompts(train, validation, counts, dict(skipped))


def validation_split_size(requested: int | None, rows: int) -> int:
    """How many of the `rows` training prompts to hold out for validation (see `RLConfig.validation_size`).

    Unset: a bounded fraction that always leaves training rows. Set: exactly that many, which must
    leave at least one row to train on.
    """
    if requested is None:
        return min(DEFAULT_VALIDATION_SIZE, rows // DEFAULT_VALIDATION_ONE_IN)
    if requested >= rows:
        raise ValueError(
            f"rl.validation_size is {requested} but data.train has {rows} prompt rows: holding out {requested} "
            f"leaves none to train on; set rl.validation_size below {rows} (0 for no validation), leave it unset "
            "(10% of the rows, at most 100), or give data.validation"
        )
    return requested


def _first_rows(
    per_dataset: dict[str, list[RLPrompt]], count: int
) -> tuple[dict[str, list[RLPrompt]], list[RLPrompt]]:
    """The first `count` prompts of the datasets taken in order (file order) for validation, and the rest."""
    rest: dict[str, list[RLPrompt]] = {}
    held: list[RLPrompt] = []
    for name, prompts in per_dataset.items():
        taken = min(count - len(held), len(prompts))
        held += prompts[:taken]
        rest[name] = prompts[taken:]
    return rest, held


# ---------------------------------------------------------------------------------------------
# One dataset


def read_rl_prompts(
    path: str,
    format: str = "auto",
    *,
    split: str = "train",
    max_rows: int | None = None,
    columns: dict[str, str] | None = None,
    template: PromptTemplate | None = None,
) -> list[RLPrompt]:
    """Every row of one prompt file (or saved or hub dataset) as an RLPrompt; the first bad row raises a DataError.

    `columns` renames columns first, e.g. `{"question": "prompt"}` turns plain question/answer rows
    into rl2 rows (prompt + answer).
    """
    spec = DatasetSpec(path=path, format=format, split=split, max_rows=max_rows, columns=columns or {})
    return read_prompt_dataset(spec, template or PromptTemplate())[0]


def read_prompt_dataset(
    spec: DatasetSpec, template: PromptTemplate, skip_invalid_rows: bool = False,
    max_image_pixels: int = DataConfig.model_fields["max_image_pixels"].default,
) -> tuple[list[RLPrompt], int]:
    """The prompts of one dataset, and how many invalid rows were skipped (`skip_invalid_rows`)."""
    if spec.format != "auto" and spec.format not in RL_PROMPT_FORMATS:
        raise ValueError(f"format {spec.format!r} is not an RL prompt format; expected 'auto' or one of {RL_PROMPT_FORMATS}")
    raw = read_dataset(spec)
    fmt = _detect_format(raw.columns, raw.location) if spec.format == "auto" else spec.format
    convert = ROW_CONVERTERS[fmt]

    def prompt(row: Row) -> RLPrompt:
        where = RowChecker(raw.location, row.number)
        values = dict(row.values)
        image_values = values.pop("images", None)
        question, column, fields = convert(values, where, template)
        if image_values is not None and image_values != []:
            if not spec.chat_template:
                raise where.fail("images", "a prompt with images needs the chat template (chat_template: false is set)")
            images = decode_images(image_values, location=raw.location, row=row.number, root=raw.root,
                                   max_pixels=max_image_pixels)
            messages = prompt_messages_with_images(question, len(images), raw.location, row.number)
            return RLPrompt(messages=messages, fields=fields, source=raw.location, row=row.number, column=column,
                            images=images)
        if isinstance(question, list) and not spec.chat_template:
            question = plain_text(question)
        if isinstance(question, str):
            return RLPrompt(prompt=question, fields=fields, source=raw.location, row=row.number, column=column)
        return RLPrompt(messages=question, fields=fields, source=raw.location, row=row.number, column=column)

    prompts, invalid = parse_rows(raw, prompt, skip_invalid_rows)
    if not prompts:
        raise DataError(raw.location, None, None, f"none of its {len(raw.rows)} rows is usable: all invalid "
                        "(data.skip_invalid_rows)")
    logger.info("%s: %d %s prompts%s", raw.location, len(prompts), fmt, " (detected)" if spec.format == "auto" else "")
    return prompts, invalid


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


# A row's prompt (text, or chat messages), the column it came from, and its fields.
Converted = tuple[str | list[dict[str, Any]], str, dict[str, Any]]


def _gsm8k_row(values: dict[str, Any], where: RowChecker, template: PromptTemplate) -> Converted:
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
    return template.messages(question), "question", fields


def _openr1_row(values: dict[str, Any], where: RowChecker, template: PromptTemplate) -> Converted:
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
    return template.messages(problem), "problem", fields


def _rl2_row(values: dict[str, Any], where: RowChecker, template: PromptTemplate) -> Converted:
    """RL2 rows carry their own finished prompt: it is not wrapped in the template."""
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
    if isinstance(prompt, list) and prompt[-1]["role"] == "assistant":
        # An SFT chat: its last (assistant) turn is the gold answer, the `response` field (what `spin` trains
        # towards), and the prompt is the turns before it.
        if len(prompt) == 1:
            raise where.fail("messages", "the only message is the assistant's: there is no prompt to answer")
        if "response" in fields:
            raise where.fail("response", "the chat ends with an assistant turn, which is the row's response, "
                             "and the row has a `response` too: keep one")
        prompt, fields = prompt[:-1], {**fields, "response": prompt[-1]["content"]}
    return prompt, "prompt" if isinstance(prompt, str) else "messages", fields


ROW_CONVERTERS: dict[str, Callable[[dict[str, Any], RowChecker, PromptTemplate], Converted]] = {
    "gsm8k": _gsm8k_row, "openr1": _openr1_row, "rl2": _rl2_row,
}
