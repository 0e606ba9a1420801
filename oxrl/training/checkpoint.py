"""Checkpoints: a Hugging Face folder for use, training state beside it for an exact resume.

    <run>/checkpoints/step_000010/            config.json, model.safetensors, tokenizer files
    <run>/checkpoints/step_000010/training_state/
        optimizer.pt, scheduler.pt, rng.pt    torch state (loaded with weights_only=True)
        rng.json, trainer_state.json          python/numpy RNG, step and counters
        adapter.safetensors                   LoRA only: the exact trainable adapter weights
    <run>/checkpoints/step_000010/value_head.safetensors   PPO's shared-backbone value head (not the HF model's)
        rng_rank1.pt, rng_rank1.json, ...     multi-process runs: the RNG of every other rank
        sharded/ or deepspeed/                multi-process runs: model and optimizer shards, written
                                              by every rank (oxrl/training/fsdp.py, deepspeed_strategy.py)
    <run>/checkpoints/step_000010/critic/     an attached companion (PPO's critic): its own HF folder,
        training_state/                       and its optimizer.pt (or shards), scheduler.pt and
                                              nonfinite.json (RNG and trainer state are the run's, above)

A checkpoint is written to a temporary folder and renamed when complete, so an interrupted save
never shadows the previous good one; a failed save removes its temporary folder (oxrl/training/folders.py).
The flow (partial folder, companions, RNG, publish) is `Strategy.save_checkpoint`
(oxrl/training/strategy.py); this module holds the pieces, and one model's single-device state
(`write_model_state` / `read_model_state`).

On resume the schedule's POSITION comes from the checkpoint and its VALUES from the config: the
learning rate, schedule shape and optimizer hyper-parameters the loop built from the (possibly
changed, see oxrl/training/run_dir.py) config replace the saved ones (`restore_configured`).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from oxrl.training.folders import publish_folder
from oxrl.models.lora import is_peft
from oxrl.models.save import save_hf_folder

logger = logging.getLogger(__name__)
STEP_PREFIX = "step_"


def _rng_state() -> tuple[dict, dict]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    plain = {
        "python": [version, list(internal), gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    return tensors, plain


def _set_rng_state(tensors: dict, plain: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda"])
    version, internal, gauss = plain["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def _rng_names(rank: int) -> tuple[str, str]:
    suffix = "" if rank == 0 else f"_rank{rank}"
    return f"rng{suffix}.pt", f"rng{suffix}.json"


def save_rng_state(state_dir: Path, rank: int = 0) -> None:
    tensors_name, plain_name = _rng_names(rank)
    tensors, plain = _rng_state()
    torch.save(tensors, state_dir / tensors_name)
    (state_dir / plain_name).write_text(json.dumps(plain))


def load_rng_state(state_dir: Path, rank: int = 0) -> None:
    tensors_name, plain_name = _rng_names(rank)
    if not (state_dir / tensors_name).is_file():
        # e.g. resuming with more processes than were saved: the new rank keeps its seeded RNG.
        logger.warning("%s has no RNG state for rank %d: that rank keeps its current RNG", state_dir, rank)
        return
    _set_rng_state(torch.load(state_dir / tensors_name, weights_only=True), json.loads((state_dir / plain_name).read_text()))


def partial_and_final_dirs(run_dir: Path, step: int) -> tuple[Path, Path]:
    """(temporary folder to write into, folder it becomes once complete)."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"{STEP_PREFIX}{step:06d}"
    return root / f".{final.name}.partial", final


def publish_checkpoint(tmp: Path, final: Path, keep_last: int) -> Path:
    """Rename a complete temporary checkpoint into place and prune the old ones."""
    publish_folder(tmp, final)
    _prune(final.parent, keep_last)
    logger.info("saved checkpoint %s", final)
    return final


def read_trainer_state(checkpoint: Path) -> dict:
    path = Path(checkpoint) / "training_state" / "trainer_state.json"
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint} is not a complete oxRL checkpoint (no training_state/trainer_state.json)")
    return json.loads(path.read_text())


def step_of(checkpoint: Path) -> int:
    """The optimizer step a checkpoint was written after."""
    return int(read_trainer_state(checkpoint)["step"])


def trainable_state(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu().contiguous() for name, p in model.named_parameters() if p.requires_grad}


def write_model_state(folder: Path, model, tokenizer, optimizer, scheduler, lora_save: str = "merged") -> None:
    """One model on one device: its HF folder in `folder`, its optimizer and schedule (and the exact
    LoRA adapter weights) in `folder/training_state/`."""
    save_hf_folder(model, tokenizer, folder, lora_save=lora_save)
    state_dir = Path(folder) / "training_state"
    state_dir.mkdir()
    torch.save(optimizer.state_dict(), state_dir / "optimizer.pt")
    torch.save(scheduler.state_dict(), state_dir / "scheduler.pt")
    if is_peft(model):
        save_file(trainable_state(model), state_dir / "adapter.safetensors")


def _prune(root: Path, keep_last: int) -> None:
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old)


def list_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith(STEP_PREFIX) and (p / "training_state" / "trainer_state.json").is_file()]
    return sorted(done, key=lambda p: int(p.name[len(STEP_PREFIX) :]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(Path(run_dir) / "checkpoints")
    return found[-1] if found else None


def _load_weights(model, checkpoint: Path) -> None:
    state_dir = checkpoint / "training_state"
    if is_peft(model):
        saved = load_file(state_dir / "adapter.safetensors")
        params = dict(model.named_parameters())
        for name, value in saved.items():
            params[name].data.copy_(value)
        return
    saved: dict[str, torch.Tensor] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        saved.update(load_file(file))
    missing, unexpected = model.load_state_dict(saved, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"checkpoint {checkpoint} does not match the model: missing {missing}, unexpected {unexpected}")


def read_model_state(folder: Path, model, optimizer, scheduler) -> None:
    """Restore what `write_model_state` wrote: weights, optimizer and the schedule's position."""
    folder = Path(folder)
    state_dir = folder / "training_state"
    configured = ConfiguredSchedule.of(scheduler)
    _load_weights(model, folder)
    optimizer.load_state_dict(torch.load(state_dir / "optimizer.pt", weights_only=True))
    restore_configured(configured, scheduler, torch.load(state_dir / "scheduler.pt", weights_only=True))


@dataclass
class ConfiguredSchedule:
    """The optimizer hyper-parameters and peak learning rates the loop built from the config."""

    groups: list[dict]  # per param group, everything but the parameters (lr, initial_lr, betas, weight_decay...)
    base_lrs: list[float]

    @classmethod
    def of(cls, scheduler) -> "ConfiguredSchedule":
        """Capture them (from the schedule and the optimizer it drives) before a checkpoint overwrites them."""
        groups = [{k: v for k, v in g.items() if k != "params"} for g in scheduler.optimizer.param_groups]
        return cls(groups, list(scheduler.base_lrs))


def restore_configured(configured: ConfiguredSchedule, scheduler, saved_schedule: dict) -> None:
    """Load the schedule's position (`last_epoch`) from `saved_schedule`, keep the configured peak
    learning rates and hyper-parameters, and set every group's lr to the configured schedule's value
    at that position. With an unchanged config this is exactly the saved state. Call it after the
    optimizer state is loaded (which brings the checkpoint's hyper-parameters with it)."""
    position = saved_schedule["last_epoch"]
    lrs = [base * factor(position) for base, factor in zip(configured.base_lrs, scheduler.lr_lambdas)]
    if list(saved_schedule["base_lrs"]) != configured.base_lrs:
        logger.warning("resume: peak learning rate %s from the config (the checkpoint had %s); lr %s from step %d",
                       configured.base_lrs, saved_schedule["base_lrs"], lrs, position)
    # `_last_lr` is the state-dict key of the lr the scheduler reports (get_last_lr): the configured one.
    scheduler.load_state_dict({**saved_schedule, "base_lrs": configured.base_lrs, "_last_lr": lrs})
    for group, hyper, lr in zip(scheduler.optimizer.param_groups, configured.groups, lrs):
        group.update(hyper)
        group["lr"] = lr
