"""The training-strategy interface every loop uses and the single-device implementation (the factory: build.py).

A loop calls `prepare` once (and uses the model it returns), `backward(loss)` per micro-batch,
`step()` per optimizer step and `all_reduce_sum()` to turn local counts into global ones (for
loss normalisation). Checkpoints and the final Hugging Face folder are written through the
strategy, because sharded state must be saved by every rank. The loop never knows whether it
runs on one device, under FSDP2 (oxrl/training/fsdp.py) or under DeepSpeed ZeRO
(oxrl/training/deepspeed_strategy.py).

Gradient reduction across ranks SUMS: a loop's loss is already divided by the GLOBAL
normaliser (all ranks' tokens, pairs, ...), so the step's gradient is the sum of every rank's
gradient. FSDP2 and DeepSpeed average over ranks; their `backward` multiplies the loss by the
world size to undo that average (a reduce op of SUM is not available on every backend: gloo
has no PREMUL_SUM). Hence 1 rank == N ranks, up to float rounding.

A step whose loss or gradient norm is inf/NaN is skipped on every rank alike (see
oxrl/training/nonfinite.py), and no checkpoint or final folder is written from weights holding
inf/NaN: `NonFiniteError` stops the run instead, leaving the last good checkpoint as it was.

A second trained model (PPO's critic) trains through a companion: `strategy.companion("critic",
max_grad_norm)` is a strategy of the same kind in the same process group, with its own model,
optimizer, schedule, clipping and non-finite count. `strategy.attach("critic", companion)` makes
every checkpoint hold it too, in `<checkpoint>/critic/` (written before the folder is published, so
a checkpoint is complete for both models or absent), and `load_checkpoint` restore it.
"""

from __future__ import annotations

import copy
import logging
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch

from oxrl.models.load import is_peft
from oxrl.training import distributed
from oxrl.models.precision import uses_bf16
from oxrl.training.nonfinite import NonFiniteError, NonFiniteGuard, is_finite

logger = logging.getLogger(__name__)


class Strategy:
    """What the loops call. Subclasses set `device`, `rank`, `world_size` and implement the rest."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    use_bf16_autocast: bool = False
    # True when parameters live in shards that every forward gathers: then every rank must run
    # the same number of forward passes (generation included, see `HFEngine(synced=...)`).
    shards_parameters: bool = False
    # Whether the optimizer may be torch's fused AdamW (oxrl/training/optim.py): parameters that are plain tensors on
    # one device. Sharded parameters (DTensors, DeepSpeed's flat partitions) keep torch's default implementation.
    fused_optimizer: bool = False

    # The ranks that see different rows (data parallel): every rank, unless a mesh splits one model over several
    # (tensor and context parallel, oxrl/training/fsdp.py); then (this rank's index, their count) and their group.
    data_coordinates: tuple[int, int] | None = None
    data_group = None

    nonfinite: NonFiniteGuard  # skipped-step counts; set by each subclass from train.max_nonfinite_steps
    max_grad_norm: float | None = None  # clip the global gradient norm to this (None: no clipping)
    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    scheduler = None
    # (folder name, companion) checkpointed with this strategy; a tuple, so no instance shares a mutable default.
    attached: tuple[tuple[str, Strategy], ...] = ()
    owns_process_group: bool = True  # False for a companion: the group is its parent's to leave

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def data_rank(self) -> int:
        """Which share of each batch this rank trains on: its index among the data-parallel ranks."""
        return self.rank if self.data_coordinates is None else self.data_coordinates[0]

    @property
    def data_size(self) -> int:
        """The data-parallel ranks: how many shares each batch is split into."""
        return self.world_size if self.data_coordinates is None else self.data_coordinates[1]

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler=None):
        """Take ownership of the model, optimizer and schedule; returns the model to call in the loop."""
        raise NotImplementedError

    def companion(self, subject: str, max_grad_norm: float | None) -> Strategy:
        """A strategy of the same kind for another trained model (e.g. subject "critic"): same device,
        process group, precision and sharding settings; its own model, optimizer, schedule, gradient
        clipping and non-finite count (whose messages name `subject`). It never joins or leaves the
        process group itself. `attach` it to checkpoint the two models together."""
        other = copy.copy(self)  # the settings; everything that belongs to one model is replaced below
        other.model, other.optimizer, other.scheduler = None, None, None
        other.max_grad_norm = max_grad_norm
        other.nonfinite = NonFiniteGuard(self.nonfinite.max_consecutive, subject=subject)
        other.attached = ()
        other.owns_process_group = False
        return other

    def attach(self, name: str, companion: Strategy) -> None:
        """Save `companion` in `<checkpoint>/<name>/` with every checkpoint of this strategy, and restore it
        from there in `load_checkpoint`."""
        if type(companion) is not type(self) or companion is self or companion.owns_process_group:
            raise ValueError(f"attach {name!r}: expected a companion of this {type(self).__name__} (see `companion`)")
        taken = {"training_state", *(attached for attached, _ in self.attached)}
        if not name or name.startswith(".") or "/" in name or name in taken:
            raise ValueError(f"attach: {name!r} cannot name a checkpoint sub-folder (taken: {', '.join(sorted(taken))})")
        self.attached = (*self.attached, (name, companion))

    def prepare_frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        """A model that is only run without gradient (reference, teacher): shard it too where the strategy shards."""
        return model

    def autocast(self):
        if self.use_bf16_autocast:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def step(self, loss: float | None = None, step: int | None = None) -> float:
        """Clip, step the optimizer and schedule, zero the grads; returns the pre-clip global grad norm.

        `loss` is the step's global loss (the same on every rank) and `step` the loop's step number,
        for messages. A non-finite loss or gradient norm skips the optimizer update (the schedule
        still advances); too many in a row raise `NonFiniteError` (oxrl/training/nonfinite.py).
        """
        norm = self.clip_gradients()
        updated = self.update_allowed(loss, norm, step)
        if updated:
            self.optimizer.step()
        self.advance_schedule(updated)
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def advance_schedule(self, updated: bool) -> None:
        """One schedule step per optimizer step, whether the update was applied or skipped."""
        if self.scheduler is None:
            return
        with warnings.catch_warnings():
            if not updated:  # torch warns when a schedule moves before the optimizer ever stepped: here it is meant to
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()

    def clip_gradients(self) -> float:
        """Clip the gradients to `max_grad_norm` (when set); returns their global norm before clipping."""
        raise NotImplementedError

    def update_allowed(self, loss: float | None, grad_norm: float, step: int | None) -> bool:
        """Whether this step may update the weights, decided alike on every rank (see `NonFiniteGuard`)."""
        local_bad = not (is_finite(loss) and is_finite(grad_norm))
        # The loss and norm are global already; the all-reduce makes the agreement explicit, whatever
        # a backend does with NaN, so that no rank ever steps while another skips.
        finite = self.world_sum(float(local_bad)) == 0.0
        return self.nonfinite.allow(finite, loss, grad_norm, step)

    def trainable_tensors(self):
        """(name, this rank's local tensor) of every trainable parameter."""
        return ((name, p) for name, p in self.model.named_parameters() if p.requires_grad)

    def check_finite_weights(self, what: str) -> None:
        """Raise `NonFiniteError` when a trainable parameter holds inf/NaN on any rank (every rank calls it)."""
        local = [name for name, tensor in self.trainable_tensors() if not bool(torch.isfinite(tensor).all())]
        # A count first (one small all-reduce at every save); the names travel only when something is wrong.
        if self.world_sum(float(len(local))) > 0:  # each rank of a split model holds other slices
            bad = sorted({name for names in self.world_objects(local) for name in names})
            raise NonFiniteError(
                f"refusing to write {what}: {len(bad)} trainable parameter(s) hold inf/NaN values "
                f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); earlier checkpoints are kept as they are. "
                "Lower train.optim.lr (or set train.optim.max_grad_norm) and resume from the last good checkpoint"
            )

    def all_reduce_sum(self, value: float) -> float:
        """The sum of `value` over the data-parallel ranks: one share's counts and loss sums made global."""
        return distributed.all_reduce_sum(value, self.device, self.data_group)

    def world_sum(self, value: float) -> float:
        """The sum of `value` over every rank (a flag any rank may raise)."""
        return distributed.all_reduce_sum(value, self.device)

    def gather_objects(self, value: object) -> list[object]:
        """Every data-parallel rank's `value`, in their order."""
        return distributed.all_gather_objects(value, self.data_group)

    def world_objects(self, value: object) -> list[object]:
        """Every rank's `value`, in rank order (what rank 0 decided, for all: `[0]`)."""
        return distributed.all_gather_objects(value)

    def save_checkpoint(self, run_dir: Path, step: int, tokenizer, trainer_state: dict, keep_last: int,
                        lora_save: str = "merged", rank_state: dict | None = None, card: str | None = None) -> Path | None:
        """Write `<run_dir>/checkpoints/step_<step>` (every rank must call it); returns the folder on rank 0. The flow
        is `oxrl.training.checkpoint.save_checkpoint` (loaded only by a run that checkpoints); `card` is its model
        card's text (README.md)."""
        from oxrl.training.checkpoint import save_checkpoint

        return save_checkpoint(self, run_dir, step, tokenizer, trainer_state, keep_last, lora_save, rank_state, card)

    def load_checkpoint(self, checkpoint: Path) -> dict:
        """Restore weights, optimizer, schedule and RNG (every rank), and each attached companion; returns the
        trainer state (`oxrl.training.checkpoint.load_checkpoint`)."""
        from oxrl.training.checkpoint import load_checkpoint

        return load_checkpoint(self, checkpoint)

    def write_state(self, folder: Path, tokenizer, lora_save: str = "merged") -> None:
        """This model's part of a checkpoint (every rank): its HF folder in `folder`, its optimizer and
        schedule (or shards) in `folder/training_state/`."""
        raise NotImplementedError

    def read_state(self, folder: Path) -> None:
        """Restore what `write_state` wrote in `folder` (every rank)."""
        raise NotImplementedError

    def save_hf_folder(self, tokenizer, out_dir: Path, lora_save: str = "merged") -> Path | None:
        """The whole model as a Hugging Face folder (every rank must call it); the path on rank 0, else None.
        Refuses (`NonFiniteError`) to write weights that hold inf/NaN."""
        self.check_finite_weights(str(out_dir))
        return self.write_hf_folder(tokenizer, out_dir, lora_save)

    def write_hf_folder(self, tokenizer, out_dir: Path, lora_save: str = "merged") -> Path | None:
        """`save_hf_folder` without the check (every rank must call it)."""
        raise NotImplementedError

    def policy_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full weights the prepared policy computes with, as CPU tensors under the base Hugging Face model's
        names (LoRA adapters merged on the fly, as oxrl.models.lora.merged_state_dict does; a shared value head, if any,
        is kept as it is — callers drop it). Every rank must call it (sharded weights are gathered: a collective);
        rank 0 gets the dict, the other ranks None."""
        raise NotImplementedError

    def close(self) -> None:
        if self.owns_process_group:
            distributed.shutdown()


class SingleDevice(Strategy):
    """One process, CPU or one GPU."""

    fused_optimizer = True

    def __init__(self, device: torch.device, mixed_precision: str = "auto", max_grad_norm: float | None = None,
                 max_nonfinite_steps: int = 3):
        self.device = device
        self.use_bf16_autocast = uses_bf16(mixed_precision, device.type)
        self.max_grad_norm = max_grad_norm
        self.nonfinite = NonFiniteGuard(max_nonfinite_steps)
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler=None):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        return model

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_gradients(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        return float(norm)

    def all_reduce_sum(self, value: float) -> float:
        return value

    def world_sum(self, value: float) -> float:
        return value

    def gather_objects(self, value: object) -> list[object]:
        return [value]

    def world_objects(self, value: object) -> list[object]:
        return [value]

    def write_state(self, folder: Path, tokenizer, lora_save: str = "merged") -> None:
        from oxrl.training.checkpoint import write_model_state

        write_model_state(folder, self.model, tokenizer, self.optimizer, self.scheduler, lora_save)

    def read_state(self, folder: Path) -> None:
        from oxrl.training.checkpoint import read_model_state

        read_model_state(folder, self.model, self.optimizer, self.scheduler)

    def write_hf_folder(self, tokenizer, out_dir: Path, lora_save: str = "merged") -> Path | None:
        from oxrl.models.save import save_hf_folder

        return save_hf_folder(self.model, tokenizer, out_dir, lora_save=lora_save)

    def policy_state_dict(self) -> dict[str, torch.Tensor] | None:
        if is_peft(self.model):
            from oxrl.models.lora import merged_state_dict  # (LoRA's merge: loaded only with adapters)

            state = merged_state_dict(self.model)
        else:
            state = self.model.state_dict()
        # A copy even on CPU (.cpu() would return the live tensor), like the sharded strategies' gathered one:
        # the next optimizer step never changes what a caller holds.
        return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}

    def close(self) -> None:
        pass
