"""Checkpoints: a Hugging Face folder for use, training state beside it for an exact resume.

    <run>/checkpoints/step_000010/            config.json, model.safetensors, tokenizer files
    <run>/checkpoints/step_000010/training_state/
        optimizer.pt, scheduler.pt, rng.pt    torch state (loaded with weights_only=True)
        rng.json, trainer_state.json          python/numpy RNG, step and counters
        rank_state.json                       pipelined RL only: the steps this rank sampled ahead (plain JSON)
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
The flow (partial folder, companions, RNG, publish) is `save_checkpoint`, which `Strategy.save_checkpoint`
(oxrl/training/strategy.py) calls on every rank, each strategy writing its own model's state; this module also holds
the pieces, and one model's single-device state (`write_model_state` / `read_model_state`).

A checkpoint may be damaged or someone else's: its files are read by oxrl/training/checkpoint_files.py (one-line
errors naming the file, nothing unpickled beyond tensors and plain values), and a resume checks the whole checkpoint
(`check_intact`) before it deletes anything on its word.

On resume the schedule's POSITION comes from the checkpoint and its VALUES from the config: the
learning rate, schedule shape and optimizer hyper-parameters the loop built from the (possibly
changed, see oxrl/training/run_dir.py) config replace the saved ones (`restore_configured`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import stat
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from oxrl.files import not_regular
from oxrl.models.load import is_peft
from oxrl.models.save import save_hf_folder
from oxrl.training.checkpoint_files import (
    RANK_STATE_LIMIT,
    STEP_PREFIX,
    TRAINER_STATE,
    WHAT_TO_DO,
    CheckpointError,
    cause,
    damaged,
    folder_step,
    load_counts,
    load_json,
    load_tensors,
    load_torch_state,
    read_trainer_state,
)
from oxrl.training import distributed
from oxrl.training.folders import publish_folder, remove_path, writing_folder

logger = logging.getLogger(__name__)
NONFINITE_FILE = "nonfinite.json"  # a companion's skipped-step counts (the main model's are in trainer_state.json)


def check_intact(checkpoint: Path, check_rank_state: Callable[[Path, int], None] | None = None) -> None:
    """Check, before a resume loads or changes anything, that `checkpoint` can be read: its trainer state
    (`read_trainer_state`), every file a regular one, the torch files oxRL loads parsed (memory-mapped: their tensors
    are not read) and of the right kind, every other torch file (DeepSpeed's) a complete archive, every safetensors
    header whole, each rank's plain state (`rank_state*.json`) by `check_rank_state(path, step)` (the runner's: a
    pipelined RL run's samples ahead, oxrl/loops/pipeline_state.py), else parsed. A CheckpointError names the first
    bad file."""
    checkpoint = Path(checkpoint)
    step = read_trainer_state(checkpoint)["step"]
    for path in _files(checkpoint):
        if path.suffix == ".pt":
            _check_torch_file(path)
        elif path.name.startswith("rank_state") and path.parent.name == "training_state":
            if check_rank_state is None:
                load_json(path, RANK_STATE_LIMIT)
            else:
                check_rank_state(path, step)
        elif path.suffix == ".json" and path.parent.name == "training_state":  # (the HF folder's are the model's)
            load_counts(path)
        elif path.suffix == ".safetensors":
            try:
                with safe_open(path, framework="pt"):
                    pass
            except Exception as error:  # noqa: BLE001 (the Rust parser's SafetensorError, or an OSError; re-raised)
                raise damaged(path, cause(error)) from error


def _files(checkpoint: Path) -> list[Path]:
    """Every file under `checkpoint`, each a regular file (symlinks to one allowed). A symlink to a folder is
    refused, not walked: one to `/` would have the whole machine checked."""
    found = []
    for folder, subfolders, files in os.walk(checkpoint):
        for link in (Path(folder) / name for name in subfolders if os.path.islink(Path(folder) / name)):
            raise CheckpointError(f"{link}: is a symlink to a folder ({os.path.realpath(link)}), and a checkpoint's "
                                  f"folders are its own: copy it in; {WHAT_TO_DO}")
        for name in files:
            path = Path(folder) / name
            try:
                mode = os.stat(path).st_mode
            except OSError as error:
                raise CheckpointError(f"{path}: cannot be read ({error.strerror}); {WHAT_TO_DO}") from error
            if not stat.S_ISREG(mode):
                raise CheckpointError(f"{path}: {not_regular(path, mode)}; {WHAT_TO_DO}")
            found.append(path)
    return sorted(found)


def _check_torch_file(path: Path) -> None:
    if not zipfile.is_zipfile(path):  # (truncated: its central directory, at the end, is missing)
        raise damaged(path, "an empty file" if path.stat().st_size == 0 else "not a complete torch archive")
    if path.parent.name != "training_state":  # DeepSpeed's shards, which DeepSpeed loads itself
        return
    if path.name.startswith("rng"):
        read_rng_state(path, path.with_suffix(".json"))
    elif path.name == "scheduler.pt":
        check_schedule(path, load_torch_state(path))
    else:
        saved = load_torch_state(path, mmap=True, map_location="cpu")
        if path.name == "optimizer.pt" and not (isinstance(saved, dict) and {"state", "param_groups"} <= saved.keys()):
            raise damaged(path, "not an optimizer's state")


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


@dataclass
class RngState:
    """One rank's saved RNG states, each checked by setting it on a fresh generator (`read_rng_state`)."""

    torch: torch.Tensor
    cuda: list[torch.Tensor]
    python: tuple
    numpy: tuple

    def restore(self) -> None:
        torch.set_rng_state(self.torch)
        if self.cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        np.random.set_state(self.numpy)


# What setting a malformed state raises (a missing key, a wrong type or length, a number out of range).
_BAD_STATE = (KeyError, IndexError, AttributeError, TypeError, ValueError, RuntimeError, OverflowError)


def read_rng_state(tensors_path: Path, plain_path: Path) -> RngState:
    """The RNG states `save_rng_state` wrote in `tensors_path` and `plain_path`; a CheckpointError names a bad file."""
    tensors = load_torch_state(tensors_path)
    try:
        torch.Generator().set_state(tensors["torch"])
        cuda = tensors.get("cuda", [])
        if not (isinstance(cuda, list) and all(isinstance(state, torch.Tensor) for state in cuda)):
            raise TypeError("its cuda states are not a list of tensors")
    except _BAD_STATE as error:
        raise damaged(tensors_path, f"not an RNG state: {cause(error)}") from error
    plain = load_json(plain_path)
    try:
        version, internal, gauss = plain["python"]
        python = (version, tuple(internal), gauss)
        random.Random().setstate(python)
        kind, keys, pos, has_gauss, cached = plain["numpy"]
        numpy = (kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached)
        np.random.RandomState().set_state(numpy)
    except _BAD_STATE as error:
        raise damaged(plain_path, f"not an RNG state: {cause(error)}") from error
    return RngState(tensors["torch"], cuda, python, numpy)


def _rng_names(rank: int) -> tuple[str, str]:
    suffix = "" if rank == 0 else f"_rank{rank}"
    return f"rng{suffix}.pt", f"rng{suffix}.json"


def save_rng_state(state_dir: Path, rank: int = 0) -> None:
    tensors_name, plain_name = _rng_names(rank)
    tensors, plain = _rng_state()
    torch.save(tensors, state_dir / tensors_name)
    (state_dir / plain_name).write_text(json.dumps(plain))


def rank_state_name(rank: int) -> str:
    """The file of one rank's own part of the trainer state (e.g. the RL steps it sampled ahead)."""
    return "rank_state.json" if rank == 0 else f"rank_state_rank{rank}.json"


def load_rng_state(state_dir: Path, rank: int = 0) -> None:
    tensors_name, plain_name = _rng_names(rank)
    if not (state_dir / tensors_name).is_file():
        # e.g. resuming with more processes than were saved: the new rank keeps its seeded RNG.
        logger.warning("%s has no RNG state for rank %d: that rank keeps its current RNG", state_dir, rank)
        return
    read_rng_state(state_dir / tensors_name, state_dir / plain_name).restore()


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
        remove_path(old)  # a step folder that is a symlink is unlinked: what it points to is not this run's


def list_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if folder_step(p) is not None and (p / TRAINER_STATE).is_file()]
    return sorted(done, key=folder_step)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(Path(run_dir) / "checkpoints")
    return found[-1] if found else None


def drop_abandoned_checkpoints(run_dir: Path, checkpoint: Path, step: int, strategy) -> None:
    """A rewind (a resume from `checkpoint`, of step `step`, of this run, which has later ones): rank 0 removes the
    later checkpoints, the abandoned continuation's. Every rank calls this once it has loaded `checkpoint` and checked
    what it holds against the run (the model's weights, a pipelined run's prompts: oxrl/loops/pipeline_state.py), and
    before the metrics log drops the same steps' rows: those checks need the model and the data, and a refusal must
    leave the run as it was."""
    strategy.world_objects(None)  # every rank's checks passed (a rank that failed has left, and its launcher stops us)
    if not strategy.is_main or Path(checkpoint).parent.resolve() != (Path(run_dir) / "checkpoints").resolve():
        return
    later = [c for c in list_checkpoints(Path(run_dir) / "checkpoints") if folder_step(c) > step]
    for folder in later:
        remove_path(folder)  # a step folder that is a symlink is unlinked: what it points to is not this run's
    if later:
        logger.warning("resuming from step %d of %s: removed the later checkpoints %s (the abandoned continuation)",
                       step, run_dir, ", ".join(c.name for c in later))


def _load_weights(model, checkpoint: Path) -> None:
    try:
        _copy_weights(model, checkpoint)
    except RuntimeError as error:  # torch: a saved tensor of another shape than the model's
        raise CheckpointError(f"{checkpoint}: its weights do not fit this model ({cause(error)}): it was written for "
                              f"another model or LoRA setting; {WHAT_TO_DO}") from error


def _copy_weights(model, checkpoint: Path) -> None:
    if is_peft(model):
        path = checkpoint / "training_state" / "adapter.safetensors"
        saved, params = load_tensors(path), dict(model.named_parameters())
        if set(saved) - set(params):
            raise CheckpointError(f"{path}: holds adapter weights this model does not have "
                                  f"({_some(set(saved) - set(params))}); {WHAT_TO_DO}")
        for name, value in saved.items():
            params[name].data.copy_(value)
        return
    saved: dict[str, torch.Tensor] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        saved.update(load_tensors(file))
    missing, unexpected = model.load_state_dict(saved, strict=False)
    if unexpected and hasattr(model, "from_pretrained"):
        # transformers renames some families' weights as it saves them (Qwen2-VL's language model among them) and
        # maps them back as it loads: read the folder with its loader, then copy exactly what it holds.
        dtype = next(model.parameters()).dtype
        missing, unexpected = model.load_state_dict(type(model).from_pretrained(checkpoint, dtype=dtype).state_dict(),
                                                    strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise CheckpointError(f"{checkpoint}: its weights do not match the model (missing {_some(set(missing) - tied)}; "
                              f"unexpected {_some(unexpected)}); {WHAT_TO_DO}")


def _some(names) -> str:
    names = sorted(names)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "") if names else "none"


def read_model_state(folder: Path, model, optimizer, scheduler) -> None:
    """Restore what `write_model_state` wrote: weights, optimizer and the schedule's position."""
    folder = Path(folder)
    state_dir = folder / "training_state"
    configured = ConfiguredSchedule.of(scheduler)
    _load_weights(model, folder)
    read_optimizer(state_dir / "optimizer.pt", optimizer)
    restore_configured(configured, scheduler, read_schedule(state_dir / "scheduler.pt", scheduler))


def read_optimizer(path: Path, optimizer) -> None:
    """Load the optimizer state saved in `path` into `optimizer`; a CheckpointError names a file that does not fit."""
    saved = load_torch_state(path)
    try:
        optimizer.load_state_dict(saved)
    except _BAD_STATE as error:  # torch checks the groups' sizes, not the file's shape
        raise CheckpointError(f"{path}: does not fit this run's optimizer ({cause(error)}); {WHAT_TO_DO}") from error


def read_schedule(path: Path, scheduler) -> dict:
    """The schedule state saved in `path`, checked (`check_schedule`) against `scheduler`'s parameter groups."""
    return check_schedule(path, load_torch_state(path), groups=len(scheduler.optimizer.param_groups))


def check_schedule(path: Path, saved, groups: int | None = None) -> dict:
    """`saved`, read from `path`, as a schedule's state: a position (`last_epoch`, a count) and a peak learning rate
    per parameter group (`groups` of them, when known). Its other keys become the scheduler's attributes, so none
    may replace the optimizer it drives."""
    if not isinstance(saved, dict):
        raise damaged(path, f"a {type(saved).__name__}, not a schedule's state")
    position, peaks = saved.get("last_epoch"), saved.get("base_lrs")
    if type(position) is not int or position < 0:
        raise damaged(path, f"last_epoch {str(position)[:40]} is not a count, an integer >= 0")
    if not (isinstance(peaks, list) and peaks and all(type(lr) in (int, float) for lr in peaks)):
        raise damaged(path, f"base_lrs {str(peaks)[:80]} are not learning rates")
    if groups is not None and len(peaks) != groups:
        raise CheckpointError(f"{path}: holds {len(peaks)} peak learning rate(s) for this run's {groups} parameter "
                              f"group(s): it was written for another model or optimizer; {WHAT_TO_DO}")
    if "optimizer" in saved:
        raise damaged(path, "it would replace the scheduler's optimizer")
    return saved


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


def save_checkpoint(strategy, run_dir: Path, step: int, tokenizer, trainer_state: dict, keep_last: int,
                    lora_save: str = "merged", rank_state: dict | None = None, card: str | None = None) -> Path | None:
    """Write `<run_dir>/checkpoints/step_<step>` (every rank must call it); returns the folder on rank 0.

    Into a partial folder, published once complete: this model's state (`write_state`), each
    attached companion's in `<name>/` (its non-finite count beside its optimizer state), every
    rank's RNG (and `rank_state`, each rank's own plain values), the trainer state and the model card (`card`, the
    text of README.md: oxrl/training/model_card.py). Weights holding inf/NaN are refused before anything is written.
    """
    strategy.check_finite_weights(f"checkpoint step {step}")
    for name, companion in strategy.attached:
        companion.check_finite_weights(f"checkpoint step {step} ({name})")
    tmp, final = partial_and_final_dirs(run_dir, step)
    if strategy.is_main:
        remove_path(tmp)
    distributed.barrier()
    # A failed write removes the partial folder (rank 0 owns it) and names the folder; torchrun then
    # stops the other ranks.
    with writing_folder(tmp, final, remove_on_error=strategy.is_main):
        strategy.write_state(tmp, tokenizer, lora_save)
        for name, companion in strategy.attached:
            companion.write_state(tmp / name, tokenizer)
            if strategy.is_main:
                (tmp / name / "training_state" / NONFINITE_FILE).write_text(json.dumps(companion.nonfinite.state_dict()))
        state_dir = tmp / "training_state"
        save_rng_state(state_dir, strategy.rank)
        if rank_state is not None:
            (state_dir / rank_state_name(strategy.rank)).write_text(json.dumps(rank_state))
        if strategy.is_main:
            (state_dir / "trainer_state.json").write_text(json.dumps({**trainer_state, "step": step}, indent=1))
            if card is not None:
                (tmp / "README.md").write_text(card)
        distributed.barrier()  # every rank's files are on disk before the folder is published
        if strategy.is_main:
            publish_checkpoint(tmp, final, keep_last)
    distributed.barrier()
    return final if strategy.is_main else None


def load_checkpoint(strategy, checkpoint: Path) -> dict:
    """Restore weights, optimizer, schedule and RNG (every rank), and each attached companion from
    `<checkpoint>/<name>/`; returns the trainer state."""
    checkpoint = Path(checkpoint)
    trainer_state = read_trainer_state(checkpoint)
    for name, _ in strategy.attached:  # before anything is restored: all or nothing
        if not (checkpoint / name / "training_state").is_dir():
            raise FileNotFoundError(f"{checkpoint} has no {name}/ folder (the state of the {name} attached to this "
                                    f"run), so the {name} cannot resume from it: it was written without a {name}")
    strategy.read_state(checkpoint)
    for name, companion in strategy.attached:
        companion.read_state(checkpoint / name)
        companion.nonfinite.load_state_dict(load_counts(checkpoint / name / "training_state" / NONFINITE_FILE))
    load_rng_state(checkpoint / "training_state", strategy.rank)
    rank_state = checkpoint / "training_state" / rank_state_name(strategy.rank)
    if rank_state.exists():
        trainer_state["rank_state"] = load_json(rank_state, RANK_STATE_LIMIT)
    logger.info("resumed from %s", checkpoint)
    return trainer_state
