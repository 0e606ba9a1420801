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
"""

from __future__ import annotations

import logging
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch

from oxrl.training import distributed
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

    nonfinite: NonFiniteGuard  # skipped-step counts; set by each subclass from train.max_nonfinite_steps
    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    scheduler = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler=None):
        """Take ownership of the model, optimizer and schedule; returns the model to call in the loop."""
        raise NotImplementedError

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
        finite = self.all_reduce_sum(float(local_bad)) == 0.0
        return self.nonfinite.allow(finite, loss, grad_norm, step)

    def trainable_tensors(self):
        """(name, this rank's local tensor) of every trainable parameter."""
        return ((name, p) for name, p in self.model.named_parameters() if p.requires_grad)

    def check_finite_weights(self, what: str) -> None:
        """Raise `NonFiniteError` when a trainable parameter holds inf/NaN on any rank (every rank calls it)."""
        local = [name for name, tensor in self.trainable_tensors() if not bool(torch.isfinite(tensor).all())]
        # A count first (one small all-reduce at every save); the names travel only when something is wrong.
        if self.all_reduce_sum(float(len(local))) > 0:
            bad = sorted({name for names in self.gather_objects(local) for name in names})
            raise NonFiniteError(
                f"refusing to write {what}: {len(bad)} trainable parameter(s) hold inf/NaN values "
                f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); earlier checkpoints are kept as they are. "
                "Lower train.optim.lr (or set train.optim.max_grad_norm) and resume from the last good checkpoint"
            )

    def all_reduce_sum(self, value: float) -> float:
        return distributed.all_reduce_sum(value, self.device)

    def gather_objects(self, value: object) -> list[object]:
        return distributed.all_gather_objects(value)

    def save_checkpoint(self, run_dir: Path, step: int, tokenizer, trainer_state: dict, keep_last: int,
                        lora_save: str = "merged") -> Path | None:
        """Write `<run_dir>/checkpoints/step_<step>` (every rank must call it); returns the folder on rank 0."""
        raise NotImplementedError

    def load_checkpoint(self, checkpoint: Path) -> dict:
        """Restore weights, optimizer, schedule and RNG (every rank); returns the trainer state."""
        raise NotImplementedError

    def save_hf_folder(self, tokenizer, out_dir: Path, lora_save: str = "merged") -> Path | None:
        """The whole model as a Hugging Face folder (every rank must call it); the path on rank 0, else None.
        Refuses (`NonFiniteError`) to write weights that hold inf/NaN."""
        self.check_finite_weights(str(out_dir))
        return self.write_hf_folder(tokenizer, out_dir, lora_save)

    def write_hf_folder(self, tokenizer, out_dir: Path, lora_save: str = "merged") -> Path | None:
        """`save_hf_folder` without the check (every rank must call it)."""
        raise NotImplementedError

    def close(self) -> None:
        distributed.shutdown()


class SingleDevice(Strategy):
    """One process, CPU or one GPU."""

    def __init__(self, device: torch.device, mixed_precision: str = "auto", max_grad_norm: float | None = None,
                 max_nonfinite_steps: int = 3):
        self.device = device
        self.use_bf16_autocast = mixed_precision == "bf16" or (mixed_precision == "auto" and device.type == "cuda")
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

    def gather_objects(self, value: object) -> list[object]:
        return [value]

    def save_checkpoint(self, run_dir: Path, step: int, tokenizer, trainer_state: dict, keep_last: int,
                        lora_save: str = "merged") -> Path | None:
        from oxrl.training.checkpoint import save_checkpoint

        self.check_finite_weights(f"checkpoint step {step}")
        return save_checkpoint(run_dir, step, self.model, tokenizer, self.optimizer, self.scheduler, trainer_state,
                               keep_last=keep_last, lora_save=lora_save)

    def load_checkpoint(self, checkpoint: Path) -> dict:
        from oxrl.training.checkpoint import load_checkpoint

        return load_checkpoint(checkpoint, self.model, self.optimizer, self.scheduler)

    def write_hf_folder(self, tokenizer, out_dir: Path, lora_save: str = "merged") -> Path | None:
        from oxrl.models.save import save_hf_folder

        return save_hf_folder(self.model, tokenizer, out_dir, lora_save=lora_save)

    def close(self) -> None:
        pass


class MultiProcessStrategy(Strategy):
    """The checkpoint flow of the sharded strategies; subclasses write and read their shards.

    Every rank: (rank 0) clears a stale partial folder; the HF folder is gathered and written by
    rank 0; every rank writes its shards and RNG into `training_state/<shard_dir>`; rank 0 writes
    the schedule and trainer state, and publishes the folder once every rank is done.
    """

    shard_dir = ""

    def save_shards(self, path: Path) -> None:
        raise NotImplementedError

    def load_shards(self, path: Path) -> None:
        raise NotImplementedError

    def shards_of(self, state_dir: Path) -> Path:
        return state_dir / self.shard_dir

    def save_checkpoint(self, run_dir: Path, step: int, tokenizer, trainer_state: dict, keep_last: int,
                        lora_save: str = "merged") -> Path | None:
        import json
        import shutil

        from oxrl.training.checkpoint import partial_and_final_dirs, publish_checkpoint, save_rng_state
        from oxrl.training.folders import writing_folder

        self.check_finite_weights(f"checkpoint step {step}")
        tmp, final = partial_and_final_dirs(run_dir, step)
        if self.is_main and tmp.exists():
            shutil.rmtree(tmp)
        distributed.barrier()
        # A failed write removes the partial folder (rank 0 owns it) and names the folder; torchrun then
        # stops the other ranks.
        with writing_folder(tmp, final, remove_on_error=self.is_main):
            self.write_hf_folder(tokenizer, tmp, lora_save)
            state_dir = tmp / "training_state"
            state_dir.mkdir(parents=True, exist_ok=True)
            self.save_shards(self.shards_of(state_dir))
            save_rng_state(state_dir, self.rank)
            if self.is_main:
                torch.save(self.scheduler.state_dict(), state_dir / "scheduler.pt")
                (state_dir / "trainer_state.json").write_text(json.dumps({**trainer_state, "step": step}, indent=1))
            distributed.barrier()  # every rank's shards are on disk before the folder is published
            if self.is_main:
                publish_checkpoint(tmp, final, keep_last)
        distributed.barrier()
        return final if self.is_main else None

    def load_checkpoint(self, checkpoint: Path) -> dict:
        from oxrl.training.checkpoint import ConfiguredSchedule, load_rng_state, read_trainer_state, restore_configured

        checkpoint = Path(checkpoint)
        trainer_state = read_trainer_state(checkpoint)
        state_dir = checkpoint / "training_state"
        if not self.shards_of(state_dir).is_dir():
            raise FileNotFoundError(f"{checkpoint} holds no {type(self).__name__} shards ({self.shards_of(state_dir)}): "
                                    "it was written by another strategy; resume with that one, or start a new run "
                                    "from its HF folder")
        configured = ConfiguredSchedule.of(self.scheduler)  # before the shards bring the saved hyper-parameters back
        self.load_shards(self.shards_of(state_dir))
        restore_configured(configured, self.scheduler, torch.load(state_dir / "scheduler.pt", weights_only=True))
        load_rng_state(state_dir, self.rank)
        logger.info("resumed from %s", checkpoint)
        return trainer_state
