"""Metrics go to metrics.jsonl and a PNG plot (trackers: tests/integration/test_trackers.py)."""

import pytest

from oxrl.logging.metrics import MetricsFileError, MetricsLogger, read_metrics
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


DAMAGED_ROWS = {
    "not json": r"not JSON: Expecting value \(column 1\)",
    "[1, 2]": r"a JSON list, not an object",
    '{"loss": 1}': r"it has no step",
    '{"step": "3"}': r'its step is "3", not an integer',
    '{"step": true}': r"its step is true, not an integer",
    '{"step": 2.0}': r"its step is 2.0, not an integer",
    "[" * 100_000 + "]" * 100_000: r"its arrays and objects nest deeper than any metrics row",
}


@pytest.mark.parametrize("damaged", list(DAMAGED_ROWS), ids=lambda row: row[:16])
def test_a_damaged_row_before_the_last_is_refused_naming_the_file_and_the_line(tmp_path, damaged):
    """A resume reads metrics.jsonl only to drop the rows after its step: a line it cannot read as a row stops it in
    one line that names the file and the line (blank lines counted), and nothing in the file changes; so do the
    readers of a finished run's rows (report, curves)."""
    text = '{"step": 1, "loss": 0.5}\n\n' + damaged + '\n{"step": 2, "loss": 0.25}\n{"step": 3, "loss": 0.125}\n'
    (tmp_path / "metrics.jsonl").write_text(text)
    expected = rf"^{tmp_path / 'metrics.jsonl'}, line 3: not a metrics row oxRL writes \({DAMAGED_ROWS[damaged]}\); "
    with pytest.raises(MetricsFileError, match=expected):
        MetricsLogger(tmp_path, total_steps=4, start_step=1, progress_bar=False)
    with pytest.raises(MetricsFileError, match=expected):
        read_metrics(tmp_path)
    assert (tmp_path / "metrics.jsonl").read_text() == text
    MetricsLogger(tmp_path, total_steps=4, start_step=0, progress_bar=False).close()  # starting over: all rows go
    assert read_metrics(tmp_path) == []


def test_a_rewind_keeps_the_bytes_of_the_rows_it_keeps(tmp_path):
    """Bytes that are not UTF-8 in a kept row (a metric name written by other code) survive the rewrite."""
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1, "caf\xe9": 1.0}\n{"step": 2, "loss": 2.0}\n')
    MetricsLogger(tmp_path, total_steps=4, start_step=1, progress_bar=False).close()
    assert (tmp_path / "metrics.jsonl").read_bytes() == b'{"step": 1, "caf\xe9": 1.0}\n'
