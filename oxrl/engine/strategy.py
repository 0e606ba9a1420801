"""The training-strategy interface every loop uses, the single-device implementation, and the factory.

A loop calls `prepare` once (and uses the model it returns), `backward(loss)` per micro-batch,
`step()` per optimizer step and `all_reduce_sum()` to turn local counts into global ones (for
loss normalisation). Checkpoints and the final Hugging Face folder are written through the
strategy, because sharded state must be saved by every rank. The loop never knows whether it
runs on one device, under FSDP2 (oxrl/engine/fsdp.py) or under DeepSpeed ZeRO
(oxrl/engine/deepspeed_strategy.py).

Gradient reduction across ranks SUMS: a loop's loss is already divided by the GLOBAL
normaliser (all ranks' tokens, pairs, ...), so the step's gradient is the sum of every rank's
gradient. FSDP2 and DeepSpeed average over ranks; their `backward` multiplies the loss by the
world size to undo that average (a reduce op of SUM is not available on every backend: gloo
has no PREMUL_SUM). Hence 1 rank == N ranks, up to float rounding.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from pathlib import Path

import torch

from oxrl.engine import distributed

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

    def step(self) -> float:
        """Clip, step the optimizer and schedule, zero the grads; returns the pre-clip global grad norm."""
        raise NotImplementedError

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
        """The whole model as a Hugging Face folder (every rank must call it); the path on rank 0, else None."""
        raise NotImplementedError

    def close(self) -> None:
        distributed.shutdown()


class SingleDevice(Strategy):
    """One process, CPU or one GPU."""

    def __init__(self, device: torch.device, mixed_precision: str = "auto", max_grad_norm: float | None = None):
        self.device = device
        self.use_bf16_autocast = mixed_precision == "bf16" or (mixed_precision == "auto" and device.type == "cuda")
        self.max_grad_norm = max_grad_norm
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler=None):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        return model

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def all_reduce_sum(self, value: float) -> float:
        return value

    def gather_objects(self, value: object) -> list[object]:
        return [value]

    def save_checkpoint(self, run_dir: Path, step: int, tokenizer, trainer_state: dict, keep_last: int,
                        lora_save: str = "merged") -> Path | None:
        from oxrl.engine.checkpoint import save_checkpoint

        return save_checkpoint(run_dir, step, self.model, tokenizer, self.optimizer, self.scheduler, trainer_state,
                               keep_last=keep_last, lora_save=lora_save)

    def load_checkpoint(self, checkpoint: Path) -> dict:
        from oxrl.engine.checkpoint import load_checkpoint

        return load_checkpoint(checkpoint, self.model, self.optimizer, self.scheduler)

    def save_hf_folder(self, tokenizer, out_dir: Path, lora_save: str = "merged") -> Path | None:
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
    scheduler = None

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

        from oxrl.engine.checkpoint import partial_and_final_dirs, publish_checkpoint, save_rng_state

        tmp, final = partial_and_final_dirs(run_dir, step)
        if self.is_main and tmp.exists():
            shutil.rmtree(tmp)
        distributed.barrier()
        self.save_hf_folder(tokenizer, tmp, lora_save)
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
        from oxrl.engine.checkpoint import load_rng_state, read_trainer_state

        checkpoint = Path(checkpoint)
        trainer_state = read_trainer_state(checkpoint)
        state_dir = checkpoint / "training_state"
        if not self.shards_of(state_dir).is_dir():
            raise FileNotFoundError(f"{checkpoint} holds no {type(self).__name__} shards ({self.shards_of(state_dir)}): "
                                    "it was written by another strategy; resume with that one, or start a new run "
                                    "from its HF folder")
        self.load_shards(self.shards_of(state_dir))
        self.scheduler.load_state_dict(torch.load(state_dir / "scheduler.pt", weights_only=True))
        load_rng_state(state_dir, self.rank)
        logger.info("resumed from %s", checkpoint)
        return trainer_state


STRATEGIES = ("auto", "single", "fsdp2", "deepspeed")


def resolve_strategy_name(name: str, world_size: int) -> str:
    """`auto`: FSDP2 when several processes were launched, else a single device."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy.name {name!r}; valid: {', '.join(STRATEGIES)}")
    if name == "auto":
        return "fsdp2" if world_size > 1 else "single"
    return name


def build_strategy(cfg) -> Strategy:
    """The strategy of `cfg.strategy` for this process (joins torchrun's process group when launched by it)."""
    launched = distributed.launched_world_size()
    name = resolve_strategy_name(cfg.strategy.name, launched)
    if name == "single" and launched > 1:
        raise ValueError(f"strategy.name `single` trains in one process, but {launched} were launched: "
                         "use `fsdp2` or `deepspeed` (or `auto`)")
    if name != "single" and cfg.lora.enabled:
        raise ValueError(f"LoRA under strategy `{name}` is not supported yet: train LoRA in one process, or set lora.enabled: false")
    env = distributed.init_distributed(cfg.run.device, process_group=name != "single")
    if name == "single":
        return SingleDevice(env.device, cfg.train.mixed_precision, cfg.train.optim.max_grad_norm)
    if name == "fsdp2":
        from oxrl.engine.fsdp import FSDP2Strategy

        return FSDP2Strategy(env, cfg.strategy, cfg.train.mixed_precision, cfg.train.optim.max_grad_norm)
    from oxrl.engine.deepspeed_strategy import DeepSpeedStrategy

    return DeepSpeedStrategy(env, cfg.strategy, cfg.train)
