"""Row formats: detect them from the columns, validate every row, and normalise it for tokenisation.

| format            | columns                                                   | becomes                          |
|-------------------|-----------------------------------------------------------|----------------------------------|
| `messages`        | `messages`: [{role, content}, ...], >= 1 assistant turn   | one chat, every assistant turn trained |
| `prompt_response` | `prompt`, `response` (strings)                            | one chat (user, assistant), or plain text |
| `text`            | `text` (string)                                           | plain text, every token trained  |
| `preference`      | `prompt` (string) or `messages`; `chosen`, `rejected`     | two sequences: chosen, rejected  |
| `kto`             | `prompt` (string) or `messages`; `completion`; `label`    | one sequence + `label` field     |

`chosen`/`rejected`/`completion` are a string or a list of assistant messages; a list may repeat
the prompt's messages at its start (as HuggingFaceH4/ultrafeedback_binarized does), and that
repeated part is dropped. Roles are `system`, `user`, `assistant` and `tool`; contents are strings,
non-empty except for `system`. A KTO `label` is a boolean (CSV cells, being text, may say `true` /
`false`).

Rendering: a row whose prompt and completions are all strings is plain text when the dataset sets
`chat_template: false` (prompt + completion + eos); everything else goes through the tokenizer's
chat template, a string prompt becoming one user message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oxrl.data.errors import DataError

FORMATS = ("messages", "prompt_response", "text", "preference", "kto")
ROLES = ("system", "user", "assistant", "tool")
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


def detect_format(columns: list[str], location: str) -> str:
    present = set(columns)
    for name, required in _DETECTION:
        if required <= present:
            return name
    problem = f"cannot tell the row format from the columns {sorted(present)}; expected {_EXPECTED}"
    raise DataError(location, None, None, problem + ". Rename columns with `columns: {old: new}` or set `format`.")


def parse_row(fmt: str, values: dict[str, Any], *, location: str, row: int, chat_template: bool) -> ParsedRow:
    """Validate one row of format `fmt`; every problem raises DataError(location, row, field, ...)."""
    check = _RowChecker(location, row)
    if fmt == "messages":
        messages = check.messages(values, "messages", need_assistant=True)
        return ParsedRow([Chat(messages)])
    if fmt == "prompt_response":
        prompt, response = check.string(values, "prompt"), check.string(values, "response")
        return ParsedRow([_sequence(prompt, response, chat_template)])
    if fmt == "text":
        return ParsedRow([Plain("", check.string(values, "text"))])
    if fmt == "preference":
        prompt = check.prompt(values)
        pair = [_sequence(prompt, check.completion(values, name, prompt), chat_template) for name in ("chosen", "rejected")]
        # An optional `margin` column (the score gap a reward model must keep, Llama 2) rides along as a field.
        margin = {"margin": check.number(values, "margin")} if values.get("margin") is not None else {}
        return ParsedRow(pair, margin)
    if fmt == "kto":
        prompt = check.prompt(values)
        label = check.boolean(values, "label")
        completion = check.completion(values, "completion", prompt)
        return ParsedRow([_sequence(prompt, completion, chat_template)], {"label": float(label)})
    raise ValueError(f"unknown row format {fmt!r}; valid formats are {list(FORMATS)}")


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
        self._non_empty_string(item["content"], f"{name}.content", allow_empty=role == "system")
        # `datasets` gives every message every key any message has (as null); a template may test
        # `message.tool_calls is defined`, so drop the nulls.
        return {key: val for key, val in item.items() if val is not None}

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
