"""PPO's critic in the loop: the value of each sampled token's state, and the critic's updates.

The value of the state before completion token t is the critic's output at position t - 1, the same
position whose logits predict token t (see `oxrl.models.logprobs`). The critic is its own model
(oxrl/models/critic.py), trained through a companion of the policy's `Strategy`: prepared and sharded
like the policy, clipped to `rl.critic_max_grad_norm`, stepped on `train.optim`'s schedule at
`rl.critic_lr`, and saved in every checkpoint's `critic/` folder. In a multi-turn episode the
trajectory is its sampled tokens in order; environment-written tokens are context, with no value,
advantage or loss of their own.

With `rl.critic_backbone: shared` the critic is instead a value head on the policy's own backbone
(`SharedValueHead`, oxrl/models/value_head.py): the policy's forward passes give its values, and the update
minimises the policy loss + `rl.value_coef` x the same clipped value loss in one backward and one optimizer step.

The RL loop sees either through the same few calls (`prepare`, `values`, `update`, `metrics`, and
`shared_head`, the head the policy's own passes run, None for a model of its own), so it never asks which; the
policy's step adds a shared head's term to its loss through the head's own `loss_input` and `loss`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oxrl.models.model_inputs import forward_inputs
from oxrl.algorithms.value_loss import ValueLossInput, value_loss
from oxrl.data.sampler import micro_batches
from oxrl.data.types import pack
from oxrl.loops.rl_update import completion_example, completion_index, pad_rows
from oxrl.rollout.base import Completion
from oxrl.training.optim import build_optimizer, build_scheduler


def value_rows(critic, completions: list[Completion], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Critic values [S, L] of the state before each completion token, and the mask [S, L]."""
    batch = pack([completion_example(c) for c in completions]).to(device)
    out = critic(**forward_inputs(critic, batch), use_cache=False)
    values = out.logits[0, :, 0]  # [T]
    index, valid = completion_index(batch)
    return values[(index - 1).clamp(min=0)] * valid, valid


@dataclass
class SharedValueHead:
    """PPO's critic as a head on the policy's backbone: scored in the policy's old-log-prob pass and trained in
    the policy's step (oxrl/loops/rl_update.py), so no model, optimizer or checkpoint folder of its own."""

    head: torch.nn.Module  # the policy's `value_head` submodule (oxrl/models/value_head.py)
    value_coef: float  # weight of the value loss in the one loss
    value_clip: float | None

    @property
    def shared_head(self) -> torch.nn.Module:
        return self.head

    def prepare(self, policy_strategy, cfg, total_updates: int) -> None:
        """Nothing to prepare: the head is one of the policy's parameters, optimised and saved with it."""

    def values(self, completions: list[Completion]) -> None:
        """None: the policy's old-log-prob pass gives the values (`score` in oxrl/loops/rl.py)."""
        return None

    def update(self, completions, old_values, returns, step: int) -> dict[str, float]:
        """Nothing apart: the head learns in the policy's step (`rl_update.policy_step`)."""
        return {}

    def metrics(self) -> dict[str, float]:
        return {}

    def loss_input(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                   normaliser: float | None) -> ValueLossInput:
        """The value loss's input from the policy's forward: values, the rollout's old values and returns, each
        [rows, width], the trained positions, and the tokens the loss is averaged over (all ranks')."""
        return ValueLossInput(values, old_values, returns, mask, normaliser)

    def loss(self, inp: ValueLossInput) -> tuple[torch.Tensor, dict[str, float]]:
        """`value_coef` x the clipped value loss: the head's term of the policy's one loss."""
        loss, metrics = value_loss(inp, clip_eps=self.value_clip)
        return self.value_coef * loss, metrics


@dataclass
class Critic:
    """The value model (as its strategy prepared it), its strategy, and the settings its update reads."""

    model: torch.nn.Module
    strategy: object  # a companion Strategy (oxrl/training/strategy.py)
    micro_batch_size: int
    value_clip: float | None
    shared_head = None  # a model of its own: the policy's passes give no values

    def prepare(self, policy_strategy, cfg, total_updates: int) -> None:
        """Its optimizer and schedule (`train.optim` at `rl.critic_lr`), handed to its strategy, which is
        checkpointed with the policy's."""
        critic_optim = cfg.train.optim.model_copy(update={"lr": cfg.rl.critic_lr})
        optimizer = build_optimizer(self.model, critic_optim, fused=self.strategy.fused_optimizer)
        self.model = self.strategy.prepare(self.model, optimizer, build_scheduler(optimizer, total_updates, critic_optim))
        policy_strategy.attach("critic", self.strategy)

    def metrics(self) -> dict[str, float]:
        return {"critic/nonfinite_steps": self.strategy.nonfinite.skipped}

    @classmethod
    def configured(cls, model: torch.nn.Module, policy_strategy, cfg) -> Critic:
        """`model` as PPO's critic for the run `cfg`: a companion of the policy's strategy with `rl`'s clipping."""
        return cls(model, policy_strategy.companion("critic", cfg.rl.critic_max_grad_norm),
                   cfg.train.micro_batch_size_per_device, cfg.rl.value_clip)

    @torch.no_grad()
    def values(self, completions: list[Completion]) -> list[torch.Tensor]:
        """Per-completion values [len] of every sampled token's state (no grad)."""
        self.model.eval()
        out = []
        for chunk in micro_batches(completions, self.micro_batch_size):
            values, valid = value_rows(self.model, chunk, self.strategy.device)
            out.extend(row[mask].float().cpu() for row, mask in zip(values, valid))
        self.model.train()
        return out

    def update(self, completions: list[Completion], old_values: list[torch.Tensor], returns: list[torch.Tensor],
               step: int) -> dict[str, float]:
        """One optimizer step on the clipped value loss, token-mean over the given completions on every rank."""
        normaliser = self.strategy.all_reduce_sum(float(sum(c.num_sampled for c in completions)))
        sums: dict[str, float] = {}
        for start in range(0, len(completions), self.micro_batch_size):
            chunk = slice(start, start + self.micro_batch_size)
            with self.strategy.autocast():
                values, valid = value_rows(self.model, completions[chunk], self.strategy.device)
            width, device = valid.shape[1], valid.device
            loss, metrics = value_loss(ValueLossInput(values.float(), pad_rows(old_values[chunk], width).to(device),
                                                      pad_rows(returns[chunk], width).to(device), valid, normaliser),
                                       clip_eps=self.value_clip)
            self.strategy.backward(loss)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(value)
        sums = {key: self.strategy.all_reduce_sum(value) for key, value in sums.items()}
        sums["critic/grad_norm"] = self.strategy.step(loss=sums.get("critic/loss"), step=step)
        return sums
