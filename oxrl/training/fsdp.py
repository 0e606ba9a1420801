"""FSDP2 (`torch.distributed.fsdp.fully_shard`): every rank holds 1/N of each parameter, its gradient
and its optimizer state; a layer's full weights exist only while that layer runs.

Sharding units: each decoder layer (the classes a Hugging Face model lists in `_no_split_modules`),
then the root (embeddings, final norm, LM head; tied embeddings stay in one unit). The root stays
gathered after its forward: until the end of the backward in training, and after a forward without
gradient (a frozen reference, scoring, sampling) until the next backward, so a frozen model keeps its
root whole. Mixed precision (`train.mixed_precision: bf16`, or `auto` on a GPU or a CPU with native
bf16) computes in bf16 and reduces gradients in fp32; the stored parameters keep `model.dtype`.
Activation checkpointing is the model's own (`model.gradient_checkpointing`), applied before
sharding; a recomputed layer gathers its weights again.

Checkpoints (see oxrl/training/checkpoint.py for the folder): the HF folder is written by rank 0
from a full state dict gathered to its CPU; the resumable state is a sharded torch DCP checkpoint
of model + optimizer in `training_state/sharded/`, written and read by every rank (so the run
folder must be on a file system every node sees), plus the scheduler and every rank's RNG. A
companion (`Strategy.companion`, e.g. PPO's critic) is sharded with the same policies and keeps
its own HF folder and DCP shards in `<name>/`.

LoRA: the peft model is sharded like any other, its frozen base weights in the same units as the
adapters; FSDP2 reduce-scatters only the gradients that exist, so only the adapters train. The
gathered full state dict carries peft's names; `MultiProcessStrategy` merges it (or writes the
adapter folder) for `lora.save`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from oxrl.config.schema import StrategyConfig
from oxrl.models.precision import uses_bf16
from oxrl.training.distributed import DistEnv
from oxrl.training.nonfinite import NonFiniteGuard
from oxrl.training.strategy import MultiProcessStrategy
from oxrl.models.lora import is_peft

logger = logging.getLogger(__name__)


def layer_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (decoder layers): the classes it declares in `_no_split_modules`."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    return [module for module in model.modules() if type(module).__name__ in names]


def broadcast_from_rank0(model: torch.nn.Module) -> None:
    """Make every rank start from rank 0's weights (e.g. a freshly initialised value or score head)."""
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, src=0)


class FSDP2Strategy(MultiProcessStrategy):
    shards_parameters = True
    shard_dir = "sharded"

    def __init__(self, env: DistEnv, cfg: StrategyConfig, mixed_precision: str, max_grad_norm: float | None,
                 max_nonfinite_steps: int = 3):
        self.device = env.device
        self.rank, self.world_size = env.rank, env.world_size
        bf16 = uses_bf16(mixed_precision, env.device.type)
        # The policy casts parameters for compute; autocast on top would be redundant.
        self.mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        self.offload_policy = CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy()
        self.reshard_after_forward = cfg.reshard_after_forward
        self.max_grad_norm = max_grad_norm
        self.nonfinite = NonFiniteGuard(max_nonfinite_steps)
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        broadcast_from_rank0(model)
        options = dict(mp_policy=self.mp_policy, offload_policy=self.offload_policy,
                       reshard_after_forward=self.reshard_after_forward)
        layers = layer_modules(model)
        if not layers:
            logger.warning("%s declares no decoder-layer classes (_no_split_modules): the whole model is one FSDP "
                           "unit, so every forward gathers all of it", type(model).__name__)
        for layer in layers:
            fully_shard(layer, **options)
        # The root unit (embeddings, final norm, output layer) stays gathered from its forward to the end of its
        # backward, as torch does for a root by default: the chunked log-probs (oxrl/models/lm_head.py) call
        # the output layer after the forward, and again when a chunk is recomputed in the backward.
        fully_shard(model, **{**options, "reshard_after_forward": False})
        return model

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler=None):
        self.model_class_name = type(model.get_base_model() if is_peft(model) else model).__name__
        names = {id(p): name for name, p in model.named_parameters()}
        self._shard(model)
        if optimizer is not None:
            # fully_shard replaces every parameter with a sharded one (same name): point the optimizer,
            # built by the loop on the unsharded model and not stepped yet, at the new ones.
            if optimizer.state:
                raise RuntimeError("FSDP2Strategy.prepare needs an optimizer that has not stepped yet")
            sharded = dict(model.named_parameters())
            for group in optimizer.param_groups:
                group["params"] = [sharded[names[id(p)]] for p in group["params"]]
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        return model

    def prepare_frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        return self._shard(model)

    def backward(self, loss: torch.Tensor) -> None:
        # FSDP averages gradients over ranks; the loss is a share of the GLOBAL loss, so sum instead.
        (loss * self.world_size).backward()

    def clip_gradients(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        # max_norm=inf leaves the gradients as they are and still returns the global norm.
        limit = self.max_grad_norm if self.max_grad_norm is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, limit)
        if hasattr(norm, "full_tensor"):  # a DTensor: the norm over every rank's shards
            norm = norm.full_tensor()
        return float(norm)

    def trainable_tensors(self):
        # This rank's shard of each parameter: checking it needs no collective.
        return ((name, p.to_local() if hasattr(p, "to_local") else p)
                for name, p in self.model.named_parameters() if p.requires_grad)

    def trained_module(self) -> torch.nn.Module:
        return self.model

    def gathered_state(self) -> dict[str, torch.Tensor] | None:
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return full if self.is_main else None  # the other ranks get an empty dict

    def save_shards(self, path: Path) -> None:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=path)

    def load_shards(self, path: Path) -> None:
        # A root that ran a no-grad forward stays unsharded, and set_state_dict expects sharded parameters.
        self.model.reshard()
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
