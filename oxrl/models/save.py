"""Save a model as a Hugging Face folder (safetensors + config + tokenizer, or a vision-language model's processor)."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

from oxrl.logging.quiet import no_progress_bars
from oxrl.models.load import is_peft, is_vision_language
from oxrl.models.value_head import value_head_of, without_value_head, write_value_head

logger = logging.getLogger(__name__)


def save_hf_folder(model, tokenizer, out_dir: str | Path, lora_save: str = "merged") -> Path:
    """Write a folder that `AutoModelForCausalLM.from_pretrained` loads (a vision-language model:
    `AutoModelForImageTextToText`).

    `tokenizer` is what writes the tokenizer files: the tokenizer, or for a vision-language model its processor
    (`load_processor`), which writes its tokenizer, image processor and chat template, so that the folder loads
    back with `AutoProcessor` too; None writes none.

    With LoRA, `merged` folds the adapters into a copy of the weights (the live model keeps
    training its adapters) and `adapter` writes only the peft adapter (load it with peft).
    PPO's shared value head is not part of the architecture: it goes beside it, in `value_head.safetensors`
    (oxrl/models/value_head.py), so the folder loads without an unexpected key.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    to_save = model
    if is_peft(model) and lora_save == "merged":
        to_save = copy.deepcopy(model).merge_and_unload()
    head = value_head_of(to_save)
    weights = {}
    if head is not None and not is_peft(to_save):  # (a peft model saves its adapter only, never the head)
        weights["state_dict"] = without_value_head(to_save.state_dict())
    with no_progress_bars():
        to_save.save_pretrained(out_dir, safe_serialization=True, **weights)
    if head is not None:
        write_value_head(head, out_dir)
    if tokenizer is not None:
        from transformers import ProcessorMixin

        if not isinstance(tokenizer, ProcessorMixin) and is_vision_language(to_save.config):
            logger.warning("%s: saving a vision-language model with its tokenizer only, not its processor: the folder "
                           "will not load with AutoProcessor (pass the processor to save it)", out_dir)
        tokenizer.save_pretrained(out_dir)
    return out_dir
