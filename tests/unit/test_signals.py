"""StopSignals: the first SIGTERM or SIGINT is held until the loop asks at a step's end, a second stops at once, and
every rank agrees through one sum; the previous handlers are back afterwards (oxrl/training/signals.py)."""

from __future__ import annotations

import os
import signal

import pytest

from oxrl.errors import RunStopped
from oxrl.training.signals import StopSignals


class Ranks:
    """`world_sum` over this rank's flag and those the other ranks raised."""

    def __init__(self, others: float = 0.0):
        self.others = others

    def world_sum(self, value: float) -> float:
        return value + self.others


def test_the_first_signal_waits_for_the_step_end_and_the_second_stops_at_once(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    with StopSignals(Ranks(), checkpoint=True) as stop:
        assert not stop.agreed()
        os.kill(os.getpid(), signal.SIGINT)  # handled here, in the main thread, without raising
        assert stop.agreed()
        (tmp_path / "checkpoints" / "step_000003").mkdir(parents=True)
        stopped = stop.stopped(3, tmp_path)
        assert (stopped.exit_code, stopped.step, stopped.checkpoint) == (130, 3, tmp_path / "checkpoints" / "step_000003")
        assert str(stopped) == f"stopped by SIGINT after step 3, checkpoint {tmp_path}/checkpoints/step_000003"
        with pytest.raises(RunStopped) as again:
            os.kill(os.getpid(), signal.SIGTERM)
        assert again.value.exit_code == 143 and again.value.step is None
    assert signal.getsignal(signal.SIGINT) is before


def test_a_rank_that_heard_no_signal_stops_with_the_others(tmp_path):
    with StopSignals(Ranks(others=1.0), checkpoint=False) as stop:
        assert stop.agreed()
        stopped = stop.stopped(5, tmp_path)
    assert stopped.signum == signal.SIGTERM and stopped.checkpoint is None and stopped.exit_code == 143


def test_a_resume_may_change_on_signal_and_an_older_run_without_it_resumes():
    from oxrl.training.resume_check import config_changes

    saved = {"checkpoint": {"every": 2, "save_final": True}}  # a run saved before checkpoint.on_signal existed
    assert config_changes(saved, {"checkpoint": {"every": 2, "save_final": True, "on_signal": False}}) == []
    assert config_changes(saved, {"checkpoint": {"every": 3, "save_final": True}}) == ["checkpoint.every: 2 -> 3"]
