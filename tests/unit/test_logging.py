"""Metrics go to metrics.jsonl and a PNG plot (trackers: tests/integration/test_trackers.py)."""

import pytest

from oxrl.logging.metrics import MetricsLogger, read_metrics
from oxrl.logging.plot import plot_curves


def test_jsonl_and_plot(tmp_path):
    log = MetricsLogger(tmp_path, total_steps=3, progress_bar=False)
    for step in (1, 2, 3):
        log.log(step, {"loss": 1.0 / step, "lr": 1e-3})
    log.close()
    assert [r["loss"] for r in read_metrics(tmp_path)] == [1.0, 0.5, 1.0 / 3]
    png = plot_curves(tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_non_main_ranks_write_nothing(tmp_path):
    MetricsLogger(tmp_path / "r1", total_steps=1, enabled=False).log(1, {"loss": 1.0})
    assert not (tmp_path / "r1").exists()


def test_a_resumed_run_keeps_only_the_rows_its_checkpoint_records(tmp_path):
    """Killed after logging step 3 but before checkpointing it: the resume from step 2 drops row 3 (and a torn
    last line), keeps RL's step-0 evaluation row, and logs step 3 once."""
    log = MetricsLogger(tmp_path, total_steps=4, progress_bar=False)
    log.log(0, {"val/accuracy": 0.1}, advance=False)
    for step in (1, 2, 3):
        log.log(step, {"loss": float(step)})
    log.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "lo')  # the write the kill interrupted
    resumed = MetricsLogger(tmp_path, total_steps=4, start_step=2, progress_bar=False)
    resumed.log(3, {"loss": 30.0})
    resumed.close()
    assert [(r["step"], r.get("loss")) for r in read_metrics(tmp_path)] == [(0, None), (1, 1.0), (2, 2.0), (3, 30.0)]
    MetricsLogger(tmp_path, total_steps=4, start_step=0, progress_bar=False).close()  # starting over
    assert read_metrics(tmp_path) == []


def test_a_malformed_row_before_the_last_is_an_error_naming_the_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2"):
        MetricsLogger(tmp_path, total_steps=4, start_step=1, progress_bar=False)
