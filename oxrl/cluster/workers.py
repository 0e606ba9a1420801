"""The Ray actors of a `run.launcher: ray` run, as plain classes (the driver wraps them with `ray.remote`).

    TrainerWorker   one rank of the trainers' torch.distributed group: runs the RL loop (oxrl/loops/rl.py)
                    with `strategy` exactly as a torchrun process does, its engine being the rollout workers
    RolloutWorker   a rollout engine refreshed from trainer rank 0 over the weight group
                    (oxrl/cluster/weight_channel.py) after every update: vLLM's processes receive the weights
                    themselves (oxrl/cluster/vllm_transfer.py); the hf engine samples from the worker's own copy
    RewardWorker    the run's reward functions, scoring a slice of each step's completions

Only trainer rank 0 talks to the rollout and reward workers (oxrl/cluster/remote_engine.py).
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import replace

import numpy as np
import torch

from oxrl.cluster.weight_channel import GroupAddress, TensorSpec, WeightChannel, free_port, node_address
from oxrl.config.schema import Config
from oxrl.rollout.base import Completion, SamplingParams

logger = logging.getLogger(__name__)


class NoWeightsError(RuntimeError):
    """A rollout worker asked to sample or receive before it joined a weight group and got the trainer's weights:
    Ray restarted it (its process or node died) since the trainer last synced it."""


def _worker_logging() -> None:
    from oxrl.logging.setup import setup_logging

    setup_logging()


def _device() -> torch.device:
    """The GPU Ray gave this actor (it sees only its own), else the CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES") else torch.device("cpu")


class TrainerWorker:
    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    def rendezvous(self) -> tuple[str, int]:
        """Where the trainers' process group meets (asked of rank 0)."""
        return node_address(), free_port()

    def run(self, entry, cfg: Config, remote, master: tuple[str, int]):
        """`entry(cfg, remote)` (oxrl.runner.run_rl) as this rank of a torchrun-like group."""
        os.environ.update({"RANK": str(self.rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(self.world_size),
                           "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1])})
        _worker_logging()
        return entry(cfg, remote)


class RolloutWorker:
    def __init__(self, cfg: Config, index: int):
        from oxrl.models.load import load_model, load_processor, load_tokenizer

        _worker_logging()
        self.index = index
        self.inbox = None  # `ray.interruptible`: where received weights wait for the sampling thread
        rollout = cfg.rl.rollout
        device = torch.device("cpu") if rollout.engine == "vllm" else _device()  # vLLM holds its own GPU copy
        self.tokenizer = load_tokenizer(cfg.model)
        # Plain weights: a LoRA policy's adapters arrive merged into them with every sync.
        self.model = load_model(cfg.model, device, None).eval().requires_grad_(False)
        self.device = device
        self.into_vllm = rollout.engine == "vllm"  # the weights go straight into vLLM's processes
        if self.into_vllm:
            from oxrl.cluster.vllm_transfer import BACKEND
            from oxrl.rollout.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(self.model, self.tokenizer, rollout.vllm, cfg.run.seed + index,
                                     weight_backend=BACKEND, processor=load_processor(cfg.model, self.tokenizer))
            self.model = None  # vLLM holds the weights from here on, and receives every update itself
        else:
            from oxrl.rollout.hf import HFEngine
            from oxrl.models.precision import autocast_for

            # The trainers' precision, so the log-probs it reports are of the numbers they recompute and each sync's
            # probe is checked against theirs (rl.rollout.precision `bf16`, a copy to sample from, is refused under
            # Ray: its log-probs miss the check's tolerance); and rl.rollout.decode, as the engine in one process.
            decoding = {"autocast": autocast_for(cfg.train.mixed_precision, device.type), "decode": rollout.decode}
            if cfg.ray.interruptible:  # new weights reach it while it samples (oxrl/cluster/interruptible.py)
                from oxrl.cluster.interruptible import InterruptibleEngine, WeightInbox

                self.inbox = WeightInbox(self.model, lambda ids: self.engine.probe_logprobs(ids))
                self.engine = InterruptibleEngine(self.model, self.tokenizer, rollout.max_batch_size, **decoding,
                                                  inbox=self.inbox)
            else:
                self.engine = HFEngine(self.model, self.tokenizer, rollout.max_batch_size, **decoding)
        self.channel: WeightChannel | None = None
        self.joined = self.synced = False  # a restarted worker is neither: it must not sample its initial weights

    def ready(self) -> int:
        """The worker's process id, once its engine is up."""
        return os.getpid()

    def members(self) -> int:
        """How many members of the weight group this worker brings: one per vLLM process, else itself."""
        return self.engine.members if self.into_vllm else 1

    def join(self, address: GroupAddress, rank_offset: int) -> None:
        """Join the weight group as members `rank_offset` onwards (blocks until the whole group has met)."""
        if self.into_vllm:
            self.engine.join_weight_group(address, rank_offset)
        else:
            self.channel = WeightChannel(address, rank_offset, self.device)
        self.joined = True

    @torch.no_grad()
    def receive_weights(self, specs: list[TensorSpec], bucket_bytes: int, probe: list[int], version: int) -> list[float]:
        """Take the broadcast weights of `version` (into vLLM, or into this worker's model) and return the probe's
        log-probs under what the engine now samples from. `ray.interruptible`: this runs beside a request being
        sampled, which takes the weights at its next round (`WeightInbox`)."""
        if not self.joined:
            raise NoWeightsError(f"rollout worker {self.index} was restarted and has not joined the weight group")
        if self.into_vllm:
            self.engine.receive_broadcast(specs, bucket_bytes)
            self.synced = True
            return self.engine.probe_logprobs(probe).tolist()
        own = self.model.state_dict()
        unknown = sorted({s.name for s in specs} - set(own))
        if unknown:
            raise KeyError(f"rollout worker {self.index}: the trainer sent weights this model does not have: {unknown[:5]}")
        if self.inbox is not None:  # (each bucket is a buffer of its own: the views hold the second copy)
            probed = self.inbox.deliver(dict(self.channel.receive(specs, bucket_bytes)), version, probe)
            self.synced = True
            return probed
        for name, tensor in self.channel.receive(specs, bucket_bytes):
            own[name].copy_(tensor)
        self.synced = True
        return self.engine.probe_logprobs(probe).tolist()

    def generate(self, prompts: list[list[int]], params: SamplingParams, vision=None, version: int = 0) -> list[Completion]:
        """The completions of a request submitted under weights `version` (the trainer's count of syncs): under
        `ray.interruptible` each token's `newer_by` counts the syncs it came after."""
        if not self.synced:
            raise NoWeightsError(f"rollout worker {self.index} was restarted and holds no weights of the trainer yet")
        if params.seed is not None:  # the hf engine samples from torch's RNG: seed it for the call
            random.seed(params.seed)
            np.random.seed(params.seed % 2**32)
            torch.manual_seed(params.seed)
        if self.inbox is not None:
            completions = self.engine.generate(prompts, params, vision, since=version)
        else:
            completions = self.engine.generate(prompts, params, vision)
        self.engine.offload()
        return [replace(c, vision=None) for c in completions]  # the driver holds each prompt's images

    def offload(self) -> None:
        self.engine.offload()


class RewardWorker:
    def __init__(self, cfg: Config):
        from oxrl.loops.rl_setup import reward_function

        _worker_logging()
        self.reward_fn = reward_function(cfg, cfg.rl)

    def ready(self) -> int:
        """The worker's process id, once its reward functions are loaded."""
        return os.getpid()

    def score(self, prompts, completions, fields, origins, completion_ids):
        return self.reward_fn(prompts, completions, fields, origins, completion_ids)
