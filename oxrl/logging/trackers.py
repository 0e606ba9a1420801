"""Experiment trackers named by `logging.report_to`: MLflow, TensorBoard, Weights & Biases.

Each goes through its own library, imported only when the config asks for it (importing them takes
seconds), and does three things: record the flattened config once, log every metrics row at its
step, and close - marking the run failed when an exception is on its way out, as in the loops'
`finally` blocks. Only rank 0 opens them (`MetricsLogger(enabled=...)`). `oxrl.config.names.check_trackers` finds a
missing package when the config is validated, before any model loads.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from oxrl.config.load import flatten

if TYPE_CHECKING:
    from oxrl.config.schema import Config


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None:
        """One step's metrics, their names mapped by `tracker_name` (oxrl/logging/metrics.py)."""

    def close(self, failed: bool) -> None: ...


def mlflow_tracking_uri(cfg: Config, run_dir: Path) -> str:
    """`logging.mlflow_tracking_uri`, or one SQLite store beside the runs of `run.output_dir`."""
    return cfg.logging.mlflow_tracking_uri or f"sqlite:///{Path(run_dir).resolve().parent / 'mlflow.db'}"


def open_trackers(config: Config, run_dir: Path, start_step: int) -> list[Tracker]:
    """The trackers `config.logging.report_to` names, open; if one fails to open, those already open are closed."""
    settings, name = config.logging, config.run.name
    params = flat_config(config)
    opened: list[Tracker] = []
    try:
        for tracker in settings.report_to:
            if tracker == "mlflow":
                opened.append(MLflowTracker(mlflow_tracking_uri(config, run_dir), settings.project, name, params))
            elif tracker == "tensorboard":
                opened.append(TensorBoardTracker(run_dir / "tensorboard", params, start_step))
            else:
                opened.append(WandbTracker(run_dir, settings.project, name, params))
    except BaseException:
        for done in opened:
            done.close(failed=True)
        raise
    return opened


def flat_config(config: Config) -> dict[str, Any]:
    """{"train.optim.lr": 1e-06, ...}: every leaf of the resolved config under its dotted key."""
    return {key: value for key, value in flatten(config.model_dump(mode="json")).items() if value != {}}


class MLflowTracker:
    """One MLflow run in experiment `experiment`, through `MlflowClient` (no global active run to leak)."""

    def __init__(self, uri: str, experiment: str, run_name: str, params: dict[str, Any]):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        values = [Param(key, str(value)[:250]) for key, value in params.items()]
        for start in range(0, len(values), 100):  # log_batch takes at most 100 params
            self.client.log_batch(self.run_id, params=values[start:start + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class TensorBoardTracker:
    """Event files in `log_dir` (`<run dir>/tensorboard`), the config as a text summary."""

    def __init__(self, log_dir: Path, params: dict[str, Any], start_step: int):
        from torch.utils.tensorboard import SummaryWriter

        # A resume hides the events a killed process logged after its checkpoint's step, as metrics.jsonl drops
        # those rows; a run starting at step 0 hides all earlier events.
        self.writer = SummaryWriter(str(log_dir), purge_step=start_step + 1 if start_step else 0)
        rows = "\n".join(f"| {key} | {json.dumps(value)} |" for key, value in params.items())
        self.writer.add_text("config", f"| key | value |\n|---|---|\n{rows}", global_step=start_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self, failed: bool) -> None:
        self.writer.close()


class WandbTracker:
    """One Weights & Biases run, its files under `<run dir>/wandb`. `WANDB_MODE` (`offline`, `disabled`),
    `WANDB_ENTITY` and the API key come from the environment, as wandb reads them."""

    def __init__(self, run_dir: Path, project: str, run_name: str, params: dict[str, Any]):
        import wandb

        # create_new: a run of the caller's own (e.g. a notebook's) stays open beside ours.
        self.run = wandb.init(project=project, name=run_name, dir=str(run_dir), config=params, reinit="create_new")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)
