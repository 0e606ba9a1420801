"""DeepSpeed ZeRO-2/3 (`deepspeed.initialize`) behind the strategy interface.

The DeepSpeed config is generated from ours (`deepspeed_config`), then the user's JSON file
(`strategy.deepspeed_config`) is merged over it. Our loop owns gradient accumulation: it calls
`backward` once per micro-batch and `step` once per optimizer step, with a loss already divided
by the step's global normaliser. DeepSpeed is told so with `gradient_accumulation_steps: 1` (no
loss scaling by it) and `managed_gradient_accumulation: false` (step() is the accumulation
boundary; with DeepSpeed's managed mode and accumulation 1, ZeRO-2 would keep only the last
micro-batch's gradient). The optimizer is the loop's torch AdamW (a "client optimizer"), so no
DeepSpeed C++ optimizer is compiled; on CPU DeepSpeed still builds its shared-memory
communication op once, cached in `<venv>/torch_extensions` (TORCH_EXTENSIONS_DIR).

Checkpoints: DeepSpeed's own sharded checkpoint (`engine.save_checkpoint`, every rank) in
`training_state/deepspeed/`, our scheduler and RNGs beside it, and the HF folder written by rank 0
from the gathered weights (ZeRO-3 gathers the partitioned parameters first). DeepSpeed writes
and reads its shards with torch.save/torch.load (pickles): resume only from checkpoints you wrote.

A companion (`Strategy.companion`, e.g. PPO's critic) is a second engine with the same config but
its own `gradient_clipping`, and its own engine checkpoint in `<name>/training_state/deepspeed/`.

LoRA: the engine wraps the peft model; the optimizer holds only the adapters, so ZeRO shards only
their gradients and state (ZeRO-3 partitions the frozen base weights too). The HF folder follows
`lora.save` from the gathered weights (`MultiProcessStrategy.write_hf_folder`).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

from oxrl.config.schema import StrategyConfig, TrainConfig
from oxrl.training.distributed import DistEnv
from oxrl.training.nonfinite import NonFiniteError, NonFiniteGuard, is_finite, step_name
from oxrl.models.precision import uses_bf16
from oxrl.training.sharded import MultiProcessStrategy
from oxrl.models.load import is_peft

logger = logging.getLogger(__name__)
TAG = "state"  # one DeepSpeed checkpoint per oxRL step folder, so a fixed tag


def merge(base: dict, override: dict) -> dict:
    """`override` over `base`, recursively for nested dicts (a new dict; inputs unchanged)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def deepspeed_config(cfg: StrategyConfig, train: TrainConfig, bf16: bool) -> dict:
    """The DeepSpeed config for our settings, with `cfg.deepspeed_config` (a JSON file) merged over it."""
    zero: dict = {"stage": cfg.zero_stage}
    if cfg.cpu_offload:
        zero["offload_optimizer"] = {"device": "cpu"}
        if cfg.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    config = {
        "train_micro_batch_size_per_gpu": train.micro_batch_size_per_device,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": train.optim.max_grad_norm or 0.0,
        # ZeRO then skips a step whose gradient norm is inf/NaN (it always does in fp32); see `step`.
        "bf16": {"enabled": bf16, "check_grad_overflow": True},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # the loop's torch AdamW
        "zero_force_ds_cpu_optimizer": False,  # keep it when offloading too (no compiled CPU Adam)
        "steps_per_print": 2**31 - 1,  # our logger reports progress
        "wall_clock_breakdown": False,
    }
    if cfg.deepspeed_config is not None:
        path = Path(cfg.deepspeed_config)
        if not path.is_file():
            raise FileNotFoundError(f"strategy.deepspeed_config: {path} is not a file")
        try:
            override = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"strategy.deepspeed_config: {path} is not valid JSON: {error}") from error
        config = merge(config, override)
    return config


class DeepSpeedStrategy(MultiProcessStrategy):
    shard_dir = "deepspeed"

    def __init__(self, env: DistEnv, cfg: StrategyConfig, train: TrainConfig):
        self.device = env.device
        self.rank, self.world_size = env.rank, env.world_size
        self.bf16 = uses_bf16(train.mixed_precision, env.device.type)
        self.config = deepspeed_config(cfg, train, self.bf16)
        self.shards_parameters = self.config["zero_optimization"]["stage"] == 3
        self.max_grad_norm = self.config["gradient_clipping"] or None  # the user's JSON may have changed it
        self.nonfinite = NonFiniteGuard(train.max_nonfinite_steps)
        self.ds_engine = None
        self.scheduler = None

    def companion(self, subject: str, max_grad_norm: float | None) -> DeepSpeedStrategy:
        other = super().companion(subject, max_grad_norm)
        # A copy (DeepSpeed may write into its config); DeepSpeed clips inside engine.step.
        other.config = merge(self.config, {"gradient_clipping": max_grad_norm or 0.0})
        other.ds_engine = None
        return other

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler=None):
        # Compiled ops are cached per virtual environment: a torch upgrade elsewhere never loads a stale one.
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
        import deepspeed

        self.ds_engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=self.config)
        if self.ds_engine.managed_gradient_accumulation():
            raise RuntimeError("this DeepSpeed ignores `managed_gradient_accumulation: false` (needs deepspeed >= 0.19); "
                               "gradient accumulation would be wrong")
        self.model_class_name = type(model.get_base_model() if is_peft(model) else model).__name__
        self.scheduler = scheduler  # stepped here, after the engine's step (DeepSpeed is not given it)
        return self.ds_engine

    def prepare_frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        # Frozen models stay whole on every rank (DeepSpeed's inference sharding is not wired in).
        if self.bf16:
            model = model.to(torch.bfloat16)
        return model

    def autocast(self):
        return nullcontext()  # with bf16 on, DeepSpeed holds the module in bf16 itself

    def backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed averages gradients over ranks; the loss is a share of the GLOBAL loss, so sum instead.
        self.ds_engine.backward(loss * self.world_size)

    def step(self, loss: float | None = None, step: int | None = None) -> float:
        """DeepSpeed's ZeRO optimizer checks the global gradient norm itself: a non-finite one makes it
        skip the update and zero the gradients (every rank alike). We cannot ask it before `engine.step`
        without its internals, so we read the outcome after: a skipped step is counted like the other
        strategies' skips; a non-finite loss whose update was applied anyway (its gradients were finite,
        or a user config turned the check off) may have damaged the weights, and stops the run."""
        self.ds_engine.step()  # reduce, clip, optimizer step (unless skipped), zero the gradients
        applied = self.ds_engine.was_step_applied()
        self.advance_schedule(applied)
        raw_norm = self.ds_engine.get_global_grad_norm()  # None when the config turns the norm off
        norm = float(raw_norm) if raw_norm is not None else float("nan")
        if applied and not (is_finite(loss) and (raw_norm is None or is_finite(norm))):
            subject = f" ({self.nonfinite.subject})" if self.nonfinite.subject else ""
            raise NonFiniteError(
                f"{step_name(step)}{subject}: non-finite loss {loss}, grad norm {norm}, and DeepSpeed applied the update "
                "(it skips only steps whose gradient norm it sees as inf/NaN): the weights may be damaged. Resume from "
                "the last checkpoint with a lower train.optim.lr (or set train.optim.max_grad_norm)"
            )
        self.nonfinite.allow(applied, loss, norm, step)
        return norm

    def trainable_tensors(self):
        # ZeRO-3 keeps each parameter's local partition in `ds_tensor` (the parameter itself is empty).
        return ((name, getattr(p, "ds_tensor", p)) for name, p in self.ds_engine.module.named_parameters() if p.requires_grad)

    def _gathered(self):
        """All of the module's parameters, whole, for the duration of the context (ZeRO-3 partitions them)."""
        if not self.shards_parameters:
            return nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.ds_engine.module.parameters()), modifier_rank=None)

    def trained_module(self) -> torch.nn.Module:
        return self.ds_engine.module

    def gathered_state(self) -> dict[str, torch.Tensor] | None:
        with self._gathered():
            if not self.is_main:
                return None
            return {name: tensor.detach().cpu().clone() for name, tensor in self.ds_engine.module.state_dict().items()}

    def save_shards(self, path: Path) -> None:
        self.ds_engine.save_checkpoint(str(path), tag=TAG, save_latest=False)

    def load_shards(self, path: Path) -> None:
        self.ds_engine.load_checkpoint(str(path), tag=TAG, load_optimizer_states=True, load_lr_scheduler_states=False)
