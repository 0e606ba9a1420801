"""What a stopped run leaves: a possible bug points to `oxrl report`; a user's own mistake does not; a run stopped
by a signal leaves, in failure.txt, the step it stopped after and how to continue (oxrl/logging/run_log.py)."""

from __future__ import annotations

import logging
import signal

import pytest

from oxrl.config.load import ConfigError
from oxrl.logging.run_log import run_logged
from oxrl.errors import RunStopped


@pytest.fixture
def oxrl_log(caplog):
    logger = logging.getLogger("oxrl")
    logger.addHandler(caplog.handler)  # (the `oxrl` logger does not propagate once logging is set up)
    caplog.set_level(logging.INFO, logger="oxrl")
    yield caplog
    logger.removeHandler(caplog.handler)


def test_a_possible_bug_points_to_a_report_and_a_users_mistake_does_not(tmp_path, oxrl_log):
    (tmp_path / "bug").mkdir()
    with pytest.raises(KeyError), run_logged(tmp_path / "bug", True):
        raise KeyError("internal")
    assert "`oxrl report" in oxrl_log.text and "KeyError" in (tmp_path / "bug" / "failure.txt").read_text()
    oxrl_log.clear()
    (tmp_path / "mistake").mkdir()
    with pytest.raises(ConfigError), run_logged(tmp_path / "mistake", True):
        raise ConfigError("data.train[0].path: data/missing.jsonl does not exist")
    assert "bug report" not in oxrl_log.text and "oxrl report" not in oxrl_log.text
    assert "missing.jsonl" in (tmp_path / "mistake" / "failure.txt").read_text()  # kept, for whoever asks
    assert "the run stopped with ConfigError: data.train[0].path" in (tmp_path / "mistake" / "train.log").read_text()
    assert "the run stopped" not in oxrl_log.text  # (the console gets the CLI's one line)


def test_a_signalled_stop_names_its_step_and_how_to_continue(tmp_path, oxrl_log):
    run_dir = tmp_path / "grpo-1"
    run_dir.mkdir()
    with pytest.raises(RunStopped) as stopped, run_logged(run_dir, True):
        raise RunStopped(signal.SIGTERM, 4, run_dir / "checkpoints" / "step_000004")
    assert stopped.value.run_dir == run_dir
    assert (run_dir / "failure.txt").read_text() == (f"stopped by SIGTERM after step 4, checkpoint {run_dir}/checkpoints/"
                                                     "step_000004; continue with run.name=grpo-1 run.resume=true\n")
    assert "bug report" not in oxrl_log.text
    assert "stopped by SIGTERM after step 4" in (run_dir / "train.log").read_text()
