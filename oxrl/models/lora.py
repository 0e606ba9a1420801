"""LoRA adapters through peft."""

from __future__ import annotations

import torch

from oxrl.config.schema import LoraConfig


def add_lora(model, cfg: LoraConfig, gradient_checkpointing: bool = False):
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_config = PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules,
        task_type="CAUSAL_LM",
    )
    if gradient_checkpointing:
        # Frozen embeddings give checkpointed blocks inputs without grad; peft's hook fixes that.
        model.enable_input_require_grads()
    return get_peft_model(model, peft_config)


def is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def merged_state_dict(model) -> dict:
    """The weights a peft LoRA model computes with, under the base model's own (Hugging Face) names.

    Each LoRA layer's weight becomes base + B @ A * scaling (peft's `get_delta_weight`), computed into
    new tensors: the live model, its adapters and its optimizer state are untouched, and there is no
    merge/unmerge round trip to leave rounding error in the base weights. A rollout engine that loads
    this dict samples from exactly the policy being trained.
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer) or module.merged or module.disable_adapters:
            continue  # a merged layer's base weight already holds its delta
        base_layer = module.get_base_layer()
        if not isinstance(getattr(base_layer, "weight", None), torch.Tensor):
            # e.g. Qwen3-MoE's fused experts: peft adapts their 3-D parameters through a wrapper with no `.weight`.
            raise NotImplementedError(
                f"{name}: LoRA on {type(base_layer).__name__} (fused parameters, no single weight) cannot be merged on the "
                "fly, which the vLLM weight sync needs: use rollout.engine `hf`, or name lora.target_modules without it")
        weight = base_layer.weight.detach()
        for adapter in module.active_adapters:
            if adapter not in module.lora_A:
                continue
            if module.use_dora.get(adapter) or getattr(module, "lora_variant", {}).get(adapter) is not None:
                raise NotImplementedError(f"{name}: only plain LoRA adapters can be merged on the fly (not DoRA or other variants)")
            if getattr(module, "lora_bias", {}).get(adapter):
                raise NotImplementedError(f"{name}: LoRA adapters with a bias (`lora_bias`) are not supported")
            weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
        merged[f"{name}.weight"] = weight
    state = {}
    for key, tensor in base.state_dict().items():
        if ".lora_" in key:
            continue  # lora_A / lora_B / lora_embedding_*: folded in above
        if ".modules_to_save." in key or ".original_module." in key:
            raise NotImplementedError(f"{key}: peft `modules_to_save` copies are not supported")
        key = key.replace(".base_layer.", ".")
        state[key] = merged.get(key, tensor.detach())
    return state
