"""Load a model and its tokenizer from a hub id, a local HF folder, a .gguf file or a bundled alias
(oxrl/models/source.py tells which).

A vision-language model (VLM: a vision tower and a projector feeding a causal language model) loads with
`AutoModelForImageTextToText`, and its processor (image processor + tokenizer) with `load_processor`; every other
model is a causal LM (`AutoModelForCausalLM`)."""

from __future__ import annotations

import logging

import torch

from oxrl.models.model_inputs import PADDED_FAMILIES
from oxrl.config.schema import LoraConfig, ModelConfig
from oxrl.models.packed_attention import use_packed_attention
from oxrl.models.source import from_pretrained_or_explain, resolve_source

logger = logging.getLogger(__name__)


def is_peft(model) -> bool:
    """Whether `model` is wrapped by peft: what `load_model` returns with lora.enabled (oxrl/models/lora.py)."""
    return hasattr(model, "peft_config")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def load_config(cfg: ModelConfig):
    """The model's transformers config, read before (and without) its weights."""
    from transformers import AutoConfig

    return from_pretrained_or_explain(AutoConfig, resolve_source(cfg.name_or_path), "model",
                                      trust_remote_code=cfg.trust_remote_code, revision=cfg.revision)


def is_vision_language(config) -> bool:
    """Whether `config` is a vision-language model's: one `AutoModelForImageTextToText` loads (a built-in class, or
    remote code that names that auto class) and that has a vision tower (`vision_config`)."""
    from transformers import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    image_text_to_text = (type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING
                          or "AutoModelForImageTextToText" in (getattr(config, "auto_map", None) or {}))
    return image_text_to_text and getattr(config, "vision_config", None) is not None


def load_tokenizer(cfg: ModelConfig):
    """The tokenizer (for a VLM too: the one its processor wraps, see `load_processor`), its pad token the EOS
    token when it has none."""
    from transformers import AutoTokenizer

    source = resolve_source(cfg.tokenizer or cfg.name_or_path)
    tokenizer = from_pretrained_or_explain(
        AutoTokenizer, source, "tokenizer", trust_remote_code=cfg.trust_remote_code, revision=cfg.revision
    )
    if cfg.chat_template is not None:
        tokenizer.chat_template = cfg.chat_template
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_processor(cfg: ModelConfig, tokenizer=None):
    """A vision-language model's processor (image processor + tokenizer, oxrl/models/processor.py), None for a text
    model.

    It wraps `tokenizer` (by default `load_tokenizer(cfg)`'s, so the pad-token rule, `cfg.tokenizer` and
    `cfg.chat_template` apply), so that `processor.tokenizer is tokenizer`: nothing is loaded twice and the
    processor and the rest of oxRL tokenize alike."""
    if not is_vision_language(load_config(cfg)):
        return None
    from oxrl.models.processor import vision_language_processor

    return vision_language_processor(cfg, tokenizer if tokenizer is not None else load_tokenizer(cfg))


PACKED_CHOICES = ("auto", "packed_sdpa")


def hf_attn_implementation(name: str) -> str | None:
    """What transformers is asked to load with: our packed kernel is switched on after loading.
    For it, transformers' own default (None): sdpa, or eager for a model without an sdpa path
    (Gemma 2, whose attention logit soft-capping sdpa cannot apply)."""
    return None if name in PACKED_CHOICES else name


# The parts of a Llama-style decoder layer that hold only elementwise work around matmuls: no packed-row layout, no
# cache, so compiling them never specialises on a batch's sequence boundaries.
COMPILED_BLOCK_PARTS = ("mlp", "input_layernorm", "post_attention_layernorm")


def compile_blocks(model) -> int:
    """Compile each decoder layer's MLP and norms in place (`nn.Module.compile`, "regional compilation"): in eager
    mode their casts, SiLU and RMSNorm steps are a kernel each (elementwise kernels were half of an SFT step's GPU
    time at 16k tokens on an H200, docs/benchmarks.md). Shapes are dynamic, so rows of other lengths reuse the
    compiled code. Runs before LoRA wraps the projections (the compiled modules trace through the wrappers). Returns
    how many modules were compiled; a model without a `model.layers` stack (not Llama-style) is an error."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"model.compile_blocks: {type(model).__name__} has no `model.layers` decoder stack to compile; "
                         "set model.compile_blocks=false")
    parts = [getattr(layer, name) for layer in layers for name in COMPILED_BLOCK_PARTS if hasattr(layer, name)]
    for part in parts:
        part.compile(dynamic=True)
    logger.info("compiling %d MLP and norm modules of the decoder layers", len(parts))
    return len(parts)


def enable_activation_checkpointing(model) -> None:
    """Recompute activations in backward (non-reentrant, so frozen inputs and LoRA work)."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


# Layer kinds that attend to their own sequence only, given a packed row's position ids; any other kind
# (linear attention, state-space, convolution) carries state from one packed sequence into the next.
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
# Recurrent / state-space families whose configs name no `layer_types`.
RECURRENT_MODEL_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba", "jamba", "bamba", "zamba", "zamba2", "falcon_h1",
                                   "granitemoehybrid", "nemotron_h", "recurrent_gemma", "rwkv", "lfm2", "xlstm"})


class UnsupportedModelError(ValueError):
    pass


def refuse_sequence_mixing_layers(config) -> None:
    """oxRL trains on packed rows (several sequences end to end); a layer that is not attention would read
    one sequence's state into the next, silently. Such a model is refused by name and layer kind."""
    kinds = set(getattr(config, "layer_types", None) or ()) - ATTENTION_LAYER_TYPES
    if kinds or config.model_type in RECURRENT_MODEL_TYPES:
        what = ", ".join(sorted(kinds)) if kinds else "recurrent / state-space"
        raise UnsupportedModelError(
            f"{config.model_type}: its {what} layers would carry state from one packed sequence into the next, and "
            "oxRL trains on packed rows; models with such layers are not supported yet (attention-only models are)")


# Vision-language families whose attention oxRL does not reproduce: neither a packed row's positions nor the padded
# batches of `oxrl.models.model_inputs.PADDED_FAMILIES` (Gemma 3) give their masks.
UNPACKABLE_VISION_FAMILIES = {
    "paligemma": "its whole prompt attends both ways (prefix-LM)",
    "mllama": "its images enter through cross-attention layers with their own mask",
}


def refuse_unpackable_vision(config) -> None:
    """Refuse, by name and reason, a vision-language family that oxRL's packed rows would compute wrongly."""
    reason = UNPACKABLE_VISION_FAMILIES.get(config.model_type)
    if reason is not None:
        raise UnsupportedModelError(
            f"{config.model_type}: {reason}, which packed rows (several sequences end to end, attention from their "
            "positions) do not reproduce; this vision-language family is not supported yet (Qwen2-VL, Qwen2.5-VL, "
            "Qwen3-VL, Idefics3 / SmolVLM and Gemma 3 are)")


def freeze_vision_tower(model) -> int:
    """Freeze every parameter of a vision-language model outside its language model and output head (the vision
    tower and the projector); the number of parameters it froze."""
    from oxrl.models.lora import language_model_name

    language_model = model.get_submodule(language_model_name(model))
    keep = {id(p) for p in language_model.parameters()} | {id(p) for p in model.get_output_embeddings().parameters()}
    frozen = 0
    for parameter in model.parameters():
        if id(parameter) not in keep and parameter.requires_grad:
            parameter.requires_grad_(False)
            frozen += parameter.numel()
    return frozen


def refuse_oversized_weights(config, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
    """A ModelTooLargeError before the weights are allocated, when they alone (counted from `config` on the meta
    device: oxrl/models/shape.py) are more than `device`'s memory, unless `cfg.allow_oversized`."""
    from oxrl.models.hardware import device_memory
    from oxrl.models.memory import refuse_oversized
    from oxrl.models.shape import ModelShape, ModelTooLargeError

    if cfg.allow_oversized:
        return
    try:
        shape = ModelShape.from_config(config.get_text_config(decoder=True), cfg.trust_remote_code)
    except ModelTooLargeError as error:
        raise ModelTooLargeError(f"{cfg.name_or_path}: {error}") from None
    except ValueError as error:  # a family the meta build cannot make alone; the load itself will tell
        # (the first line: transformers lists every class it knows after it)
        logger.info("%s: size not counted before loading (%s)", cfg.name_or_path, str(error).partition("\n")[0])
        return
    refuse_oversized(shape.parameters * dtype.itemsize, device_memory(device),
                     f"{cfg.name_or_path}: its {shape.parameters:,} parameters (counted from its config) in "
                     f"{str(dtype).removeprefix('torch.')} take",
                     "Choose a smaller model, a larger device or a smaller model.dtype")


def load_model(cfg: ModelConfig, device: torch.device, lora: LoraConfig | None = None):
    """A causal LM (or a vision-language model: `is_vision_language`) on `device` in the configured dtype, its
    vision tower and projector frozen when `cfg.freeze_vision`, with LoRA adapters when enabled. Refused before
    any weight is allocated when the weights alone would not fit the device (`refuse_oversized_weights`)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from oxrl.models.weights import refuse_mismatched, warn_ignored_auto_map

    source = resolve_source(cfg.name_or_path)
    config = load_config(cfg)
    if not cfg.trust_remote_code:
        warn_ignored_auto_map(config, cfg.name_or_path)
    vision_language = is_vision_language(config)
    refuse_sequence_mixing_layers(config.get_text_config(decoder=True))  # before the weights load
    refuse_unpackable_vision(config)
    if cfg.freeze_vision and not vision_language:
        raise ValueError(f"model.freeze_vision is set but {cfg.name_or_path} is not a vision-language model")
    dtype = resolve_dtype(cfg.dtype, device)
    refuse_oversized_weights(config, cfg, device, dtype)
    model, loading_info = from_pretrained_or_explain(
        AutoModelForImageTextToText if vision_language else AutoModelForCausalLM,
        source,
        "model",
        dtype=dtype,
        attn_implementation=hf_attn_implementation(cfg.attn_implementation),
        trust_remote_code=cfg.trust_remote_code,
        revision=cfg.revision,
        use_safetensors=None if source.gguf_file else True,
        ignore_mismatched_sizes=True,  # reported by `refuse_mismatched`, naming the tensors, not a bare RuntimeError
        output_loading_info=True,
    )
    refuse_mismatched(loading_info, cfg.name_or_path)
    model.to(device)
    if cfg.attn_implementation in PACKED_CHOICES:
        use_packed_attention(model)  # after .to(device); it declines where the kernel does not apply
    if cfg.freeze_vision:
        logger.info("froze the vision tower and projector of %s (%.1fM parameters)", cfg.name_or_path,
                    freeze_vision_tower(model) / 1e6)
    if cfg.compile_blocks:
        compile_blocks(model)
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
    if lora is not None and lora.enabled:
        from oxrl.models.lora import add_lora

        model = add_lora(model, lora, cfg.gradient_checkpointing)
    logger.info("loaded %s (%s%s, %.1fM parameters)", cfg.name_or_path, dtype,
                ", vision-language" if vision_language else "", sum(p.numel() for p in model.parameters()) / 1e6)
    if config.model_type in PADDED_FAMILIES:
        logger.info("%s: its image tokens attend to each other both ways, which packed rows cannot give; its micro-batches "
                    "run as padded batches (they compute on padding too)", config.model_type)
    return model
