"""SIGTERM and SIGINT (Ctrl-C) stop a run cleanly, at a step boundary, with a checkpoint to resume from.

    with StopSignals(strategy, checkpoint=cfg.checkpoint.on_signal) as stop:  # oxrl/runner.py, around training
        ... step ...
        if stop.agreed():          # the loop, at each step's end: every rank sees the same answer
            save a checkpoint (when stop.checkpoint); raise stop.stopped(step, run_dir)

A cluster scheduler preempts a job with SIGTERM, then SIGKILL a grace period later; Ctrl-C is SIGINT. The first
signal lets the current step finish (a step cut in half leaves weights and optimizer out of step with each other);
the loop then writes a checkpoint and raises `RunStopped`, which the CLI turns into one line saying how to
continue and the exit code 128 + the signal (130, 143). A second signal abandons the step at once. Outside the
training loop (loading, the final save) `oxrl train` stops at once (`stop_at_once`, installed by oxrl/cli.py): there
is no step to finish.

Under torchrun each rank receives the signal itself, not necessarily before the same step ends, so the ranks sum
their flags (`Strategy.world_sum`) at every step's end and all stop after the same step.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from oxrl.errors import RunStopped

logger = logging.getLogger(__name__)

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """Catches SIGTERM and SIGINT while the block runs (in the main thread, and when `catch`; otherwise nothing is
    installed and `agreed` only joins the other ranks' answer); the previous handlers are back afterwards."""

    def __init__(self, strategy, checkpoint: bool, catch: bool = True):
        self.strategy, self.checkpoint, self.catch = strategy, checkpoint, catch
        self.received: int | None = None
        self.previous: dict = {}

    def __enter__(self) -> StopSignals:
        self.previous = install(self._handle) if self.catch else {}
        return self

    def __exit__(self, *exc) -> None:
        restore(self.previous)

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None:  # the second signal: abandon the step
            stop_at_once(signum, frame)
        self.received = signum
        logger.warning("%s: stopping when this step ends%s (again to stop at once, losing the step)",
                       signal.Signals(signum).name, ", with a checkpoint" if self.checkpoint else "")

    def agreed(self) -> bool:
        """Whether any rank received a signal: the same answer on every rank (a collective: every rank calls it)."""
        return self.strategy.world_sum(float(self.received is not None)) > 0

    def stopped(self, step: int, run_dir: Path) -> RunStopped:
        """What the loop raises after `step`, naming its checkpoint when one was written (on_signal, or periodic)."""
        from oxrl.training.checkpoint_files import STEP_PREFIX

        checkpoint = Path(run_dir) / "checkpoints" / f"{STEP_PREFIX}{step:06d}"
        # A rank that received no signal stops for another's: SIGTERM, what a launcher sends them all.
        return RunStopped(self.received or signal.SIGTERM, step, checkpoint if checkpoint.is_dir() else None)


def stop_at_once(signum: int, frame) -> None:
    """A signal handler that stops where the program is: outside the training loop there is no step to finish."""
    raise RunStopped(signum)


def install(handler) -> dict:
    """`handler` for SIGTERM and SIGINT; the handlers it replaced. Only the main thread may set handlers (Python
    calls them there only): elsewhere, as in a Ray actor, nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, handler) for signum in STOPPING_SIGNALS}


def restore(previous: dict) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
