"""Weights from trainer rank 0 straight into a vLLM engine, through vLLM's weight-transfer API.

vLLM's public RL API (`LLM.init_weight_transfer_engine`, `start_weight_update`, `update_weights`,
`finish_weight_update`) runs a pluggable transfer engine inside each of its worker processes. oxRL plugs in
`GroupWeightEngine`: every vLLM worker (one per tensor-parallel rank) joins oxRL's weight group
(oxrl/cluster/weight_channel.py: gloo on CPU, NCCL on GPU) as one member, receives the broadcast buckets and
hands each tensor to the model's own `load_weights`, which shards it and fuses q/k/v as it does from a checkpoint.
vLLM's layerwise reload brackets the update, as for its own NCCL engine. No folder is written and the rollout
worker holds no copy of the weights.

The engine is registered in every vLLM process by the `vllm.general_plugins` entry point `register`
(pyproject.toml), the mechanism vLLM loads plugins with; registering only adds the backend name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

BACKEND = "oxrl_group"


def register() -> None:
    """The `vllm.general_plugins` entry point: vLLM calls it once in each of its processes."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    WeightTransferEngineFactory.register_engine(BACKEND, __name__, "GroupWeightEngine")


@dataclass
class GroupJoinInfo(WeightTransferInitInfo):
    """The weight group to join (GroupAddress's fields); this engine's first member rank is `rank_offset`."""

    host: str
    port: int
    world_size: int
    generation: int
    timeout_s: float
    backend: str
    rank_offset: int


@dataclass
class GroupUpdateInfo(WeightTransferUpdateInfo):
    """One broadcast: the tensors in order (TensorSpec's fields), the bucket size, and `aliases`, names to load a
    received tensor under as well (a tied output embedding, which vLLM keeps as its own tensor)."""

    names: list[str]
    shapes: list[list[int]]
    dtypes: list[str]
    bucket_bytes: int
    aliases: dict[str, str] = field(default_factory=dict)


class GroupWeightEngine(WeightTransferEngine[GroupJoinInfo, GroupUpdateInfo]):
    init_info_cls = GroupJoinInfo
    update_info_cls = GroupUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.channel = None

    def init_transfer_engine(self, init_info: GroupJoinInfo) -> None:
        from oxrl.cluster.weight_channel import GroupAddress, WeightChannel

        address = GroupAddress(init_info.host, init_info.port, init_info.world_size, init_info.generation,
                               init_info.timeout_s, init_info.backend)
        self.channel = WeightChannel(address, init_info.rank_offset + self.parallel_config.rank, self.device)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def receive_weights(self, update_info: GroupUpdateInfo) -> None:
        from oxrl.cluster.weight_channel import TensorSpec

        if self.channel is None:
            raise RuntimeError("the oxRL weight group was not joined: call init_weight_transfer_engine first")
        specs = [TensorSpec(name, tuple(shape), dtype)
                 for name, shape, dtype in zip(update_info.names, update_info.shapes, update_info.dtypes)]
        for name, tensor in self.channel.receive(specs, update_info.bucket_bytes):
            self.model.load_weights([(name, tensor)])
            if name in update_info.aliases:
                self.model.load_weights([(update_info.aliases[name], tensor)])

    def shutdown(self) -> None:
        self.channel = None
