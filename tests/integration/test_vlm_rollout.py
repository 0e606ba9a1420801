"""Vision-language rows in the trainer's forward and in the transformers engine, on tiny random Qwen2-VL, Idefics3
and Gemma 3 models (tests/vlm_fixtures.py): packed == one sequence at a time == the model's own unpacked forward; engine
log-probs == trainer log-probs on image prompts; prompts render with their images; bad input is refused."""

from __future__ import annotations

import pytest
import torch

from oxrl.models import lm_head
from oxrl.models.logprobs import token_logprobs
from oxrl.data.errors import DataError
from oxrl.data.formats import Chat
from oxrl.data.rl_tasks import RLPrompt, encode_prompts
from oxrl.data.tokenize import ExampleTokenizer
from oxrl.data.types import Example, PackedBatch, pack
from oxrl.loops.rl_update import score_logprobs
from oxrl.rollout.base import SamplingParams
from oxrl.rollout.hf import HFEngine
from tests.vlm_fixtures import SAVERS, shape_image

# Sizes give different grids (Qwen2-VL: 4, 6 and 8 image tokens), so a position off by one image shows.
IMAGES = [("red", "circle", (56, 56)), ("blue", "square", (84, 56)), ("green", "circle", (56, 112))]


@pytest.fixture(scope="module", params=list(SAVERS))
def vlm(request, tmp_path_factory, smollm2_tokenizer):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = SAVERS[request.param](tmp_path_factory.mktemp(request.param), smollm2_tokenizer)
    return request.param, AutoModelForImageTextToText.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)


def image(i: int):
    colour, shape, size = IMAGES[i]
    return shape_image(colour, shape, size, seed=i)


def question(i: int) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour" + "?" * (i + 1)}]}]


def image_examples(processor) -> list[Example]:
    rows = ExampleTokenizer(processor.tokenizer, processor)
    return [Example([rows.sequence(Chat(question(i) + [{"role": "assistant", "content": f"It is {IMAGES[i][0]}."}], 1),
                                   location="test", row=i, images=[image(i)])]) for i in range(len(IMAGES))]


def own_forward_logprobs(model, example: Example) -> torch.Tensor:
    """Log-probs of the trained tokens from the model's own unpacked forward (it places image tokens and computes
    positions itself), the reference the packed row must equal."""
    (sequence,) = example.sequences
    ids = torch.tensor([sequence.input_ids])
    extra = dict(sequence.vision.tensors)
    image_tokens = (ids == model.config.image_token_id).long()  # as the processors mark them
    if hasattr(model.model, "get_rope_index"):  # multimodal RoPE: the model places image tokens by type
        extra["mm_token_type_ids"] = image_tokens
    if model.config.model_type == "gemma3":  # two-way attention among an image's tokens
        extra["token_type_ids"] = image_tokens
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **extra).logits[0].float()
    chosen = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return torch.cat([torch.zeros(1), chosen]) * torch.tensor(sequence.loss_mask)


def text_example(processor) -> Example:
    return Example([ExampleTokenizer(processor.tokenizer, processor).sequence(
        Chat([{"role": "user", "content": "No image here."}, {"role": "assistant", "content": "Fine."}], 1),
        location="test", row=9)])


@torch.no_grad()
def test_a_packed_row_of_image_sequences_equals_each_sequence_alone(vlm):
    family, model, processor = vlm
    examples = image_examples(processor)
    text_only = text_example(processor)
    packed = token_logprobs(model, pack(examples + [text_only]))
    alone = torch.cat([token_logprobs(model, pack([e])) for e in examples + [text_only]])
    own = torch.cat([own_forward_logprobs(model, e) for e in examples])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[: own.numel()], own, atol=1e-5, rtol=0)
    assert pack(examples).vision.keys() == examples[0].sequences[0].vision.tensors.keys()


def test_the_language_model_of_a_causal_family_runs_the_packed_kernel_alike(vlm, monkeypatch):
    """Qwen2-VL's and Idefics3's language models take oxRL's packed kernel (each sequence attends to itself, no T x T
    mask: the dozens of turns of a VLA episode in one row stay linear in memory) and give sdpa's log-probs and
    gradients on a packed image row; their vision towers keep their attention; Gemma 3 (two-way attention among an
    image's tokens) keeps sdpa."""
    import copy

    from oxrl.models import packed_attention

    family, model, processor = vlm
    kernel = copy.deepcopy(model)
    assert packed_attention.use_packed_attention(kernel) == (family != "gemma3")
    if family == "gemma3":
        return
    assert kernel.config.vision_config._attn_implementation == model.config.vision_config._attn_implementation
    assert not packed_attention.prefix_sharing(kernel)  # a group's continuations do not share its image prompt
    rows, per_sequence = [], packed_attention.per_sequence_sdpa

    def spied(query, key, value, row, *rest):
        rows.append(row)
        return per_sequence(query, key, value, row, *rest)

    monkeypatch.setattr(packed_attention, "per_sequence_sdpa", spied)
    batch = pack(image_examples(processor) + [text_example(processor)])
    results = []
    for each in (model, kernel):
        each.zero_grad()
        logprobs = token_logprobs(each, batch)
        logprobs.sum().backward()
        results.append([logprobs.detach(), *(p.grad for p in each.parameters() if p.grad is not None)])
    model.zero_grad()
    assert len(rows) == kernel.config.get_text_config().num_hidden_layers  # the kernel ran in every layer
    assert all(len(row.segments) == 4 for row in rows)  # each sequence apart
    assert len(results[0]) == len(results[1]) > 2
    for sdpa, ours in zip(*results):
        torch.testing.assert_close(ours, sdpa, atol=1e-5, rtol=1e-4)


def test_chunked_logprobs_of_an_image_row_equal_the_full_logits(vlm, monkeypatch):
    """Long rows' log-probs come from hidden states through the output layer a chunk at a time (lm_head.py): the same
    values and gradients on a packed image row, and on Gemma 3's padded batch."""
    family, model, processor = vlm
    batch = pack(image_examples(processor) + [text_example(processor)])
    vocab = model.config.get_text_config().vocab_size
    results = []
    for full_elements in (2**40, 0):
        monkeypatch.setattr(lm_head, "FULL_LOGITS_ELEMENTS", full_elements)
        monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 2 * vocab)
        model.zero_grad()
        logprobs, entropy = token_logprobs(model, batch, with_entropy=True)
        (logprobs.sum() + entropy.sum()).backward()
        results.append((logprobs.detach(), entropy.detach(),
                        *(p.grad.clone() for p in model.parameters() if p.grad is not None)))
    assert len(results[0]) == len(results[1]) > 2
    for full, chunked in zip(*results):  # fp32 sums in another order: within 2e-5 of each tensor's largest entry
        assert float((chunked - full).abs().max()) <= 2e-5 * float(full.abs().max()) + 1e-6
    model.zero_grad()


@torch.no_grad()
def test_a_packed_row_needs_its_family_inputs(vlm):
    """Mutation check of the test above: what a text model's packed row gets (restarting 1-D positions, one row) is
    wrong for Qwen2-VL, whose image tokens and the text after them have 3-D positions, and for Gemma 3, whose image
    tokens attend to each other both ways (oxRL runs its rows as padded batches)."""
    family, model, processor = vlm
    if family == "idefics3":
        pytest.skip("a text model's inputs are right for this family")
    batch = pack([text_example(processor)] + image_examples(processor))
    right = token_logprobs(model, batch)
    types = {"token_type_ids": (batch.input_ids == model.config.image_token_id).long()} if family == "gemma3" else {}
    plain = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False, **batch.vision,
                  **types).logits[0]
    wrong = torch.log_softmax(plain[:-1].float(), -1).gather(-1, batch.input_ids[0, 1:, None])[:, 0]
    mask = batch.loss_mask[0, 1:]
    assert (wrong[mask] - right[1:][mask]).abs().max() > 1e-3


@torch.no_grad()
def test_engine_logprobs_equal_trainer_logprobs_on_image_prompts(vlm):
    family, model, processor = vlm
    prompts = [RLPrompt(messages=question(i), images=[image(i)]) for i in range(len(IMAGES))]
    prompts.append(RLPrompt(messages=[{"role": "user", "content": "A text prompt."}]))
    batch = encode_prompts(prompts, processor.tokenizer, processor=processor)
    assert batch.vision is not None and batch.vision[-1] is None and len(batch.vision) == 4
    tower = next(getattr(model.model, name) for name in ("visual", "vision_model", "vision_tower")
                 if hasattr(model.model, name))
    encoded = []  # the vision tower's calls: the 3 prompts' images are encoded once, in the shared prefill
    hook = tower.register_forward_hook(lambda module, args, out: encoded.append(1))
    torch.manual_seed(0)
    completions = HFEngine(model, processor.tokenizer).generate(batch.prompt_ids, SamplingParams(n=3, max_new_tokens=6),
                                                                 batch.vision)
    hook.remove()
    assert len(encoded) == 1
    assert [c.vision for c in completions] == [v for v in batch.vision for _ in range(3)]
    trainer = score_logprobs(model, completions, micro_size=4, temperature=1.0)
    gap = max(float((torch.tensor(c.logprobs) - t).abs().max()) for c, t in zip(completions, trainer))
    assert gap < 1e-4  # measured: ~1e-6 on both families (fp32)
    # One sample per prompt: no prefix to share, `generate` encodes the images itself.
    single = HFEngine(model, processor.tokenizer).generate(batch.prompt_ids, SamplingParams(n=1, max_new_tokens=6),
                                                            batch.vision)
    trainer = score_logprobs(model, single, micro_size=4, temperature=1.0)
    assert max(float((torch.tensor(c.logprobs) - t).abs().max()) for c, t in zip(single, trainer)) < 1e-4


@torch.no_grad()
def test_a_bf16_copy_samples_image_prompts_close_to_the_trainer(vlm):
    """The `hf` engine's bf16 copy (eager attention on CPU) decodes image prompts; its log-probs stay within bf16
    rounding of the fp32 trainer's."""
    family, model, processor = vlm
    prompts = [RLPrompt(messages=question(i), images=[image(i)]) for i in range(len(IMAGES))]
    batch = encode_prompts(prompts, processor.tokenizer, processor=processor)
    torch.manual_seed(0)
    completions = HFEngine(model, processor.tokenizer, sample_in_bf16=True).generate(
        batch.prompt_ids, SamplingParams(n=2, max_new_tokens=6), batch.vision)
    trainer = score_logprobs(model, completions, micro_size=4, temperature=1.0)
    gap = torch.cat([torch.tensor(c.logprobs) - t for c, t in zip(completions, trainer)]).abs()
    assert 0 < gap.mean() < 0.1, (family, gap)  # bf16 rounding: not zero (it is the copy), not a different network


def test_image_prompts_render_with_their_expanded_image_tokens(vlm):
    family, model, processor = vlm
    batch = encode_prompts([RLPrompt(messages=question(i), images=[image(i)]) for i in range(len(IMAGES))],
                           processor.tokenizer, processor=processor)
    image_token = model.config.image_token_id
    counts = [ids.count(image_token) for ids in batch.prompt_ids]
    if family == "qwen2_vl":  # 14-pixel patches merged 2x2: a 56x56 image is 2x2 tokens, 84x56 3x2, 56x112 2x4
        assert counts == [4, 6, 8]
        assert [v.tensors["image_grid_thw"].tolist() for v in batch.vision] == [[[1, 4, 4]], [[1, 4, 6]], [[1, 8, 4]]]
    else:  # Idefics3 and Gemma 3 resize every image to 56 pixels, 4 image tokens each
        assert counts == [4, 4, 4]
    assert batch.prompt_texts == ["What colour?", "What colour??", "What colour???"]


def test_a_row_with_images_for_a_text_model_is_refused(smollm2_tokenizer):
    rows = ExampleTokenizer(smollm2_tokenizer)
    with pytest.raises(DataError, match=r"data.jsonl, row 3, field 'images'.*not a vision-language model"):
        rows.sequence(Chat(question(0) + [{"role": "assistant", "content": "red"}], 1), location="data.jsonl", row=3,
                      images=[image(0)])


def test_a_too_long_row_with_images_is_skipped_not_cut(vlm):
    from oxrl.data.tokenize import TOO_LONG, truncate

    family, model, processor = vlm
    example = image_examples(processor)[0]
    for policy in ("right", "left", "drop"):
        assert truncate(example, 8, policy, location="data.jsonl") == (None, TOO_LONG)
    assert isinstance(pack([example]), PackedBatch)
