"""Row formats: detect them from the columns, validate every row, and normalise it for tokenisation.

| format            | columns                                                   | becomes                          |
|-------------------|-----------------------------------------------------------|----------------------------------|
| `messages`        | `messages`: [{role, content}, ...], >= 1 assistant turn   | one chat, every assistant turn trained |
| `prompt_response` | `prompt`, `response` (strings)                            | one chat (user, assistant), or plain text |
| `text`            | `text` (string)                                           | plain text, every token trained  |
| `preference`      | `prompt` (string) or `messages`; `chosen`, `rejected`     | two sequences: chosen, rejected  |
| `kto`             | `prompt` (string) or `messages`; `completion`; `label`    | one sequence + `label` field     |
| (all but `text`)  | optionally `images`: a list of images                     | the same, with `ParsedRow.images` |

`chosen`/`rejected`/`completion` are a string or a list of assistant messages; a list may repeat
the prompt's messages at its start (as HuggingFaceH4/ultrafeedback_binarized does), and that
repeated part is dropped. Roles are `system`, `user`, `assistant` and `tool`. A content is a string,
non-empty except for `system`, or a list of parts `{"type": "text", "text": "..."}` (non-empty) and
`{"type": "image"}`. A KTO `label` is a boolean (CSV cells, being text, may say `true` / `false`).

Images (vision-language rows) belong to the prompt: a preference pair shares them, and they are
decoded once per row (`oxrl.data.images`: the accepted forms, the `data.max_image_pixels` bound).
Each image needs one placeholder: an image part, or the marker `<image>` in a string content, which
is split into parts there (`"<image>Find x."`, the verl / Geometry3K convention). A row with images
and no placeholder gets one image part per image at the start of its first user message (TRL's
convention); any other count that differs from the number of images is an error. Only `user` and
`system` messages may hold images (oxRL does not train on images). Without images, `<image>` is
plain text but an image part is an error; images on a `text` row, or with `chat_template: false`,
are errors too. RL rows (`prompt`/`messages` + `images` + `answer`) are `oxrl.data.rl_prompts`'s,
which places their images with the same `prompt_messages_with_images`.

Rendering: a row whose prompt and completions are all strings is plain text when the dataset sets
`chat_template: false` (prompt + completion + eos); everything else goes through the tokenizer's
chat template, a string prompt becoming one user message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oxrl.data.errors import DataError

if TYPE_CHECKING:
    from PIL import Image

FORMATS = ("messages", "prompt_response", "text", "preference", "kto")
ROLES = ("system", "user", "assistant", "tool")
IMAGE_ROLES = ("system", "user")  # the roles whose messages may hold images
IMAGE_MARKER = "<image>"
# Checked in this order by `format: auto`: the first whose columns are all present wins.
_DETECTION = (
    ("preference", {"chosen", "rejected"}),
    ("kto", {"completion", "label"}),
    ("messages", {"messages"}),
    ("prompt_response", {"prompt", "response"}),
    ("text", {"text"}),
)
_EXPECTED = (
    "`messages`; or `prompt` + `response`; or `text`; or (`prompt` or `messages`) + `chosen` + `rejected`; "
    "or (`prompt` or `messages`) + `completion` + `label`"
)

Message = dict[str, Any]


@dataclass(frozen=True)
class Chat:
    """A conversation rendered with the chat template; assistant turns at index >= `first_trained` are trained."""

    messages: list[Message]
    first_trained: int = 0


@dataclass(frozen=True)
class Plain:
    """Plain text `prompt + completion + eos`; the completion and the eos are trained."""

    prompt: str  # "" for continued pre-training
    completion: str


@dataclass(frozen=True)
class ParsedRow:
    sequences: list[Chat | Plain]  # one; or [chosen, rejected]
    fields: dict[str, float] = field(default_factory=dict)
    images: list[Image.Image] = field(default_factory=list)  # RGB, in placeholder order; shared by the sequences


def detect_format(columns: list[str], location: str) -> str:
    present = set(columns)
    for name, required in _DETECTION:
        if required <= present:
            return name
    problem = f"cannot tell the row format from the columns {sorted(present)}; expected {_EXPECTED}"
    raise DataError(location, None, None, problem + ". Rename columns with `columns: {old: new}` or set `format`.")


def parse_row(
    fmt: str,
    values: dict[str, Any],
    *,
    location: str,
    row: int,
    chat_template: bool,
    image_root: Path | None = None,
    max_image_pixels: int = 1024 * 1024,
) -> ParsedRow:
    """Validate one row of format `fmt`; every problem raises DataError(location, row, field, ...).

    Its images are decoded here (relative paths against `image_root`, at most `max_image_pixels` pixels
    each), so that a bad image stops the run with its row before any model loads.
    """
    check = _RowChecker(location, row)
    if fmt not in FORMATS:
        raise ValueError(f"unknown row format {fmt!r}; valid formats are {list(FORMATS)}")
    if fmt == "text":
        if _has_images(values):
            raise check.fail("images", "a `text` row cannot carry images: give them with a prompt "
                             "(`prompt_response`, `messages`, `preference` or `kto` rows)")
        return ParsedRow([Plain("", check.string(values, "text"))])

    def with_images(prompt: str | list[Message]) -> tuple[str | list[Message], list[Image.Image]]:
        return check.images(values, prompt, root=image_root, max_pixels=max_image_pixels, chat_template=chat_template)

    if fmt == "messages":
        messages, images = with_images(check.messages(values, "messages", need_assistant=True))
        return ParsedRow([Chat(messages)], images=images)
    if fmt == "prompt_response":
        prompt, response = check.string(values, "prompt"), check.string(values, "response")
        prompt, images = with_images(prompt)
        return ParsedRow([_sequence(prompt, response, chat_template)], images=images)
    prompt = check.prompt(values)
    if fmt == "preference":
        chosen, rejected = (check.completion(values, name, prompt) for name in ("chosen", "rejected"))
        prompt, images = with_images(prompt)
        pair = [_sequence(prompt, completion, chat_template) for completion in (chosen, rejected)]
        # An optional `margin` column (the score gap a reward model must keep, Llama 2) rides along as a field.
        margin = {"margin": check.number(values, "margin")} if values.get("margin") is not None else {}
        return ParsedRow(pair, margin, images)
    label = check.boolean(values, "label")  # kto
    completion = check.completion(values, "completion", prompt)
    prompt, images = with_images(prompt)
    return ParsedRow([_sequence(prompt, completion, chat_template)], {"label": float(label)}, images)


def prompt_messages_with_images(
    prompt: str | list[Message], n_images: int, location: str, row: int
) -> list[Message]:
    """`prompt` (a string is one user message) as messages holding exactly one image part per image.

    The one home of the placeholder rules (module docstring): `<image>` markers in string contents
    become image parts; with no placeholder at all, `n_images` image parts open the first user message;
    otherwise the number of placeholders must be `n_images`. `prompt`'s messages are already checked.
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    messages = [_split_markers(message, f"messages[{i}]", location, row) for i, message in enumerate(messages)]
    count = count_image_parts(messages)
    if count == 0 and n_images:
        first_user = next((i for i, message in enumerate(messages) if message["role"] == "user"), None)
        if first_user is None:
            raise DataError(location, row, "messages", f"no user message to hold the {n_images} images")
        content = messages[first_user]["content"]
        text = [{"type": "text", "text": content}] if isinstance(content, str) else content
        messages[first_user] = {**messages[first_user], "content": [{"type": "image"} for _ in range(n_images)] + text}
    elif count != n_images:
        raise DataError(location, row, "images",
                        f"{count} image placeholders (image parts or `<image>` markers) but {n_images} images")
    return messages


def count_image_parts(messages: list[Message]) -> int:
    return sum(part["type"] == "image" for m in messages if isinstance(m["content"], list) for part in m["content"])


def _split_markers(message: Message, name: str, location: str, row: int) -> Message:
    """`message` with each `<image>` of a string content made an image part, the text around it text parts."""
    content = message["content"]
    if not isinstance(content, str) or IMAGE_MARKER not in content:
        return message
    if message["role"] not in IMAGE_ROLES:
        raise DataError(location, row, f"{name}.content", _no_images_in(message["role"]))
    first, *rest = content.split(IMAGE_MARKER)
    parts = [{"type": "text", "text": first}] if first else []
    for text in rest:
        parts += [{"type": "image"}] + ([{"type": "text", "text": text}] if text else [])
    return {**message, "content": parts}


def _no_images_in(role: str) -> str:
    allowed = " and ".join(IMAGE_ROLES)
    return f"{role} messages may not hold images (only {allowed} messages may: oxRL does not train on images)"


def _has_images(values: dict[str, Any]) -> bool:
    """Whether the row's `images` column holds anything (`datasets` fills a row without it with null)."""
    column = values.get("images")
    return column is not None and not (isinstance(column, (list, tuple)) and not column)


def _sequence(prompt: str | list[Message], completion: str | list[Message], chat_template: bool) -> Chat | Plain:
    """Plain text when both sides are strings and the dataset asked for no template; else a chat."""
    if not chat_template and isinstance(prompt, str) and isinstance(completion, str):
        return Plain(prompt, completion)
    prompt_messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    completion_messages = [{"role": "assistant", "content": completion}] if isinstance(completion, str) else completion
    return Chat(prompt_messages + completion_messages, first_trained=len(prompt_messages))


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for messages such as 'expected a string, got null'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class _RowChecker:
    """Validation helpers that know where they are, so that every error names file, row and field."""

    def __init__(self, location: str, row: int):
        self.location = location
        self.row = row

    def fail(self, field_name: str | None, problem: str) -> DataError:
        return DataError(self.location, self.row, field_name, problem)

    def string(self, values: dict[str, Any], name: str) -> str:
        if name not in values:
            raise self.fail(name, "missing field")
        return self._non_empty_string(values[name], name)

    def _non_empty_string(self, value: Any, name: str, allow_empty: bool = False) -> str:
        if not isinstance(value, str):
            raise self.fail(name, f"expected a string, got {_kind(value)}")
        if not allow_empty and not value.strip():
            raise self.fail(name, "empty string")
        return value

    def boolean(self, values: dict[str, Any], name: str) -> bool:
        if name not in values:
            raise self.fail(name, "missing field")
        value = values[name]
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise self.fail(name, f"expected a boolean (true or false), got {_kind(value)}")

    def number(self, values: dict[str, Any], name: str) -> float:
        value = values.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:  # NaN != NaN
            raise self.fail(name, f"expected a number, got {_kind(value)}")
        return float(value)

    def messages(self, values: dict[str, Any], name: str, need_assistant: bool) -> list[Message]:
        if name not in values:
            raise self.fail(name, "missing field")
        return self._message_list(values[name], name, need_assistant=need_assistant)

    def _message_list(
        self, value: Any, name: str, need_assistant: bool = False, only_role: str | None = None
    ) -> list[Message]:
        if not isinstance(value, (list, tuple)):
            raise self.fail(name, f"expected a list of messages, got {_kind(value)}")
        if not value:
            raise self.fail(name, "empty list of messages")
        cleaned = [self._message(item, f"{name}[{i}]", only_role) for i, item in enumerate(value)]
        if need_assistant and not any(m["role"] == "assistant" for m in cleaned):
            raise self.fail(name, "no assistant turn: nothing to train on")
        return cleaned

    def _message(self, item: Any, name: str, only_role: str | None) -> Message:
        if not isinstance(item, dict):
            raise self.fail(name, f"expected a message object {{role, content}}, got {_kind(item)}")
        for key in ("role", "content"):
            if key not in item:
                raise self.fail(f"{name}.{key}", "missing field")
        role = item["role"]
        if not isinstance(role, str) or role not in ROLES:
            raise self.fail(f"{name}.role", f"unknown role {role!r}; expected one of {list(ROLES)}")
        if only_role is not None and role != only_role:
            raise self.fail(f"{name}.role", f"expected role {only_role!r}, got {role!r}")
        content = item["content"]
        if isinstance(content, (list, tuple)):
            content = self._content_parts(content, f"{name}.content", role)
        else:
            self._non_empty_string(content, f"{name}.content", allow_empty=role == "system")
        # `datasets` gives every message every key any message has (as null); a template may test
        # `message.tool_calls is defined`, so drop the nulls.
        return {key: val for key, val in item.items() if val is not None} | {"content": content}

    def _content_parts(self, parts: list | tuple, name: str, role: str) -> list[dict[str, Any]]:
        if not parts:
            raise self.fail(name, "empty list of content parts")
        cleaned = []
        for i, part in enumerate(parts):
            where = f"{name}[{i}]"
            if not isinstance(part, dict):
                raise self.fail(where, f"expected a content part {{type, ...}}, got {_kind(part)}")
            part = {key: val for key, val in part.items() if val is not None}  # `datasets` nulls, as for messages
            if part.get("type") == "text":
                if "text" not in part:
                    raise self.fail(f"{where}.text", "missing field")
                self._non_empty_string(part["text"], f"{where}.text")
            elif part.get("type") == "image":
                if role not in IMAGE_ROLES:
                    raise self.fail(where, _no_images_in(role))
            else:
                problem = f"unknown content part type {part.get('type')!r}; expected 'text' or 'image'"
                raise self.fail(f"{where}.type", problem)
            cleaned.append(part)
        return cleaned

    def images(
        self, values: dict[str, Any], prompt: str | list[Message], *, root: Path | None, max_pixels: int,
        chat_template: bool,
    ) -> tuple[str | list[Message], list[Image.Image]]:
        """The row's decoded images, and `prompt` with their placeholders (`prompt_messages_with_images`)."""
        if not _has_images(values):
            # Without images `<image>` in a string is plain text, but an image part has nothing to show.
            placeholders = count_image_parts(prompt) if isinstance(prompt, list) else 0
            if placeholders:
                missing = "missing field" if values.get("images") is None else "an empty list"
                raise self.fail("images", f"{missing}, but the messages hold {placeholders} image placeholders")
            return prompt, []
        if not chat_template:
            raise self.fail("images", "images need the chat template, and this dataset sets `chat_template: false`")
        from oxrl.data.images import decode_images  # image rows only: text runs load no image code

        images = decode_images(values["images"], location=self.location, row=self.row, root=root, max_pixels=max_pixels)
        return prompt_messages_with_images(prompt, len(images), self.location, self.row), images

    def prompt(self, values: dict[str, Any]) -> str | list[Message]:
        has_prompt = values.get("prompt") is not None
        has_messages = values.get("messages") is not None
        if has_prompt and has_messages:
            raise self.fail("prompt", "both `prompt` and `messages` are set; give the prompt once")
        if has_messages:
            return self._message_list(values["messages"], "messages")
        if "prompt" not in values:
            raise self.fail("prompt", "missing field (give `prompt` or `messages`)")
        return self._non_empty_string(values["prompt"], "prompt")

    def completion(self, values: dict[str, Any], name: str, prompt: str | list[Message]) -> str | list[Message]:
        if name not in values:
            raise self.fail(name, "missing field")
        value = values[name]
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            return self._non_empty_string(value, name)
        prompt_messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        repeated = len(prompt_messages)
        if len(value) > repeated and all(
            isinstance(v, dict) and v.get("role") == p["role"] and v.get("content") == p["content"]
            for v, p in zip(value[:repeated], prompt_messages)
        ):
            # The completion repeats the prompt's conversation first; keep only what follows.
            return [self._message(item, f"{name}[{i}]", "assistant") for i, item in enumerate(value) if i >= repeated]
        return self._message_list(value, name, only_role="assistant")
