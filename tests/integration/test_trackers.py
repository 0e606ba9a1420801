"""Experiment trackers (`logging.report_to`): each one's own files, read back through its own library.

All offline: MLflow writes a sqlite file, TensorBoard event files, wandb runs with WANDB_MODE=offline.
"""

import importlib.util
import json
import struct
import typing
from pathlib import Path

import pytest
import torch

from oxrl.config.load import ConfigError, load_config
from oxrl.config.schema import Config, LoggingConfig
from oxrl.training.strategy import SingleDevice
from oxrl.logging.metrics import MetricsLogger, read_metrics
from oxrl.config.names import TRACKERS
from oxrl.logging.metrics import tracker_name
from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import train_offline
from tests.conftest import make_tiny_llama
from tests.integration.test_tiny_training import copy_task, tiny_config


def config(tmp_path, *report_to: str) -> Config:
    return Config.model_validate({
        "run": {"name": "tracked", "output_dir": str(tmp_path)},
        "model": {"name_or_path": "unused"},
        "algorithm": {"name": "sft"},
        "logging": {"report_to": list(report_to), "progress_bar": False},
    })


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    """wandb in offline mode, its settings and caches in the test's tmp dir: nothing touches the network or ~."""
    wandb = pytest.importorskip("wandb")
    for variable, folder in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home" / folder))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return wandb


def log_three_steps(run_dir: Path, cfg: Config) -> None:
    log = MetricsLogger(run_dir, total_steps=3, progress_bar=False, config=cfg)
    for step in (1, 2, 3):
        log.log(step, {"loss": 1.0 / step, "val/pass@1": 0.25 * step})
    log.close()


# ---- TensorBoard ----

def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir)).Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_event_files_hold_every_row_at_its_step(tmp_path):
    pytest.importorskip("tensorboard")
    cfg = config(tmp_path, "tensorboard")
    log_three_steps(tmp_path / "tracked", cfg)
    scalars = tensorboard_scalars(tmp_path / "tracked" / "tensorboard")
    assert scalars == {"loss": [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))],
                       "val/pass_at_1": [(1, 0.25), (2, 0.5), (3, 0.75)]}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    text = EventAccumulator(str(tmp_path / "tracked" / "tensorboard")).Reload().Tensors("config/text_summary")
    assert '| train.optim.lr | 1e-05 |' in text[0].tensor_proto.string_val[0].decode()


def test_a_resumed_tensorboard_run_hides_the_steps_its_checkpoint_does_not_record(tmp_path):
    """As metrics.jsonl drops them: killed after logging step 3, resumed from step 2."""
    pytest.importorskip("tensorboard")
    cfg = config(tmp_path, "tensorboard")
    log_three_steps(tmp_path / "tracked", cfg)
    resumed = MetricsLogger(tmp_path / "tracked", total_steps=4, start_step=2, progress_bar=False, config=cfg)
    resumed.log(3, {"loss": 30.0})
    resumed.close()
    assert tensorboard_scalars(tmp_path / "tracked" / "tensorboard") == {
        "loss": [(1, 1.0), (2, 0.5), (3, 30.0)], "val/pass_at_1": [(1, 0.25), (2, 0.5)]}


# ---- Weights & Biases ----

def wandb_records(run_dir: Path) -> list:
    """The protobuf records of the one offline run under `run_dir/wandb`. A `.wandb` file is a LevelDB-style log
    (wandb-core writes it; the Python SDK no longer ships a reader): a 7-byte header, then 32 KiB blocks of chunks,
    each `crc32 (4) | length (2, little-endian) | type (1: full, 2: first, 3: middle, 4: last) | data`."""
    import wandb
    from wandb.proto import wandb_internal_pb2

    # run.finish() returns before the wandb-core process has written an offline run's records (seen: the file
    # still held only its header); stopping that process waits for them.
    wandb.teardown()

    [path] = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, position = [], b"", 7
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a chunk header is padding
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if kind == 0:
            break
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(run_dir: Path) -> list[dict]:
    """The logged rows, `_step` included (wandb-core writes `nested_key`; older writers `key`)."""
    return [{item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for record in wandb_records(run_dir) if record.WhichOneof("record_type") == "history"]


def test_wandb_offline_run_holds_the_config_and_every_row_at_its_step(tmp_path, wandb_offline):
    cfg = config(tmp_path, "wandb")
    log_three_steps(tmp_path / "tracked", cfg)
    records = wandb_records(tmp_path / "tracked")
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.project) == ("tracked", "oxrl")
    run_config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert run_config["train.optim.lr"] == 1e-05 and run_config["run.name"] == "tracked"
    assert [(h["_step"], h["loss"], h["val/pass_at_1"]) for h in wandb_history(tmp_path / "tracked")] == [
        (1, 1.0, 0.25), (2, 0.5, 0.5), (3, pytest.approx(1 / 3), 0.75)]
    [exit_record] = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 0


# ---- MLflow ----

def mlflow_runs(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("oxrl")
    return client, client.search_runs([experiment.experiment_id])


def test_mlflow_sqlite_store_holds_the_config_and_every_row_at_its_step(tmp_path):
    pytest.importorskip("mlflow")
    log_three_steps(tmp_path / "tracked", config(tmp_path, "mlflow"))  # default store: <output_dir>/mlflow.db
    client, [run] = mlflow_runs(tmp_path)
    assert (run.info.run_name, run.info.status) == ("tracked", "FINISHED")
    assert run.data.params["train.optim.lr"] == "1e-05" and run.data.params["run.name"] == "tracked"
    assert len(run.data.params) > 100  # more than one log_batch's worth: every config key arrived
    history = client.get_metric_history(run.info.run_id, "val/pass_at_1")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.5), (3, 0.75)]


def test_trackers_mark_a_run_that_raised_as_failed(tmp_path, wandb_offline):
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    log = MetricsLogger(tmp_path / "tracked", total_steps=3, progress_bar=False,
                        config=config(tmp_path, "mlflow", "tensorboard", "wandb"))
    with pytest.raises(RuntimeError, match="boom"):
        try:
            log.log(1, {"loss": 1.0})
            raise RuntimeError("boom")
        finally:
            log.close()
    _, [run] = mlflow_runs(tmp_path)
    assert run.info.status == "FAILED"
    [exit_record] = [r.exit for r in wandb_records(tmp_path / "tracked") if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 1
    assert tensorboard_scalars(tmp_path / "tracked" / "tensorboard") == {"loss": [(1, 1.0)]}


def test_a_tiny_model_run_reaches_every_tracker(tmp_path, wandb_offline):
    """The SL loop builds the trackers from its config: each gets every logged step of a real (tiny) run."""
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    cfg = tiny_config(tmp_path, max_steps=4)
    cfg.logging.report_to = ["mlflow", "tensorboard", "wandb"]
    run_dir = tmp_path / "tiny"
    strategy = SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0)
    train_offline(cfg, get_objective("sft"), make_tiny_llama(), None, copy_task(), [], strategy, run_dir)
    losses = [(row["step"], row["loss"]) for row in read_metrics(run_dir)]
    assert [step for step, _ in losses] == [1, 2, 3, 4]
    assert tensorboard_scalars(run_dir / "tensorboard")["loss"] == [(s, pytest.approx(v)) for s, v in losses]
    client, [run] = mlflow_runs(tmp_path)
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")) == losses
    assert [(h["_step"], h["loss"]) for h in wandb_history(run_dir)] == losses


def test_a_tracker_that_cannot_open_closes_those_already_open(tmp_path, monkeypatch):
    """E.g. wandb online without an API key: the error stops the run, and TensorBoard's writer is closed first."""
    pytest.importorskip("tensorboard")
    from oxrl.logging import trackers

    closed = []
    monkeypatch.setattr(trackers.TensorBoardTracker, "close", lambda self, failed: closed.append(failed))

    def refuse(*args):
        raise RuntimeError("No API key configured")

    monkeypatch.setattr(trackers, "WandbTracker", refuse)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: object())  # wandb "installed"
    with pytest.raises(RuntimeError, match="No API key"):
        MetricsLogger(tmp_path / "tracked", total_steps=1, progress_bar=False,
                      config=config(tmp_path, "tensorboard", "wandb"))
    assert closed == [True]


# ---- ranks, names, config errors ----

def test_ranks_other_than_0_open_no_tracker_and_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: object())  # all "installed"
    cfg = config(tmp_path, "mlflow", "tensorboard", "wandb")
    log = MetricsLogger(tmp_path / "tracked", total_steps=1, enabled=False, config=cfg)
    log.log(1, {"loss": 1.0})
    log.close()
    assert log.trackers == [] and list(tmp_path.iterdir()) == []


def test_tracker_names_are_mapped_to_what_mlflow_accepts():
    assert tracker_name("val/pass@1") == "val/pass_at_1"
    assert tracker_name("reward/my reward:v2!") == "reward/my reward_v2_"
    assert tracker_name("reward/math-verify.score") == "reward/math-verify.score"


def test_the_config_offers_exactly_the_trackers_there_are():
    [names] = typing.get_args(LoggingConfig.model_fields["report_to"].annotation)
    assert typing.get_args(names) == TRACKERS


def test_an_unknown_tracker_is_a_config_error_listing_the_valid_ones():
    with pytest.raises(ConfigError, match=r"`logging.report_to.0` = 'neptune': Input should be 'mlflow', 'tensorboard' "
                                          r"or 'wandb'"):
        load_config(None, ["logging.report_to=[neptune]"], base={"model": {"name_or_path": "m"},
                                                                  "algorithm": {"name": "sft"}})


def test_a_missing_tracker_package_is_a_config_error_naming_its_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    # The package itself, pinned as oxRL's extra pins it: `oxrl` on PyPI is another project.
    with pytest.raises(ConfigError, match=r"tracker package not installed: wandb \(pip install 'wandb>=0.19.10' "
                                          r"\(oxRL's `wandb` extra\)\)"):
        load_config(None, ["logging.report_to=[wandb]"], base={"model": {"name_or_path": "m"}, "algorithm": {"name": "sft"}})


def test_the_old_mlflow_switch_says_what_replaced_it():
    with pytest.raises(ConfigError, match=r"use `logging.report_to: \[mlflow\]`"):
        load_config(None, ["logging.mlflow=true"], base={"model": {"name_or_path": "m"}, "algorithm": {"name": "sft"}})
