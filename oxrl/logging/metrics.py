"""Where metrics go: `metrics.jsonl` always, MLflow when enabled, and a progress bar.

`metrics.jsonl` holds one row per logged step of the training the run's checkpoint records: a run
that starts at `start_step` (a resume) first drops the rows logged after that step by the process
it replaces (killed after logging a step but before checkpointing it), and a run starting at step
0 starts the file afresh. So after any resume the rows' steps are unique and increasing.
"""

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
            keep_rows_up_to(self.path, start_step)
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


def keep_rows_up_to(path: Path, step: int) -> None:
    """Rewrite `path` with only its rows of steps <= `step` (none when `step` is 0: the run starts over,
    its step-0 rows included). A torn last line, from a process killed mid-write, is dropped too."""
    if not path.is_file():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                break
            raise ValueError(f"{path}, line {number}: not a JSON metrics row ({error})") from None
        if step > 0 and row["step"] <= step:
            kept.append(line)
    if len(kept) == len(lines):
        return
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("".join(f"{line}\n" for line in kept))
    partial.replace(path)
    logger.info("%s: dropped %d row(s) logged after step %d, the step this run starts from",
                path, len(lines) - len(kept), step)


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
