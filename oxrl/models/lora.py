"""LoRA adapters through peft."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oxrl.config.schema import LoraConfig


def language_model_name(model) -> str | None:
    """The qualified module name of a vision-language model's language model (`model.language_model` in Qwen2-VL,
    `model.text_model` in Idefics3), found through transformers' public `get_decoder()`; None for a model without a
    vision tower (`vision_config`)."""
    if getattr(model.config, "vision_config", None) is None:
        return None
    decoder = model.get_decoder()
    if decoder is model or decoder is model.base_model:
        raise ValueError(f"{type(model).__name__}: cannot tell its language model from its vision tower "
                         "(transformers' get_decoder() gives the whole model)")
    return next(name for name, module in model.named_modules() if module is decoder)


def lora_target_modules(model, target_modules: list[str] | str) -> list[str] | str:
    """peft's `target_modules` for a model: an explicit list as given; `all-linear` too for a causal LM (peft then
    adapts every linear layer but the output head). A vision-language model's `all-linear` is the linear layers of its
    language model only: peft's own would adapt the vision tower and the projector as well."""
    prefix = language_model_name(model) if target_modules == "all-linear" else None
    if prefix is None:
        return target_modules
    return sorted(name for name, module in model.named_modules()
                  if name.startswith(prefix + ".") and isinstance(module, torch.nn.Linear))


def add_lora(model, cfg: LoraConfig, gradient_checkpointing: bool = False):
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_config = PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=lora_target_modules(model, cfg.target_modules),
        task_type="CAUSAL_LM",
    )
    if gradient_checkpointing:
        # Frozen embeddings give checkpointed blocks inputs without grad; peft's hook fixes that.
        model.enable_input_require_grads()
    return get_peft_model(model, peft_config)


# The prefix under which a PeftModel's own state dict names the base model's tensors.
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoraMerge:
    """How one LoRA layer's adapters fold into its base weight: W + sum over adapters of (B @ A) * scaling."""

    scalings: dict[str, float]  # active adapter -> its scaling (alpha / r, or peft's per-layer value)
    fan_in_fan_out: bool = False  # the base weight is stored (in, out), as in GPT-2's Conv1D: transpose the delta


def lora_layers(model) -> dict[str, LoraMerge]:
    """{layer name under the base model: its merge} for every LoRA layer of a peft `model` whose delta is not in
    its base weight already; raises `NotImplementedError` for adapters that cannot be merged on the fly."""
    from peft.tuners.lora import LoraLayer

    layers = {}
    for name, module in model.get_base_model().named_modules():
        if not isinstance(module, LoraLayer) or module.merged or module.disable_adapters:
            continue  # a merged layer's base weight already holds its delta
        base_layer = module.get_base_layer()
        if not isinstance(getattr(base_layer, "weight", None), torch.Tensor):
            # e.g. Qwen3-MoE's fused experts: peft adapts their 3-D parameters through a wrapper with no `.weight`.
            raise NotImplementedError(
                f"{name}: LoRA on {type(base_layer).__name__} (fused parameters, no single weight) cannot be merged on the "
                "fly, which the vLLM weight sync needs: use rollout.engine `hf`, or name lora.target_modules without it")
        scalings = {}
        for adapter in module.active_adapters:
            if adapter not in module.lora_A:
                continue
            if module.use_dora.get(adapter) or getattr(module, "lora_variant", {}).get(adapter) is not None:
                raise NotImplementedError(f"{name}: only plain LoRA adapters can be merged on the fly (not DoRA or other variants)")
            if getattr(module, "lora_bias", {}).get(adapter):
                raise NotImplementedError(f"{name}: LoRA adapters with a bias (`lora_bias`) are not supported")
            scalings[adapter] = float(module.scaling[adapter])
        layers[name] = LoraMerge(scalings, bool(getattr(module, "fan_in_fan_out", False)))
    return layers


def merge_lora(state: dict[str, torch.Tensor], layers: dict[str, LoraMerge]) -> dict[str, torch.Tensor]:
    """A peft LoRA model's full state dict (names under the base model: `...q_proj.base_layer.weight`,
    `...q_proj.lora_A.<adapter>.weight`) as the base model's own (`...q_proj.weight`), each LoRA layer's
    weight computed as peft's `get_delta_weight` does: W + (B [out, r] @ A [r, in]) * scaling (the delta
    in fp32, then cast to W's dtype). New tensors only: the input dict and its tensors are untouched.
    The one home of the merge maths, whether the tensors are the live model's (`merged_state_dict`) or
    gathered from shards (the sharded strategies' `policy_state_dict` and merged HF folders)."""
    merged = {}
    for key, tensor in state.items():
        if ".lora_" in key:
            if ".lora_embedding_" in key or ".lora_magnitude_vector" in key:
                raise NotImplementedError(f"{key}: only LoRA on linear layers can be merged on the fly")
            continue  # lora_A / lora_B: folded into their layer's weight below
        if ".modules_to_save." in key or ".original_module." in key:
            raise NotImplementedError(f"{key}: peft `modules_to_save` copies are not supported")
        name = key.replace(".base_layer.", ".")
        layer = name.removesuffix(".weight")
        if name.endswith(".weight") and layer in layers:
            tensor = tensor.detach()
            for adapter, scaling in layers[layer].scalings.items():
                delta = state[f"{layer}.lora_B.{adapter}.weight"].float() @ state[f"{layer}.lora_A.{adapter}.weight"].float()
                if layers[layer].fan_in_fan_out:
                    delta = delta.T
                tensor = tensor + (delta * scaling).to(tensor.dtype)
        merged[name] = tensor.detach()
    return merged


def merged_state_dict(model, full_state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The weights a peft LoRA model computes with, under the base model's own (Hugging Face) names.

    From the live tensors, or from `full_state`, the peft model's own full state dict (names
    `base_model.model.…`, e.g. gathered from shards by a sharded strategy). Each LoRA layer's weight
    becomes base + B @ A * scaling (`merge_lora`), computed into new tensors: the live model, its
    adapters and its optimizer state are untouched, and there is no merge/unmerge round trip to leave
    rounding error in the base weights. A rollout engine that loads this dict samples from exactly the
    policy being trained.
    """
    layers = lora_layers(model)
    if full_state is None:
        state = model.get_base_model().state_dict()
    else:
        state = {key.removeprefix(PEFT_PREFIX): tensor for key, tensor in full_state.items()}
    return merge_lora(state, layers)
