"""Where metrics go: `metrics.jsonl` always, MLflow when enabled, and a progress bar."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from tqdm import tqdm

logger = logging.getLogger(__name__)


class MetricsLogger:
    def __init__(self, run_dir: Path, total_steps: int, start_step: int = 0, *, enabled: bool = True,
                 progress_bar: bool = True, mlflow_uri: str | None = None, run_name: str = "", params: dict | None = None):
        self.enabled = enabled  # False on ranks other than 0
        self.path = Path(run_dir) / "metrics.jsonl"
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.bar = None
        self.mlflow = None
        if not enabled:
            return
        if progress_bar:
            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True)
        if mlflow_uri is not None:
            import mlflow

            mlflow.set_tracking_uri(mlflow_uri)
            mlflow.set_experiment("oxrl")
            mlflow.start_run(run_name=run_name)
            if params:
                mlflow.log_params({k: str(v)[:250] for k, v in params.items()})
            self.mlflow = mlflow

    def log(self, step: int, metrics: dict[str, float], advance: bool = True) -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.mlflow is not None:
            self.mlflow.log_metrics({k.replace("@", "_at_"): float(v) for k, v in metrics.items()}, step=step)
        if self.bar is not None:
            if advance:
                self.bar.update(step - self.bar.n)
            shown = {k: metrics[k] for k in ("loss", "reward/mean", "lr", "tokens_per_s") if k in metrics}
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()})
        else:
            logger.info("step %d %s", step, " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.mlflow is not None:
            self.mlflow.end_run()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
