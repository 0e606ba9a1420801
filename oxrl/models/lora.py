"""LoRA adapters through peft."""

from __future__ import annotations

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
