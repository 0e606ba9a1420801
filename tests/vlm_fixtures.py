"""Tiny random vision-language models built from configs, saved as Hugging Face folders with their processor,
and images drawn with PIL: what the VLM tests train on (no download).

Two families, because they differ where VLM code goes wrong:
* Qwen2-VL: a variable number of image tokens per image (its grid), multimodal RoPE (3-D position ids computed
  from the grid), flat `pixel_values` [patches, features] with `image_grid_thw` [images, 3].
* Idefics3 (SmolVLM's architecture): a fixed block of image tokens between marker tokens, 1-D positions,
  `pixel_values` [batch, images, channels, height, width] with a `pixel_attention_mask`.

* Gemma 3: image tokens attend to each other both ways (the model builds that mask from `token_type_ids`), a
  fixed block of image tokens, 1-D positions, `pixel_values` [images, channels, height, width].

All use SmolLM2's tokenizer with the families' image tokens added, and a ChatML template whose content parts
may be `{"type": "image"}`.

Qwen2-VL's processor takes a video processor too, which needs torchvision (not installed on a CPU-only machine);
`ImageOnlyQwen2VLProcessor` is the same processor without the video half, registered with `AutoProcessor` so that
the saved folder loads back.
"""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image, ImageDraw
from transformers import (AutoProcessor, Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor,
                          Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor, Qwen2VLConfig,
                          Qwen2VLForConditionalGeneration, Qwen2VLProcessor)
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.processing_utils import ProcessorMixin


def chatml_template(image_text: str) -> str:
    """ChatML where a content part `{"type": "image"}` renders as `image_text`."""
    return ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
            "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
            "{% for part in message['content'] %}{% if part['type'] == 'image' %}" + image_text +
            "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """Qwen2-VL's processor without its video processor (which needs torchvision)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


AutoProcessor.register(Qwen2VLConfig, ImageOnlyQwen2VLProcessor, exist_ok=True)

# Text and vision widths: "tiny" (heads of 8) for the transformers tests, "vllm" (heads of 32, which vLLM's CPU
# attention has kernels for) for the vLLM tier.
WIDTHS = {"tiny": dict(hidden=32, heads=4, kv_heads=2), "vllm": dict(hidden=64, heads=2, kv_heads=1)}


def _text(width: str) -> dict:
    w = WIDTHS[width]
    return dict(hidden_size=w["hidden"], intermediate_size=2 * w["hidden"], num_hidden_layers=2,
                num_attention_heads=w["heads"], num_key_value_heads=w["kv_heads"], max_position_embeddings=2048)


def _vision(width: str) -> dict:
    w = WIDTHS[width]
    return dict(hidden_size=w["hidden"], intermediate_size=2 * w["hidden"], num_hidden_layers=2,
                num_attention_heads=w["heads"], image_size=56, patch_size=14)


def _token_ids(tokenizer, tokens: list[str]) -> dict[str, int]:
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    return {token: tokenizer.convert_tokens_to_ids(token) for token in tokens}


def _special_ids(tokenizer) -> dict:
    return dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id)


def tiny_qwen2_vl(tokenizer, width: str = "tiny", seed: int = 0, digits: Path | None = None):
    """A 2-layer Qwen2-VL (2-layer vision tower, 14-pixel patches merged 2x2) and its processor: (model, processor).
    A 56x56 image becomes 16 patches and 4 image tokens. With `digits` (a SmolLM2 GGUF file) its digit tokens'
    embeddings take that pretrained model's geometry (`pretrained_digits`)."""
    tokenizer = _copy(tokenizer)
    ids = _token_ids(tokenizer, ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
    image_processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=112 * 112, patch_size=14, merge_size=2,
                                               temporal_patch_size=2)
    processor = ImageOnlyQwen2VLProcessor(image_processor, tokenizer,
                                          chat_template=chatml_template("<|vision_start|><|image_pad|><|vision_end|>"))
    text = _text(width)
    half = text["hidden_size"] // text["num_attention_heads"] // 2  # rotary frequencies: time, height, width
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tokenizer), rope_scaling={"type": "mrope", "mrope_section": [half // 2, half // 4, half // 4]},
                         **text, **_special_ids(tokenizer)),
        vision_config=dict(depth=2, embed_dim=text["hidden_size"], hidden_size=text["hidden_size"],
                           num_heads=text["num_attention_heads"], mlp_ratio=2, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, in_chans=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        **_special_ids(tokenizer))
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    if digits is not None:
        pretrained_digits(model, tokenizer, digits, seed)
    return model, processor


def pretrained_digits(model, tokenizer, gguf: Path, seed: int = 0) -> None:
    """Give the random `model`'s digit tokens "0".."9" the geometry of a pretrained model's embeddings of them, read
    from the GGUF file `gguf` (SmolLM2-135M's is ordered: its first principal component follows the digits' values):
    those 10 embeddings, centred, placed by a random rotation into this model's width around the random rows' mean,
    scaled to the random rows' mean pairwise distance. What a prompt's numbers mean to a pretrained backbone and not
    to a random one, with nothing else of the pretrained model."""
    ids = [tokenizer.convert_tokens_to_ids(str(digit)) for digit in range(10)]
    pretrained = gguf_embeddings(gguf, ids)
    centred = pretrained - pretrained.mean(0)
    u, s, _ = torch.linalg.svd(centred, full_matrices=False)
    coordinates = u * s  # [10, 10]: the same pairwise distances, in 10 numbers each
    weight = model.get_input_embeddings().weight
    if weight.shape[1] < coordinates.shape[1]:
        raise ValueError(f"pretrained_digits needs a width of at least 10, got {weight.shape[1]}")
    generator = torch.Generator().manual_seed(seed)
    rotation, _ = torch.linalg.qr(torch.randn(weight.shape[1], coordinates.shape[1], dtype=torch.float64,
                                              generator=generator))  # [width, 10], orthonormal columns
    placed = coordinates @ rotation.T
    random_rows = weight.detach()[ids].double()
    scale = torch.pdist(random_rows).mean() / torch.pdist(placed).mean()
    with torch.no_grad():
        weight[ids] = (random_rows.mean(0) + scale * placed).to(weight.dtype)


def gguf_embeddings(gguf: Path, ids: list[int]) -> torch.Tensor:
    """The token embeddings of `ids` [len(ids), width] stored in the GGUF file `gguf`, dequantised, in float64."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    (tensor,) = [t for t in GGUFReader(str(gguf)).tensors if t.name == "token_embd.weight"]
    return torch.tensor(dequantize(tensor.data, tensor.tensor_type)[ids], dtype=torch.float64)


def tiny_idefics3(tokenizer, width: str = "tiny", seed: int = 0):
    """A 2-layer Idefics3 (SmolVLM's architecture; 2-layer SigLIP tower, 56-pixel images, 4 image tokens each) and its
    processor: (model, processor)."""
    tokenizer = _copy(tokenizer)
    ids = _token_ids(tokenizer, ["<fake_token_around_image>", "<image>", "<global-img>"])
    image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": 56},
                                                max_image_size={"longest_edge": 56})
    processor = Idefics3Processor(image_processor, tokenizer, image_seq_len=4, chat_template=chatml_template("<image>"))
    config = Idefics3Config(
        text_config=dict(model_type="llama", vocab_size=len(tokenizer), **_text(width), **_special_ids(tokenizer)),
        vision_config=_vision(width), scale_factor=2, image_token_id=ids["<image>"], **_special_ids(tokenizer))
    torch.manual_seed(seed)
    return Idefics3ForConditionalGeneration(config), processor


def save_tiny_qwen2_vl(folder: Path, tokenizer, seed: int = 0, width: str = "tiny", digits: Path | None = None) -> Path:
    return _save(*tiny_qwen2_vl(tokenizer, width=width, seed=seed, digits=digits), folder)


def save_tiny_idefics3(folder: Path, tokenizer, seed: int = 0) -> Path:
    return _save(*tiny_idefics3(tokenizer, seed=seed), folder)


def save_tiny_gemma3(folder: Path, tokenizer, seed: int = 0) -> Path:
    """A 2-layer Gemma 3 (2-layer SigLIP tower, 56-pixel images pooled to 4 image tokens) with its processor, saved in
    `folder`. Its processor reads the image marker tokens from the tokenizer's named special tokens."""
    named = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tokenizer = _copy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": list(named.values())})
    tokenizer.save_pretrained(Path(folder) / "tokenizer")  # reloaded with its named special tokens
    tokenizer = type(tokenizer).from_pretrained(Path(folder) / "tokenizer", extra_special_tokens=named)
    processor = Gemma3Processor(Gemma3ImageProcessorPil(size={"height": 56, "width": 56}), tokenizer,
                                chat_template=chatml_template("<start_of_image>"), image_seq_length=4)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in named.values()}
    config = Gemma3Config(
        text_config=dict(vocab_size=len(tokenizer), head_dim=8, **_text("tiny"), **_special_ids(tokenizer)),
        vision_config=_vision("tiny"),
        mm_tokens_per_image=4, boi_token_index=ids["<start_of_image>"], eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"], **_special_ids(tokenizer))
    torch.manual_seed(seed)
    return _save(Gemma3ForConditionalGeneration(config), processor, folder)


SAVERS = {"qwen2_vl": save_tiny_qwen2_vl, "idefics3": save_tiny_idefics3, "gemma3": save_tiny_gemma3}


def _copy(tokenizer):
    import copy

    return copy.deepcopy(tokenizer)


def _save(model, processor, folder: Path) -> Path:
    folder = Path(folder)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


COLOURS = {"red": (220, 30, 30), "green": (30, 180, 30), "blue": (30, 60, 220), "yellow": (230, 210, 20)}
SHAPES = ("circle", "square")


def shape_image(colour: str, shape: str = "circle", size: tuple[int, int] = (56, 56), seed: int = 0) -> Image.Image:
    """A `colour` `shape` on a grey background, placed and sized by `seed` (so held-out images differ)."""
    import random

    rng = random.Random(seed)
    width, height = size
    image = Image.new("RGB", size, (128, 128, 128))
    side = rng.randint(min(size) // 2, min(size) - 4)
    left, top = rng.randint(0, width - side), rng.randint(0, height - side)
    box = (left, top, left + side, top + side)
    draw = ImageDraw.Draw(image)
    (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
    return image
