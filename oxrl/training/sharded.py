"""The sharded strategies' common part (FSDP2: oxrl/training/fsdp.py, DeepSpeed: oxrl/training/deepspeed_strategy.py):
one model's checkpoint state and its Hugging Face folder, gathered from every rank's shards."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from oxrl.logging.quiet import no_progress_bars
from oxrl.models.load import is_peft
from oxrl.models.lora import merged_state_dict
from oxrl.training.checkpoint import ConfiguredSchedule, read_schedule, restore_configured
from oxrl.training.strategy import Strategy


class MultiProcessStrategy(Strategy):
    """One model's checkpoint state in the sharded strategies; subclasses write and read their shards.

    Every rank: the HF folder is gathered (`gathered_state`) and written by rank 0, under LoRA merged
    or as an adapter folder per `lora_save`; every rank writes its shards into
    `training_state/<shard_dir>`; rank 0 writes the schedule. (`oxrl.training.checkpoint.save_checkpoint`
    adds the RNG and the trainer state, and publishes the folder once every rank is done.)
    """

    shard_dir = ""
    model_class_name = ""  # the Hugging Face class the HF folders name in config.json (set by `prepare`)

    def trained_module(self) -> torch.nn.Module:
        """The model as the loop built it (a peft model under LoRA), inside whatever wraps it."""
        raise NotImplementedError

    def gathered_state(self) -> dict[str, torch.Tensor] | None:
        """The trained module's full state dict under its own names, as CPU tensors, on rank 0; None on the
        other ranks. Every rank must call it (the shards are gathered)."""
        raise NotImplementedError

    def policy_state_dict(self) -> dict[str, torch.Tensor] | None:
        full = self.gathered_state()
        if full is None:
            return None
        module = self.trained_module()
        return merged_state_dict(module, full) if is_peft(module) else full

    def write_hf_folder(self, tokenizer, out_dir: Path, lora_save: str = "merged") -> Path | None:
        """Rank 0 writes the gathered weights: a plain HF folder (`policy_state_dict`), or under LoRA with
        `lora_save: adapter` the peft adapter folder (as `oxrl.models.save.save_hf_folder` does on one device)."""
        module = self.trained_module()
        adapter_only = is_peft(module) and lora_save == "adapter"
        state = self.gathered_state() if adapter_only else self.policy_state_dict()
        if state is None:
            return None
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        with no_progress_bars():
            if adapter_only:
                module.save_pretrained(out_dir, state_dict=state)  # peft keeps the adapter's keys of it
            else:
                base = module.get_base_model() if is_peft(module) else module
                base.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
                # save_pretrained records the class it was called on (FSDP2's wrapper subclass, say): name the model's own.
                config = copy.deepcopy(base.config)
                config.architectures = [self.model_class_name]
                config.save_pretrained(out_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(out_dir)
        return out_dir

    def save_shards(self, path: Path) -> None:
        raise NotImplementedError

    def load_shards(self, path: Path) -> None:
        raise NotImplementedError

    def shards_of(self, state_dir: Path) -> Path:
        return state_dir / self.shard_dir

    def write_state(self, folder: Path, tokenizer, lora_save: str = "merged") -> None:
        self.write_hf_folder(tokenizer, folder, lora_save)
        state_dir = folder / "training_state"
        state_dir.mkdir(parents=True, exist_ok=True)
        self.save_shards(self.shards_of(state_dir))
        if self.is_main:
            torch.save(self.scheduler.state_dict(), state_dir / "scheduler.pt")

    def read_state(self, folder: Path) -> None:
        state_dir = Path(folder) / "training_state"
        if not self.shards_of(state_dir).is_dir():
            raise FileNotFoundError(f"{folder} holds no {type(self).__name__} shards ({self.shards_of(state_dir)}): "
                                    "it was written by another strategy; resume with that one, or start a new run "
                                    "from its HF folder")
        configured = ConfiguredSchedule.of(self.scheduler)  # before the shards bring the saved hyper-parameters back
        self.load_shards(self.shards_of(state_dir))
        restore_configured(configured, self.scheduler, read_schedule(state_dir / "scheduler.pt", self.scheduler))
