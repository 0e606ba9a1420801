"""Weights from trainer rank 0 to every rollout worker: a broadcast over a dedicated process group, in buckets.

The group is its own (a TCP store on rank 0's node and gloo, or NCCL where the trainer holds a GPU, created without
touching the trainers' default group), so trainer ranks keep their FSDP2/DeepSpeed group and rollout workers never
join it. A vLLM rollout worker's members are its engine's own processes, one per tensor-parallel rank
(oxrl/cluster/vllm_transfer.py): the weights go straight into vLLM. Tensors travel
as flat buckets of one dtype, at most `bucket_bytes` each (a larger tensor alone), so neither side ever holds
a second whole copy of the model. Every operation is bounded by the group's timeout: a worker that died or
hangs makes the broadcast fail instead of waiting forever. A restarted worker joins a new generation of the
group (a fresh key prefix in the same store).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

ROOT = 0  # trainer rank 0; rollout worker i is rank i + 1


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # e.g. "float32": torch dtypes by name, so a spec pickles without torch objects

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.torch_dtype).element_size()


def specs_of(state: dict[str, torch.Tensor]) -> list[TensorSpec]:
    return [TensorSpec(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in state.items()]


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Consecutive tensors of one dtype grouped into buckets of at most `bucket_bytes` (a larger tensor: alone)."""
    buckets: list[list[int]] = []
    size = 0
    for i, spec in enumerate(specs):
        fits = buckets and specs[buckets[-1][-1]].dtype == spec.dtype and size + spec.nbytes <= bucket_bytes
        if fits:
            buckets[-1].append(i)
            size += spec.nbytes
        else:
            buckets.append([i])
            size = spec.nbytes
    return buckets


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_address() -> str:
    """This machine's address as other nodes reach it: the one Ray gives the node (the interface of the default
    route), not what the host name resolves to, which is often the loopback."""
    from ray.util import get_node_ip_address

    return get_node_ip_address()


def channel_backend() -> str:
    """The weight group's backend, chosen by trainer rank 0 for every member: NCCL when it holds a GPU."""
    return "nccl" if torch.cuda.is_available() else "gloo"


@dataclass(frozen=True)
class GroupAddress:
    """Where and how a weight group meets: what every member needs to join it (it pickles plainly)."""

    host: str
    port: int
    world_size: int
    generation: int
    timeout_s: float
    backend: str  # "gloo" or "nccl"


class WeightChannel:
    """One member of the weight group: rank ROOT sends, the others receive. All members construct it together
    (the constructor waits for every member, within the timeout). Under NCCL the buffers live on `device`."""

    def __init__(self, address: GroupAddress, rank: int, device: torch.device | None = None):
        timeout = timedelta(seconds=address.timeout_s)
        self.store = dist.TCPStore(address.host, address.port, address.world_size, is_master=rank == ROOT,
                                   timeout=timeout, wait_for_workers=False)
        store = dist.PrefixStore(f"weights-{address.generation}", self.store)
        if address.backend == "nccl":
            # NCCL has no per-group timeout here: the callers' Ray waits (ray.sync_timeout_s) bound a hang instead.
            self.group = dist.ProcessGroupNCCL(store, rank, address.world_size)
            self.device = device or torch.device("cuda", torch.cuda.current_device())
        else:
            self.group = dist.ProcessGroupGloo(store, rank, address.world_size, timeout)
            self.device = torch.device("cpu")
        self.rank, self.address = rank, address

    def send(self, state: dict[str, torch.Tensor], specs: list[TensorSpec], bucket_bytes: int) -> None:
        for bucket in plan_buckets(specs, bucket_bytes):
            flat = torch.cat([state[specs[i].name].detach().reshape(-1).to(self.device) for i in bucket])
            self.group.broadcast(flat, ROOT).wait()

    def receive(self, specs: list[TensorSpec], bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) for every spec, in order; each bucket's tensors are views of one received buffer."""
        for bucket in plan_buckets(specs, bucket_bytes):
            flat = torch.empty(sum(specs[i].numel for i in bucket), dtype=specs[bucket[0]].torch_dtype, device=self.device)
            self.group.broadcast(flat, ROOT).wait()
            offset = 0
            for i in bucket:
                yield specs[i].name, flat[offset : offset + specs[i].numel].view(specs[i].shape)
                offset += specs[i].numel
