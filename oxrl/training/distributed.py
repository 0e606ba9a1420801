"""Process-group set-up from torchrun's environment, and the few collectives the loops need.

torchrun (or any launcher that sets the same variables) exports RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT for every process. One process group is created per run: NCCL when
the process trains on a GPU, gloo on CPU (gloo also carries the Python-object collectives).
Without those variables the run is a single process and nothing here talks to anyone.

Every collective of the group is bounded by `strategy.collective_timeout_s`: a rank that died or
hangs makes the others fail with an error after that long, instead of waiting forever.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_world_size() -> int:
    """Processes the launcher started (1 when not launched by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(device_name: str = "auto", process_group: bool = False, timeout_s: float = 1800.0) -> DistEnv:
    """Join (or create) the process group described by torchrun's environment variables.

    `device_name` is `run.device`: `auto` trains on this process's GPU (LOCAL_RANK) when CUDA is
    available, else on CPU. A group is created when torchrun started several processes, or when
    `process_group` asks for one (sharded strategies, even on `--nproc_per_node 1`). A plain single
    process gets a world of one and no group, unless one already exists. `timeout_s` bounds every
    collective of the group created here (`strategy.collective_timeout_s`).
    """
    world_size = launched_world_size()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("run.device is `cuda` but no CUDA device is available (see `oxrl doctor`)")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if (world_size > 1 or process_group) and not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            raise ValueError("a sharded strategy needs a process group: launch with torchrun "
                             "(`torchrun --nproc_per_node N -m oxrl train cfg.yaml`; N may be 1)")
        backend = backend_for(device)
        if backend == "nccl" and not dist.is_nccl_available():
            raise RuntimeError("this torch build has no NCCL: multi-GPU training needs it (see `oxrl doctor`)")
        dist.init_process_group(backend=backend, device_id=device if use_cuda else None,
                                timeout=timedelta(seconds=timeout_s))
        logger.info("process group: %s, world size %d, collective timeout %gs", backend, world_size, timeout_s)
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistEnv(rank, local_rank, world_size, device)


def all_reduce_sum(value: float, device: torch.device, group=None) -> float:
    """The sum of `value` over the ranks of `group` (None: every rank)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return value
    # float64 so that token counts and loss sums add exactly on every backend.
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return float(tensor.item())


def all_gather_objects(value: object, group=None) -> list[object]:
    """Every rank's `value` (of `group`; None: every rank), in rank order (a one-element list in a single process)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [value]
    out: list[object] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def shutdown() -> None:
    """Leave the process group (so torchrun's processes exit without a warning)."""
    if dist.is_initialized():
        dist.destroy_process_group()
