"""Format detection and row validation: every problem names the file, the row and the field."""

from __future__ import annotations

import pytest

from oxrl.data.errors import DataError
from oxrl.data.formats import Chat, Plain, detect_format, parse_row

OK_CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


@pytest.mark.parametrize(
    "columns, expected",
    [
        (["messages"], "messages"),
        (["prompt", "response", "id"], "prompt_response"),
        (["text"], "text"),
        (["prompt", "chosen", "rejected"], "preference"),
        (["messages", "chosen", "rejected"], "preference"),
        (["prompt", "completion", "label"], "kto"),
    ],
)
def test_detect_format(columns, expected):
    assert detect_format(columns, "data.jsonl") == expected


def test_detect_format_says_what_it_expected():
    with pytest.raises(DataError, match=r"data.jsonl: cannot tell the row format from the columns \['answer', 'question'\]; "
                                        r"expected `messages`; or `prompt` \+ `response`"):
        detect_format(["question", "answer"], "data.jsonl")


MALFORMED = [
    ("messages", {}, "messages", "missing field"),
    ("messages", {"messages": "hi"}, "messages", "expected a list of messages, got a string"),
    ("messages", {"messages": []}, "messages", "empty list of messages"),
    ("messages", {"messages": ["hi"]}, "messages[0]", "expected a message object {role, content}, got a string"),
    ("messages", {"messages": [{"content": "hi"}]}, "messages[0].role", "missing field"),
    ("messages", {"messages": [{"role": "bot", "content": "hi"}]}, "messages[0].role", "unknown role 'bot'"),
    ("messages", {"messages": [OK_CHAT[0], {"role": "assistant", "content": None}]}, "messages[1].content", "expected a string, got null"),
    ("messages", {"messages": [OK_CHAT[0], {"role": "assistant", "content": " "}]}, "messages[1].content", "empty string"),
    ("messages", {"messages": [OK_CHAT[0]]}, "messages", "no assistant turn"),
    ("prompt_response", {"prompt": "q"}, "response", "missing field"),
    ("prompt_response", {"prompt": 5, "response": "r"}, "prompt", "expected a string, got a number (5)"),
    ("prompt_response", {"prompt": "q", "response": None}, "response", "expected a string, got null"),
    ("prompt_response", {"prompt": "q", "response": ""}, "response", "empty string"),
    ("text", {"text": ["a"]}, "text", "expected a string, got a list"),
    ("preference", {"chosen": "a", "rejected": "b"}, "prompt", "missing field (give `prompt` or `messages`)"),
    ("preference", {"prompt": "q", "messages": OK_CHAT, "chosen": "a", "rejected": "b"}, "prompt", "both `prompt` and `messages`"),
    ("preference", {"prompt": "q", "chosen": "a"}, "rejected", "missing field"),
    ("preference", {"prompt": "q", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"}, "chosen[0].role", "expected role 'assistant'"),
    ("preference", {"prompt": "q", "chosen": "a", "rejected": {"text": "b"}}, "rejected", "expected a string, got an object"),
    ("preference", {"prompt": "q", "chosen": "a", "rejected": "b", "margin": "2"}, "margin", "expected a number, got a string"),
    ("preference", {"prompt": "q", "chosen": "a", "rejected": "b", "margin": True}, "margin", "expected a number, got a boolean"),
    ("kto", {"prompt": "q", "completion": "a", "label": "yes"}, "label", "expected a boolean (true or false), got a string"),
    ("kto", {"prompt": "q", "completion": "a", "label": 1}, "label", "expected a boolean (true or false), got a number (1)"),
    ("kto", {"prompt": "q", "completion": None, "label": True}, "completion", "expected a string, got null"),
    ("kto", {"prompt": "q", "completion": "a"}, "label", "missing field"),
]


@pytest.mark.parametrize("fmt, values, field, problem", MALFORMED)
def test_malformed_rows_name_file_row_and_field(fmt, values, field, problem):
    with pytest.raises(DataError) as caught:
        parse_row(fmt, values, location="data/x.jsonl", row=12, chat_template=True)
    error = caught.value
    assert (error.path, error.row, error.field) == ("data/x.jsonl", 12, field)
    assert str(error).startswith(f"data/x.jsonl, row 12, field '{field}': {problem}")


def test_null_keys_added_by_datasets_are_dropped_from_messages():
    values = {"messages": [{"role": "user", "content": "hi", "tool_calls": None}, {"role": "assistant", "content": "yo", "name": None}]}
    (chat,) = parse_row("messages", values, location="x", row=1, chat_template=True).sequences
    assert chat == Chat(OK_CHAT)


def test_system_content_may_be_empty():
    messages = [{"role": "system", "content": ""}, *OK_CHAT]
    (chat,) = parse_row("messages", {"messages": messages}, location="x", row=1, chat_template=True).sequences
    assert chat.messages == messages


def test_rendering_choice():
    as_plain = parse_row("prompt_response", {"prompt": "q", "response": "a"}, location="x", row=1, chat_template=False)
    assert as_plain.sequences == [Plain("q", "a")]
    # Messages cannot be plain text: they always use the chat template.
    pair = parse_row("preference", {"messages": OK_CHAT, "chosen": "a", "rejected": "b"}, location="x", row=1, chat_template=False)
    assert pair.sequences[0] == Chat([*OK_CHAT, {"role": "assistant", "content": "a"}], first_trained=2)
