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
import pickle
import random
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from oxrl.training.folders import publish_folder
from oxrl.models.lora import is_peft
from oxrl.models.save import save_hf_folder

logger = logging.getLogger(__name__)
STEP_PREFIX = "step_"
STEP_FOLDER = re.compile(r"step_(\d+)")
WHAT_TO_DO = "resume from another checkpoint (run.resume=<its path>), or remove this one"


class CheckpointError(ValueError):
    """A checkpoint cannot be resumed from: a file of it is damaged, or its recorded state contradicts its folder."""


def _damaged(path: Path, error: BaseException) -> CheckpointError:
    if isinstance(error, pickle.UnpicklingError):
        # torch's own message advises loading with weights_only=False, which would run whatever the file holds.
        why = "it holds objects other than tensors and plain values, which are not loaded"
    else:
        first = (str(error).strip().splitlines() or [""])[0][:200]
        why = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return CheckpointError(f"{path}: damaged checkpoint file ({why}); {WHAT_TO_DO}")


def load_torch_state(path: Path):
    """A torch state file of a checkpoint (`weights_only=True`: tensors and plain values, nothing executed);
    a damaged or hostile file is a CheckpointError naming it."""
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError as error:
        raise CheckpointError(f"{path}: missing from its checkpoint; {WHAT_TO_DO}") from error
    except (EOFError, RuntimeError, pickle.UnpicklingError, ValueError, OSError) as error:  # what torch raises for them
        raise _damaged(path, error) from error


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file of a checkpoint; a damaged one is a CheckpointError naming it."""
    try:
        return load_file(path)
    except (SafetensorError, OSError) as error:
        raise _damaged(path, error) from error


def load_json(path: Path) -> dict:
    """A JSON object of a checkpoint; anything else is a CheckpointError naming the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise CheckpointError(f"{path}: missing from its checkpoint; {WHAT_TO_DO}") from error
    except (ValueError, RecursionError, OSError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _damaged(path, error) from error
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: damaged checkpoint file (a JSON {type(value).__name__}, not an object); {WHAT_TO_DO}")
    return value


def folder_step(checkpoint: Path) -> int | None:
    """The step a checkpoint's folder name says (`step_000010` -> 10), None for another name."""
    match = STEP_FOLDER.fullmatch(Path(checkpoint).name)
    return int(match.group(1)) if match else None


def check_intact(checkpoint: Path) -> None:
    """Cheap checks, before a resume changes anything, that no file of `checkpoint` is visibly damaged: its trainer
    state (`read_trainer_state`), every torch file a complete zip archive, every safetensors header whole."""
    checkpoint = Path(checkpoint)
    read_trainer_state(checkpoint)
    for path in sorted(checkpoint.rglob("*.pt")):
        if path.is_file() and not zipfile.is_zipfile(path):
            raise CheckpointError(f"{path}: damaged checkpoint file (not a complete torch archive); {WHAT_TO_DO}")
    for path in sorted(checkpoint.rglob("*.safetensors")):
        try:
            with safe_open(path, framework="pt"):
                pass
        except (SafetensorError, OSError) as error:
            raise _damaged(path, error) from error


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
    _set_rng_state(load_torch_state(state_dir / tensors_name), load_json(state_dir / plain_name))


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
    """The checkpoint's step and counters. Its step must be a step number, and the one its folder's name says: a
    resume trusts it to drop later checkpoints, set the schedule's position and skip the data already seen."""
    path = Path(checkpoint) / "training_state" / "trainer_state.json"
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint} is not a complete oxRL checkpoint (no training_state/trainer_state.json)")
    state = load_json(path)
    step = state.get("step")
    if type(step) is not int or step < 0:
        raise CheckpointError(f"{path}: damaged checkpoint file (step {repr(step)[:40]} is not a step number, an "
                              f"integer >= 0); {WHAT_TO_DO}")
    named = folder_step(checkpoint)
    if named is not None and named != step:
        raise CheckpointError(f"{path}: records step {step} but its folder is {Path(checkpoint).name} (step {named}): "
                              f"the checkpoint was altered or mixed with another; {WHAT_TO_DO}")
    return state


def step_of(checkpoint: Path) -> int:
    """The optimizer step a checkpoint was written after."""
    return read_trainer_state(checkpoint)["step"]


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
    done = [p for p in root.iterdir()
            if folder_step(p) is not None and (p / "training_state" / "trainer_state.json").is_file()]
    return sorted(done, key=folder_step)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(Path(run_dir) / "checkpoints")
    return found[-1] if found else None


def _load_weights(model, checkpoint: Path) -> None:
    state_dir = checkpoint / "training_state"
    if is_peft(model):
        saved = load_tensors(state_dir / "adapter.safetensors")
        params = dict(model.named_parameters())
        for name, value in saved.items():
            params[name].data.copy_(value)
        return
    saved: dict[str, torch.Tensor] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        saved.update(load_tensors(file))
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
    optimizer.load_state_dict(load_torch_state(state_dir / "optimizer.pt"))
    restore_configured(configured, scheduler, load_torch_state(state_dir / "scheduler.pt"))


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
