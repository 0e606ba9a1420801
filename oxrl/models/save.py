"""Save a model as a Hugging Face folder (safetensors + config + tokenizer)."""

from __future__ import annotations

import copy
from pathlib import Path

from oxrl.models.lora import is_peft


def save_hf_folder(model, tokenizer, out_dir: str | Path, lora_save: str = "merged") -> Path:
    """Write a folder that `AutoModelForCausalLM.from_pretrained` loads.

    With LoRA, `merged` folds the adapters into a copy of the weights (the live model keeps
    training its adapters) and `adapter` writes only the peft adapter (load it with peft).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    to_save = model
    if is_peft(model) and lora_save == "merged":
        to_save = copy.deepcopy(model).merge_and_unload()
    to_save.save_pretrained(out_dir, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
