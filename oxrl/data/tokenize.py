"""Parsed rows -> token `Example`s with loss masks, and the truncation policy.

What is trained (loss_mask True), exactly:

* Chat (`messages`, and every row rendered with the chat template): for each trained assistant
  turn, the text the model has to produce after the template's generation prompt, up to and
  including the template's end-of-turn token. For SmolLM2 (ChatML) that is the assistant content
  plus `<|im_end|>`; not the `<|im_start|>assistant\\n` header before it, not the `\\n` after it,
  and nothing of the system/user turns.
  How: the conversation is rendered as text once; turn i's span starts where
  `render(messages[:i], add_generation_prompt=True)` ends and ends where `render(messages[:i+1])`
  ends. Both renders must be prefixes of the full render ("prefix-stable" template), else the row
  is rejected. The span is cut after the first special token (e.g. `<|im_end|>`, `<|eot_id|>`,
  `<end_of_turn>`) that follows the content, or, if there is none, after the span's last
  non-whitespace character. The full text is tokenized once (offsets mapping) and a token is
  trained when its characters overlap a span, so no content character is ever left untrained.
* Plain `prompt + completion` (`chat_template: false`): the tokens overlapping the completion,
  plus an eos token appended after it (a token straddling the boundary counts as completion).
* `text` (continued pre-training): every token but the first (nothing predicts it), plus an
  appended eos.
* Preference: chosen and rejected must tokenize their shared prompt identically (checked).

The tokenizer must be a "fast" one (offsets mapping) and, for chats, have a chat template.

Rows with images (vision-language models) are rendered with the model processor's chat template, where each
image is a placeholder (e.g. Qwen2-VL's `<|vision_start|><|image_pad|><|vision_end|>`), and the loss mask is
placed as above on that text. The processor then expands each placeholder into the image's tokens (as many as its
grid needs) and computes the image tensors; the mask is carried over to the expanded ids by aligning the two
token lists (difflib): placeholders only ever stand in prompt turns, so every trained token is in an unchanged
stretch, which is checked. Such a sequence is never cut: an image's tokens must all stay with its features, so a
too-long row with images is skipped (`drop`, `right`, `left`) or stops the run (`error`).
"""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import TYPE_CHECKING, Any

from oxrl.data.errors import DataError
from oxrl.data.formats import Chat, ParsedRow, Plain
from oxrl.data.types import Example, Sequence, VisionInputs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TRUNCATION_POLICIES = ("right", "left", "drop", "error")
# Reasons a row is skipped after tokenisation (keys of `LoadedData.skipped`).
TOO_LONG = "too_long"
NO_TRAINED_TOKENS_LEFT = "no_trained_tokens_after_truncation"

Span = tuple[int, int]  # [start, end) character offsets

NOT_PREFIX_STABLE = (
    "the chat template is not prefix-stable (rendering the conversation up to this turn is not a prefix of the whole "
    "rendering), so the assistant tokens cannot be located; set `model.chat_template` to a template that renders "
    "earlier turns the same way"
)
PROMPT_TOKENS_DIFFER = (
    "chosen and rejected tokenize their shared prompt differently (a token spans the prompt/completion boundary); "
    "end the prompt with a space or newline"
)


class ExampleTokenizer:
    """Turns parsed rows into `Example`s with one tokenizer (and a vision-language model's processor); built once per run."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, processor=None):
        self.processor = processor  # renders chats (its chat template) and expands images; None for text models
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                f"{type(tokenizer).__name__} is a slow tokenizer; oxRL needs a fast one (offsets mapping) to place loss masks"
            )
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token; plain-text rows need one to end each sequence")
        self.tokenizer = tokenizer
        self.eos_token_id: int = tokenizer.eos_token_id
        # Strings of special tokens: the first one after an assistant's content ends its turn.
        specials = set(tokenizer.all_special_tokens)
        specials.update(tok.content for tok in tokenizer.added_tokens_decoder.values() if tok.special)
        self.special_tokens = sorted((s for s in specials if s), key=len, reverse=True)

    def example(self, parsed: ParsedRow, *, source: str, location: str, row: int) -> Example:
        sequences = [self.sequence(segment, location=location, row=row, images=parsed.images)
                     for segment in parsed.sequences]
        if len(sequences) > 1:
            self._check_shared_prompt(sequences, location, row)
        return Example(sequences, dict(parsed.fields), source=source, row=row)

    def sequence(self, segment: Chat | Plain, *, location: str, row: int, images: list = ()) -> Sequence:
        if isinstance(segment, Plain):
            return self._plain_sequence(segment)
        return self._chat_sequence(segment, location, row, list(images))

    def _plain_sequence(self, plain: Plain) -> Sequence:
        text = plain.prompt + plain.completion
        ids, mask = self._tokenize(text, [(len(plain.prompt), len(text))], add_special_tokens=True)
        if not ids or ids[-1] != self.eos_token_id:  # some tokenizers append eos themselves
            ids.append(self.eos_token_id)
            mask.append(True)
        mask[-1] = True
        mask[0] = False
        return Sequence(ids, mask)

    def _chat_sequence(self, chat: Chat, location: str, row: int, images: list) -> Sequence:
        if images and self.processor is None:
            raise DataError(location, row, "images", "the row has images but the model is not a vision-language model "
                            "(its folder has no processor)")
        if not self.tokenizer.chat_template:
            raise ValueError(
                "the tokenizer has no chat template: set `model.chat_template`, or `chat_template: false` on "
                "prompt/response datasets"
            )
        full = self._render(chat.messages, False)
        spans = []
        for i, message in enumerate(chat.messages):
            if i < chat.first_trained or message["role"] != "assistant":
                continue
            before = self._render(chat.messages[:i], True)
            through = self._render(chat.messages[: i + 1], False)
            if not (full.startswith(before) and full.startswith(through) and len(through) > len(before)):
                raise DataError(location, row, f"messages[{i}]", NOT_PREFIX_STABLE)
            spans.append(self._turn_span(through, len(before), message["content"]))
        ids, mask = self._tokenize(full, spans, add_special_tokens=False)
        if ids:
            mask[0] = False
        if images:
            return self._with_images(Sequence(ids, mask), full, images, location, row)
        return Sequence(ids, mask)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        renderer = self.processor if self.processor is not None else self.tokenizer
        return renderer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _with_images(self, sequence: Sequence, text: str, images: list, location: str, row: int) -> Sequence:
        """`sequence`, the tokens of `text` (image placeholders unexpanded), with each placeholder expanded into its
        image's tokens by the processor, the loss mask carried over, and the image tensors attached."""
        expanded, vision = VisionInputs.expand(self.processor, text, images)
        mask = [False] * len(expanded)
        matcher = SequenceMatcher(None, sequence.input_ids, expanded, autojunk=False)
        for tag, a0, a1, b0, _ in matcher.get_opcodes():
            if tag == "equal":
                mask[b0 : b0 + a1 - a0] = sequence.loss_mask[a0:a1]
        if sum(mask) != sum(sequence.loss_mask):
            raise DataError(location, row, "images", "the processor changed trained (assistant) tokens while inserting "
                            "the image tokens; images may only stand in user and system turns")
        return Sequence(expanded, mask, vision)

    def _turn_span(self, through: str, start: int, content: str) -> Span:
        """Characters trained for the turn that `through` ends with, generation starting at `start`."""
        produced = through[start:]
        content_at = produced.find(content.strip())
        search_from = 0 if content_at < 0 else content_at + len(content.strip())
        end_of_turn = None
        for token in self.special_tokens:  # longest first, so ties go to the longer token
            at = produced.find(token, search_from)
            if at >= 0 and (end_of_turn is None or at < end_of_turn[0]):
                end_of_turn = (at, at + len(token))
        end = end_of_turn[1] if end_of_turn else len(produced.rstrip())
        return start, start + end

    def _tokenize(self, text: str, spans: list[Span], *, add_special_tokens: bool) -> tuple[list[int], list[bool]]:
        encoded = self.tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        mask = [
            end > begin and any(begin < span_end and end > span_start for span_start, span_end in spans)
            for begin, end in encoded["offset_mapping"]
        ]
        return ids, mask

    @staticmethod
    def _check_shared_prompt(sequences: list[Sequence], location: str, row: int) -> None:
        def prompt_ids(sequence: Sequence) -> list[int]:
            first_trained = sequence.loss_mask.index(True) if any(sequence.loss_mask) else len(sequence)
            return sequence.input_ids[:first_trained]

        if any(prompt_ids(s) != prompt_ids(sequences[0]) for s in sequences[1:]):
            raise DataError(location, row, "rejected", PROMPT_TOKENS_DIFFER)


def truncate(example: Example, max_length: int, policy: str, *, location: str) -> tuple[Example | None, str | None]:
    """Apply `DataConfig.truncation`: (the example, None), or (None, reason) when it is skipped.

    `right` keeps the first `max_length` tokens of every sequence. `left` drops the same number of
    leading tokens from every sequence of the example (as many as the longest needs), so that a
    preference pair keeps sharing its shortened prompt. A sequence left with no trained token
    skips the example (reason `no_trained_tokens_after_truncation`).
    """
    longest = max(len(s) for s in example.sequences)
    if longest <= max_length:
        return example, None
    if policy == "error":
        raise DataError(location, example.row, None, f"{longest} tokens, more than data.max_length={max_length} "
                        "(set data.truncation to right, left or drop to accept long rows)")
    if policy == "drop" or any(s.vision is not None for s in example.sequences):  # image tokens are never cut
        return None, TOO_LONG
    if policy == "right":
        kept = [Sequence(s.input_ids[:max_length], s.loss_mask[:max_length]) for s in example.sequences]
    elif policy == "left":
        cut = longest - max_length
        kept = [Sequence(s.input_ids[cut:], [False] + s.loss_mask[cut + 1 :]) if len(s) > cut else Sequence([], [])
                for s in example.sequences]
    else:
        raise ValueError(f"unknown truncation policy {policy!r}; valid policies are {list(TRUNCATION_POLICIES)}")
    if any(not any(s.loss_mask) for s in kept):
        return None, NO_TRAINED_TOKENS_LEFT
    return Example(kept, example.fields, example.source, example.row), None
