"""Metrics go to metrics.jsonl, MLflow (sqlite store) and a PNG plot."""

import json

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


def test_mlflow_sqlite_store(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log = MetricsLogger(tmp_path / "run", total_steps=2, progress_bar=False, mlflow_uri=uri, run_name="t", params={"a": 1})
    log.log(1, {"loss": 2.0})
    log.log(2, {"loss": 1.0})
    log.close()
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["oxrl"])
    assert len(runs) == 1 and runs["metrics.loss"].iloc[0] == 1.0 and runs["params.a"].iloc[0] == "1"
