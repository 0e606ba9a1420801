"""Where metrics go: `metrics.jsonl` always, the trackers `logging.report_to` names, and a progress bar.

`metrics.jsonl` holds one row per logged step of the training the run's checkpoint records: a run
that starts at `start_step` (a resume) first drops the rows logged after that step by the process
it replaces (killed after logging a step but before checkpointing it), and a run starting at step
0 starts the file afresh. So after any resume the rows' steps are unique and increasing.
Trackers (MLflow, TensorBoard, Weights & Biases: oxrl/logging/trackers.py, loaded only when
`logging.report_to` names one) get the same rows, their names mapped once by `tracker_name`.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm


if TYPE_CHECKING:
    from oxrl.config.schema import Config
    from oxrl.logging.trackers import Tracker

logger = logging.getLogger(__name__)
# Trackers of the Python API's own (`Trainer(callbacks=...)`, oxrl/trainer.py), set around its run: every MetricsLogger
# opened inside gets them, so the loops need no parameter for them.
EXTRA_TRACKERS: ContextVar[tuple[Tracker, ...]] = ContextVar("oxrl_extra_trackers", default=())


class MetricsLogger:
    """`config` (the run's resolved config) opens the trackers its `logging.report_to` names; without it,
    only metrics.jsonl and the progress bar. A logger with `enabled=False` (ranks other than 0) writes nothing."""

    def __init__(self, run_dir: Path, total_steps: int, start_step: int = 0, *, enabled: bool = True,
                 progress_bar: bool = True, config: Config | None = None):
        self.enabled = enabled  # False on ranks other than 0
        self.path = Path(run_dir) / "metrics.jsonl"
        self.bar = None
        self.trackers: list[Tracker] = list(EXTRA_TRACKERS.get())  # (log() calls none on ranks other than 0)
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keep_rows_up_to(self.path, start_step)
        if config is not None and config.logging.report_to:
            from oxrl.logging.trackers import open_trackers

            self.trackers += open_trackers(config, self.path.parent, start_step)
        if progress_bar:
            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, float], advance: bool = True) -> None:
        if not self.enabled:
            return
        values = {k: float(v) for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "time": time.time(), **values}) + "\n")
        if self.trackers:
            named = {tracker_name(k): v for k, v in values.items()}
            for tracker in self.trackers:
                tracker.log(named, step)
        if self.bar is not None:
            if advance:
                self.bar.update(step - self.bar.n)
            shown = {k: metrics[k] for k in ("loss", "reward/mean", "lr", "tokens_per_s") if k in metrics}
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()})
        else:
            logger.info("step %d %s", step, " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))

    def close(self) -> None:
        """Close the bar and every tracker, each marking its run failed when called while an exception
        propagates (the loops call this from `finally`). A tracker that fails to close does not stop the
        others; its error is raised after them, unless another exception is already on its way out."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        failed = sys.exc_info()[0] is not None
        trackers, self.trackers = self.trackers, []
        errors = []
        for tracker in trackers:
            try:
                tracker.close(failed)
            except Exception as error:  # the other trackers still close; raised or logged below
                logger.error("closing %s failed: %s", type(tracker).__name__, error)
                errors.append(error)
        if errors and not failed:
            raise errors[0]


def tracker_name(key: str) -> str:
    """A metric name every tracker accepts. MLflow allows only letters, digits and `_-./ ` (and `:` outside
    Windows): `val/pass@1` -> `val/pass_at_1`, any other character -> `_`."""
    return re.sub(r"[^\w./ -]", "_", key.replace("@", "_at_"))


class MetricsFileError(ValueError):
    """A line of metrics.jsonl that is not a row oxRL writes (a JSON object with an integer step)."""


def keep_rows_up_to(path: Path, step: int) -> None:
    """Rewrite `path` with only its rows of steps <= `step` (none when `step` is 0: the run starts over,
    its step-0 rows included). A torn last line, from a process killed mid-write, is dropped too; any other
    line that is not a metrics row stops the run (MetricsFileError naming it) before the file is changed."""
    if not path.is_file():
        return
    lines = _lines(path)
    rows = _rows(path, lines) if step > 0 else []  # (starting over: every row goes, whatever it holds)
    kept = [line for (_, line), row in zip(lines, rows) if row["step"] <= step]
    if len(kept) == len(lines):
        return
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8", errors="surrogateescape")
    partial.replace(path)
    logger.info("%s: dropped %d row(s) logged after step %d, the step this run starts from",
                path, len(lines) - len(kept), step)


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of `run_dir`'s metrics.jsonl (without a torn last line); a MetricsFileError names a damaged one."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return _rows(path, _lines(path))


def _lines(path: Path) -> list[tuple[int, str]]:
    """The non-blank lines of `path` and their 1-based numbers; bytes that are not UTF-8 kept as they are (surrogate
    escapes), so that a rewrite changes nothing but the rows it drops."""
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    return [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def _rows(path: Path, lines: list[tuple[int, str]]) -> list[dict]:
    """Each of `lines` (of `path`) parsed as a metrics row, but a last line that is not JSON (torn by a kill)."""
    from oxrl.nesting import too_deep

    rows = []
    for number, line in lines:
        if too_deep(line.encode("utf-8", "surrogateescape")):  # before `json`, which would recurse into it
            problem = "its arrays and objects nest deeper than any metrics row"
        else:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                if number == lines[-1][0]:  # the write a kill interrupted
                    break
                problem = f"not JSON: {error.msg} (column {error.colno})"
            else:
                if not isinstance(row, dict):
                    problem = f"a JSON {type(row).__name__}, not an object"
                elif type(row.get("step")) is not int:  # (not bool, an int subclass; not "3", nor 3.0)
                    problem = f"its step is {json.dumps(row['step'])[:40]}, not an integer" if "step" in row \
                        else "it has no step"
                else:
                    rows.append(row)
                    continue
        raise MetricsFileError(f"{path}, line {number}: not a metrics row oxRL writes ({problem}); correct or delete "
                               "that line (nothing in the file was changed)")
    return rows
