"""Loss masks for every format, hand-checked on a character-level tokenizer, plus the real SmolLM2 template."""

from __future__ import annotations

import string

import pytest

from oxrl.data.errors import DataError
from oxrl.data.formats import parse_row
from oxrl.data.tokenize import NO_TRAINED_TOKENS_LEFT, TOO_LONG, ExampleTokenizer, truncate
from oxrl.data.types import Example, Sequence

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer(chat_template: str | None = CHATML, merges: list[tuple[str, str]] = ()):
    """One token per printable character (plus optional merges), ChatML specials, eos = <|im_end|>."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(set(string.printable)))}
    for left, right in merges:
        vocab[left + right] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=list(merges), unk_token=None))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", bos_token="<s>", additional_special_tokens=["<|im_start|>"]
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def trained_runs(tokenizer, sequence: Sequence) -> list[str]:
    """The trained tokens as text, one string per contiguous run."""
    runs, current = [], []
    for token, trained in zip(tokenizer.convert_ids_to_tokens(sequence.input_ids), sequence.loss_mask):
        if trained:
            current.append(token)
        elif current:
            runs.append("".join(current))
            current = []
    return runs + (["".join(current)] if current else [])


def tokenize(tokenizer, fmt: str, values: dict, chat_template: bool = True) -> Example:
    parsed = parse_row(fmt, values, location="data.jsonl", row=7, chat_template=chat_template)
    return ExampleTokenizer(tokenizer).example(parsed, source="data", location="data.jsonl", row=7)


def chat(*turns: str) -> list[dict]:
    return [{"role": role, "content": text} for role, text in zip(["user", "assistant"] * len(turns), turns)]


def test_messages_trains_each_assistant_content_and_end_of_turn_only():
    tok = char_tokenizer()
    messages = [{"role": "system", "content": "Be terse."}, *chat("Hi", "Hello!", "2+2?", "Four.")]
    (sequence,) = tokenize(tok, "messages", {"messages": messages}).sequences
    assert trained_runs(tok, sequence) == ["Hello!<|im_end|>", "Four.<|im_end|>"]
    tokens = tok.convert_ids_to_tokens(sequence.input_ids)
    after_first_turn = tokens.index("<|im_end|>", tokens.index("!"))
    assert tokens[after_first_turn + 1] == "\n" and not sequence.loss_mask[after_first_turn + 1]
    assert sequence.loss_mask[0] is False


def test_prompt_response_with_chat_template_is_a_two_message_chat():
    tok = char_tokenizer()
    as_chat = tokenize(tok, "prompt_response", {"prompt": "Hi", "response": "Yo"})
    as_messages = tokenize(tok, "messages", {"messages": chat("Hi", "Yo")})
    assert as_chat.sequences == as_messages.sequences
    assert trained_runs(tok, as_chat.sequences[0]) == ["Yo<|im_end|>"]


def test_prompt_response_plain_trains_response_and_eos():
    tok = char_tokenizer()
    (sequence,) = tokenize(tok, "prompt_response", {"prompt": "Q: 1+1=", "response": " 2"}, chat_template=False).sequences
    assert "".join(tok.convert_ids_to_tokens(sequence.input_ids)) == "Q: 1+1= 2<|im_end|>"
    assert sequence.loss_mask == [False] * 7 + [True] * 3


def test_text_trains_every_token_but_the_first_plus_eos():
    tok = char_tokenizer()
    (sequence,) = tokenize(tok, "text", {"text": "abc"}).sequences
    assert tok.convert_ids_to_tokens(sequence.input_ids) == ["a", "b", "c", "<|im_end|>"]
    assert sequence.loss_mask == [False, True, True, True]


def test_preference_pair_shares_prompt_tokens_and_trains_only_completions():
    tok = char_tokenizer()
    prompt = chat("a", "b", "c")  # a prompt with an earlier assistant turn: not trained
    example = tokenize(tok, "preference", {"messages": prompt, "chosen": "yes", "rejected": [{"role": "assistant", "content": "no"}]})
    chosen, rejected = example.sequences
    assert [trained_runs(tok, s) for s in (chosen, rejected)] == [["yes<|im_end|>"], ["no<|im_end|>"]]
    first = chosen.loss_mask.index(True)
    assert first == rejected.loss_mask.index(True) and chosen.input_ids[:first] == rejected.input_ids[:first]


def test_preference_completion_repeating_the_prompt_is_stripped():
    tok = char_tokenizer()
    repeated = tokenize(tok, "preference", {"prompt": "q", "chosen": chat("q", "yes"), "rejected": chat("q", "no")})
    plain = tokenize(tok, "preference", {"prompt": "q", "chosen": "yes", "rejected": "no"})
    assert repeated.sequences == plain.sequences


def test_plain_preference_and_kto():
    tok = char_tokenizer()
    pair = tokenize(tok, "preference", {"prompt": "x=", "chosen": "1", "rejected": "22"}, chat_template=False)
    assert [trained_runs(tok, s) for s in pair.sequences] == [["1<|im_end|>"], ["22<|im_end|>"]]
    good = tokenize(tok, "kto", {"prompt": "x=", "completion": "1", "label": True})
    bad = tokenize(tok, "kto", {"prompt": "x=", "completion": "3", "label": "false"})  # CSV cells are text
    assert (good.fields, bad.fields) == ({"label": 1.0}, {"label": 0.0})
    assert trained_runs(tok, good.sequences[0]) == ["1<|im_end|>"] and len(bad.sequences) == 1


def test_token_straddling_the_prompt_boundary_is_trained_and_pairs_must_agree():
    tok = char_tokenizer(merges=[("=", "1")])
    (sequence,) = tokenize(tok, "prompt_response", {"prompt": "x=", "response": "1"}, chat_template=False).sequences
    assert trained_runs(tok, sequence) == ["=1<|im_end|>"]
    with pytest.raises(DataError, match=r"data.jsonl, row 7, field 'rejected': chosen and rejected tokenize their shared prompt"):
        tokenize(tok, "preference", {"prompt": "x=", "chosen": "1", "rejected": "2"}, chat_template=False)


def test_template_without_end_of_turn_token_trains_content_up_to_trailing_whitespace():
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] | trim }}\n\n{% endfor %}"
                "{% if add_generation_prompt %}assistant: {% endif %}")
    tok = char_tokenizer(template)
    (sequence,) = tokenize(tok, "messages", {"messages": chat("hi", " Hello ")}).sequences
    assert trained_runs(tok, sequence) == ["Hello"]


def test_template_that_is_not_prefix_stable_is_rejected_with_location():
    template = ("{% for m in messages %}{% if loop.last %}[last]{% endif %}{{ m['role'] }}: {{ m['content'] }}<|im_end|>"
                "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    tok = char_tokenizer(template)
    with pytest.raises(DataError, match=r"data.jsonl, row 7, field 'messages\[1\]': the chat template is not prefix-stable"):
        tokenize(tok, "messages", {"messages": chat("hi", "yo")})


def test_missing_chat_template_is_a_clear_error():
    with pytest.raises(ValueError, match="no chat template"):
        tokenize(char_tokenizer(chat_template=None), "messages", {"messages": chat("hi", "yo")})


def _example(*sequences: tuple[list[int], list[bool]]) -> Example:
    return Example([Sequence(ids, mask) for ids, mask in sequences], source="data", row=3)


def test_truncation_policies():
    long = _example(([1, 2, 3, 4, 5, 6], [False, False, False, True, True, True]))
    right, _ = truncate(long, 4, "right", location="data.jsonl")
    assert (right.sequences[0].input_ids, right.sequences[0].loss_mask) == ([1, 2, 3, 4], [False, False, False, True])
    left, _ = truncate(long, 4, "left", location="data.jsonl")
    assert (left.sequences[0].input_ids, left.sequences[0].loss_mask) == ([3, 4, 5, 6], [False, True, True, True])
    assert truncate(long, 4, "drop", location="data.jsonl") == (None, TOO_LONG)
    with pytest.raises(DataError, match=r"data.jsonl, row 3: 6 tokens, more than data.max_length=4"):
        truncate(long, 4, "error", location="data.jsonl")
    assert truncate(long, 3, "right", location="data.jsonl") == (None, NO_TRAINED_TOKENS_LEFT)
    assert truncate(long, 6, "error", location="data.jsonl") == (long, None)


def test_left_truncation_cuts_a_pair_by_the_same_amount():
    pair = _example(([1, 2, 3, 4, 5, 6], [False, False, True, True, True, True]), ([1, 2, 3, 7], [False, False, True, True]))
    kept, reason = truncate(pair, 5, "left", location="data.jsonl")
    assert reason is None
    assert [s.input_ids for s in kept.sequences] == [[2, 3, 4, 5, 6], [2, 3, 7]]
    assert [s.loss_mask for s in kept.sequences] == [[False, True, True, True, True], [False, True, True]]


def test_smollm2_multi_turn_trains_exactly_assistant_contents_and_im_end(smollm2_tokenizer):
    tok = smollm2_tokenizer
    contents = ["Hello! How can I help?", "The answer is 4.", "The answer is 8."]
    messages = chat("Hi", contents[0], "What is 2+2?", contents[1], "And doubled?", contents[2])
    (sequence,) = tokenize(tok, "messages", {"messages": messages}).sequences
    assert sequence.input_ids == tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    runs, current, after_runs = [], [], []
    for position, (token_id, trained) in enumerate(zip(sequence.input_ids, sequence.loss_mask)):
        if trained:
            current.append(token_id)
        elif current:
            runs.append(tok.decode(current))
            after_runs.append(tok.decode([token_id]))
            current = []
    assert runs == [content + "<|im_end|>" for content in contents]
    assert after_runs == ["\n"] * 3  # the newline after <|im_end|> is not trained
    untrained_text = tok.decode([t for t, m in zip(sequence.input_ids, sequence.loss_mask) if not m])
    assert untrained_text.count("<|im_start|>assistant\n") == 3
