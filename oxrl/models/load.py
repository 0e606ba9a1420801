"""Load a model and its tokenizer from a hub id, a local HF folder, a .gguf file or a bundled alias."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from oxrl.config.schema import LoraConfig, ModelConfig
from oxrl.models.bundled import BUNDLED, resolve_bundled
from oxrl.models.packed_attention import use_packed_attention

logger = logging.getLogger(__name__)


class ModelNotFoundError(FileNotFoundError):
    pass


@dataclass
class ModelSource:
    path: str  # folder or hub id handed to from_pretrained
    gguf_file: str | None = None


def resolve_source(name_or_path: str) -> ModelSource:
    if name_or_path in BUNDLED:
        return ModelSource(str(resolve_bundled(name_or_path)))
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {path}")
        return ModelSource(str(path.parent), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ModelNotFoundError(f"{path} is a folder but holds no config.json: not a Hugging Face model folder")
        return ModelSource(str(path))
    if path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ModelNotFoundError(f"model path not found: {path}")
    return ModelSource(name_or_path)  # a hub id


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def from_pretrained_or_explain(loader, source: ModelSource, what: str, **kwargs):
    """Call a transformers loader, turning 'not cached and no network' into a clear message."""
    try:
        return loader.from_pretrained(source.path, gguf_file=source.gguf_file, **kwargs)
    except OSError as error:
        if Path(source.path).exists():
            raise
        raise ModelNotFoundError(
            f"{what} `{source.path}` is not a local folder, file or bundled alias "
            f"({', '.join(BUNDLED)}), and could not be fetched from the Hugging Face hub "
            f"(not found locally, no network?): {error}"
        ) from error


def load_tokenizer(cfg: ModelConfig):
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


PACKED_CHOICES = ("auto", "packed_sdpa")


def hf_attn_implementation(name: str) -> str | None:
    """What transformers is asked to load with: our packed kernel is switched on after loading.
    For it, transformers' own default (None): sdpa, or eager for a model without an sdpa path
    (Gemma 2, whose attention logit soft-capping sdpa cannot apply)."""
    return None if name in PACKED_CHOICES else name


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


def load_model(cfg: ModelConfig, device: torch.device, lora: LoraConfig | None = None):
    """A causal LM on `device` in the configured dtype, with LoRA adapters when enabled."""
    from transformers import AutoModelForCausalLM

    source = resolve_source(cfg.name_or_path)
    dtype = resolve_dtype(cfg.dtype, device)
    model = from_pretrained_or_explain(
        AutoModelForCausalLM,
        source,
        "model",
        dtype=dtype,
        attn_implementation=hf_attn_implementation(cfg.attn_implementation),
        trust_remote_code=cfg.trust_remote_code,
        revision=cfg.revision,
        use_safetensors=None if source.gguf_file else True,
    )
    refuse_sequence_mixing_layers(model.config)
    model.to(device)
    if cfg.attn_implementation in PACKED_CHOICES:
        use_packed_attention(model)  # after .to(device): it declines on CUDA
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
    if lora is not None and lora.enabled:
        from oxrl.models.lora import add_lora

        model = add_lora(model, lora, cfg.gradient_checkpointing)
    logger.info("loaded %s (%s, %.1fM parameters)", cfg.name_or_path, dtype, sum(p.numel() for p in model.parameters()) / 1e6)
    return model
