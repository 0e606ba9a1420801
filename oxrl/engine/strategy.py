"""The training-strategy interface every loop uses, and the single-device implementation.

A loop calls `backward(loss)` per micro-batch, `step()` per optimizer step and
`all_reduce_sum()` to turn local counts into global ones (for loss normalisation). It never
knows whether it runs on one device or many.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch


class SingleDevice:
    """One process, CPU or one GPU."""

    world_size = 1
    rank = 0
    is_main = True

    def __init__(self, device: torch.device, mixed_precision: str = "auto", max_grad_norm: float | None = None):
        self.device = device
        self.use_bf16 = mixed_precision == "bf16" or (mixed_precision == "auto" and device.type == "cuda")
        self.max_grad_norm = max_grad_norm
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler=None):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        return model

    def autocast(self):
        if self.use_bf16:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        """Clip, step the optimizer and schedule, zero the grads; returns the pre-clip grad norm."""
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
