"""AdamW and the learning-rate schedule."""

from __future__ import annotations

import math

import torch

from oxrl.config.schema import OptimConfig


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, fused: bool = False) -> torch.optim.AdamW:
    """AdamW; weight decay skips biases and norm weights (1-D parameters), as is standard.

    `fused` (`Strategy.fused_optimizer`): torch's fused kernel, one pass over each parameter's weights, gradient and
    moments. Without it torch's default on a CPU is a loop of separate element-wise ops per parameter: 0.18-0.36 s
    a step for SmolLM2-135M on 2 cores, against 0.04-0.06 s fused (the same update up to float rounding)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None)


def lr_factor(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based)."""
    warmup = cfg.warmup_steps or int(cfg.warmup_ratio * total_steps)
    decay = DECAYS.get(cfg.schedule)  # None: constant
    # The whole schedule is read at every step, warming up or not, and the floor only where the lr decays to it.
    floor = cfg.min_lr_ratio if decay is not None else 1.0
    if step < warmup:
        return (step + 1) / warmup
    if decay is None:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return floor + (1.0 - floor) * decay(progress)


# After warmup the lr falls from `lr` (progress 0) to `min_lr_ratio * lr` (progress 1) along one of these;
# `constant` stays at `lr`.
DECAYS = {
    "linear": lambda progress: 1.0 - progress,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
}


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, cfg: OptimConfig):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))
