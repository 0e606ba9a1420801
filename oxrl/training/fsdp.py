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

Tensor and context parallel (`strategy.mesh`): the ranks form a mesh of (dp_shard, cp, tp), tp innermost, so the
ranks that split one layer are neighbours (one node). Two views of it, as in RL2: the parameter mesh (dp_shard x cp,
tp), whose `tp` dimension the layers are split over (oxrl/models/parallel.py) and whose first dimension FSDP2
shards over; and the data mesh (dp_shard, cp, tp), whose `dp_shard` ranks see different rows (`Strategy.data_rank`)
and whose `cp` ranks split each row's tokens (oxrl/models/context_parallel.py). FSDP2 is handed the 1-D `dp_shard x cp`
mesh: a 2-D slice would give hybrid sharding (replicated over one dimension), not the sharding asked for. A
context-parallel rank's gradient holds its own tokens' share, so gradients are summed over dp_shard x cp ranks; a
tensor-parallel rank's is its slice of the whole. The checkpoint's DTensor shards load under any other mesh (torch
DCP reshards them), and the HF folder is gathered whole.

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

from oxrl.config.schema import MeshConfig, StrategyConfig
from oxrl.models.context_parallel import context_parallel_refusal
from oxrl.models.model_inputs import ParallelLayout, set_layout
from oxrl.models.parallel import apply_tensor_parallel
from oxrl.models.precision import uses_bf16
from oxrl.training.distributed import DistEnv
from oxrl.training.nonfinite import NonFiniteGuard
from oxrl.training.sharded import MultiProcessStrategy
from oxrl.models.load import is_peft

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


def data_parallel_size(world_size: int, mesh: MeshConfig) -> int:
    """dp_shard: the world size over tp x cp; a clear error where the mesh does not tile the world."""
    split = mesh.tp * mesh.cp
    if world_size % split:
        raise ValueError(f"strategy.mesh: tp x cp = {mesh.tp} x {mesh.cp} = {split} does not divide the {world_size} "
                         "processes launched (torchrun --nproc_per_node)")
    dp = world_size // split
    if mesh.dp_shard is not None and mesh.dp_shard != dp:
        raise ValueError(f"strategy.mesh: dp_shard x cp x tp = {mesh.dp_shard} x {mesh.cp} x {mesh.tp} must equal the "
                         f"{world_size} processes launched (dp_shard {dp} would; or leave dp_shard unset)")
    return dp


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
        self.shard_mesh, self.tp_mesh, self.layout = None, None, ParallelLayout()
        self.gradient_ranks = env.world_size  # the ranks whose gradients add up to the step's (FSDP2 averages them)
        tp, cp = cfg.mesh.tp, cfg.mesh.cp
        dp = data_parallel_size(env.world_size, cfg.mesh)
        if tp * cp > 1:
            from torch.distributed.device_mesh import DeviceMesh

            ranks = torch.arange(env.world_size)
            parameters = DeviceMesh(env.device.type, ranks.reshape(dp * cp, tp), mesh_dim_names=("shard", "tp"))
            data = DeviceMesh(env.device.type, ranks.reshape(dp, cp, tp), mesh_dim_names=("dp", "cp", "tp"))
            self.shard_mesh, self.tp_mesh = parameters["shard"], parameters["tp"]
            self.layout = ParallelLayout(self.tp_mesh.get_group(), tp, self.tp_mesh.get_local_rank(),
                                         data["cp"].get_group(), cp, data["cp"].get_local_rank())
            self.data_coordinates, self.data_group = (data["dp"].get_local_rank(), dp), data["dp"].get_group()
            self.gradient_ranks = dp * cp
            if self.is_main:
                logger.info("mesh: dp_shard %d x cp %d x tp %d; FSDP2 shards over %d ranks", dp, cp, tp, dp * cp)

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        refusal = context_parallel_refusal(model) if self.layout.cp_size > 1 else None
        if refusal:
            raise ValueError(f"strategy.mesh.cp = {self.layout.cp_size} cannot split this model's rows: {refusal}")
        broadcast_from_rank0(model)
        if self.layout.tp_size > 1:
            apply_tensor_parallel(model, self.tp_mesh)
        set_layout(model, self.layout)
        options = dict(mp_policy=self.mp_policy, offload_policy=self.offload_policy,
                       reshard_after_forward=self.reshard_after_forward, mesh=self.shard_mesh)
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
        (loss * self.gradient_ranks).backward()

    def clip_gradients(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.layout.tp_size > 1:
            return self._clip_over_meshes(params)
        # max_norm=inf leaves the gradients as they are and still returns the global norm.
        limit = self.max_grad_norm if self.max_grad_norm is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, limit)
        if hasattr(norm, "full_tensor"):  # a DTensor: the norm over every rank's shards
            norm = norm.full_tensor()
        return float(norm)

    def _clip_over_meshes(self, params: list[torch.nn.Parameter]) -> float:
        """`clip_gradients` where parameters live on two meshes (the split layers on shard x tp, the rest on shard):
        each rank's squared norm of its pieces, each piece divided by the ranks that hold a copy of it, summed in one
        all-reduce over every rank; then torch's clipping coefficient, applied to every piece."""
        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        grads = [p.grad for p in params if p.grad is not None]
        for grad in grads:
            mesh, placements = grad.device_mesh, grad.placements
            if any(placement.is_partial() for placement in placements):
                raise RuntimeError(f"a gradient still holds partial sums ({placements}) at clipping time")
            copies = self.world_size // mesh.size()  # the sub-meshes alike to this one, one per other coordinate
            for dim, placement in enumerate(placements):
                copies *= mesh.size(dim) if placement.is_replicate() else 1
            squares += grad.to_local().double().pow(2).sum() / copies
        dist.all_reduce(squares)
        norm = squares.sqrt().float()
        if self.max_grad_norm is not None:
            coefficient = float(torch.clamp(self.max_grad_norm / (norm + 1e-6), max=1.0))
            for grad in grads:
                grad.mul_(coefficient)
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
