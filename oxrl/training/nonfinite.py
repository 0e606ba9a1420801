"""Non-finite training steps: skipped, counted, and fatal when they repeat.

A step whose loss or gradient norm is inf or NaN never reaches the weights: the strategy zeroes
the gradients instead of stepping the optimizer (oxrl/training/strategy.py). The learning-rate
schedule still advances, so that its position stays tied to the step count: a resumed run, or a
run compared with another, sits at the same point of the schedule whatever was skipped.

One skipped step can be a fluke (one bad batch); several in a row mean the weights or the
learning rate are broken, and more steps would only burn compute. After `max_consecutive`
skipped steps in a row (`train.max_nonfinite_steps`) the run stops with a `NonFiniteError`.
Every rank takes the same decision: the strategies all-reduce the finiteness before calling
`NonFiniteGuard.allow` (DeepSpeed: its own all-reduced overflow check), so sharded ranks never
diverge.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

logger = logging.getLogger(__name__)

HINT = "lower train.optim.lr (or set train.optim.max_grad_norm), and check the data of that step"


class NonFiniteError(ValueError):
    """Training produced inf/NaN values that must not reach the weights or a saved model.

    A ValueError because the usual cause is a setting (too high a learning rate): `oxrl train`
    reports the message and exits with status 2, without a traceback.
    """


def is_finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)


def step_name(step: int | None) -> str:
    return f"step {step}" if step is not None else "an optimizer step"


@dataclass
class NonFiniteGuard:
    """Counts skipped steps and decides whether a step may update the weights."""

    max_consecutive: int = 3
    subject: str = ""  # what is trained, when not the policy itself (e.g. "critic"), for messages
    skipped: int = 0  # every skipped step of the run (logged as `train/nonfinite_steps`)
    consecutive: int = 0  # skipped steps since the last good one

    def allow(self, finite: bool, loss: float | None, grad_norm: float, step: int | None) -> bool:
        """True when the step may update the weights; otherwise count it, warn, and raise
        `NonFiniteError` once `max_consecutive` steps in a row were non-finite."""
        if finite:
            self.consecutive = 0
            return True
        self.skipped += 1
        self.consecutive += 1
        where = step_name(step) + (f" ({self.subject})" if self.subject else "")
        values = f"loss {loss}, grad norm {grad_norm}"
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteError(
                f"{where}: non-finite {values}; {self.consecutive} such steps in a row reach "
                f"train.max_nonfinite_steps ({self.max_consecutive}), so the run stops. Fix: {HINT}"
            )
        logger.warning("%s: non-finite %s: update skipped (%d in a row; the run stops at %d)",
                       where, values, self.consecutive, self.max_consecutive)
        return False

    def state_dict(self) -> dict[str, int]:
        return {"nonfinite_steps": self.skipped, "nonfinite_consecutive": self.consecutive}

    def load_state_dict(self, state: dict) -> None:
        """Restore the counts from a trainer state (checkpoints written before they existed hold none)."""
        self.skipped = int(state.get("nonfinite_steps", 0))
        self.consecutive = int(state.get("nonfinite_consecutive", 0))
