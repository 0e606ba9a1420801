"""A run's own log file and, when a run fails, its traceback: what `oxrl report` puts in a bug report.

    <run>/train.log      every log line of rank 0 for this run, DEBUG included (appended to on resume)
    <run>/failure.txt    the traceback of the exception that stopped the run (removed by a run that ends well); after
                         a SIGTERM or Ctrl-C, the step it stopped after and how to continue (oxrl/training/signals.py)

Both are redacted as they are written (`oxrl.logging.redaction`): no API key or token reaches either file.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oxrl.logging.redaction import RedactingFilter, redact
from oxrl.logging.setup import EarlyRecords

LOG_FILE, FAILURE_FILE = "train.log", "failure.txt"
logger = logging.getLogger(__name__)


@contextmanager
def run_logged(run_dir: Path, is_main: bool) -> Iterator[None]:
    """Rank 0: copy the `oxrl` log to `<run>/train.log` for the block; if the block raises, write the traceback
    to `<run>/failure.txt` and say how to turn both into a bug report. Other ranks: nothing."""
    if not is_main:
        yield
        return
    run_dir = Path(run_dir)
    root = logging.getLogger("oxrl")
    handler = logging.FileHandler(run_dir / LOG_FILE, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    handler.addFilter(RedactingFilter())
    early = [kept for kept in root.handlers if isinstance(kept, EarlyRecords)]
    for kept in early:  # what was logged before this file opened (the strategy's choices), then this run's lines
        root.removeHandler(kept)
        kept.replay(handler)
    root.addHandler(handler)
    try:
        yield
        (run_dir / FAILURE_FILE).unlink(missing_ok=True)  # an earlier failure of this run was resumed past
    except BaseException as error:
        from oxrl.errors import USER_ERRORS
        from oxrl.errors import RunStopped

        if isinstance(error, RunStopped):  # no failure: the CLI says how to continue
            error.run_dir = run_dir
            stopped = f"{error}; continue with run.name={run_dir.name} run.resume=true"
            (run_dir / FAILURE_FILE).write_text(stopped + "\n", encoding="utf-8")
            _file_only(handler, logging.WARNING, stopped)
            raise
        (run_dir / FAILURE_FILE).write_text(redact("".join(traceback.format_exception(error))), encoding="utf-8")
        # The error itself is reported once on the console, by whoever handles it (the CLI), after this file closes:
        # the file gets it here. For what may be a bug, a line says where to go next; a user's own mistake (a missing
        # file, a bad row) is not one.
        if isinstance(error, USER_ERRORS):
            _file_only(handler, logging.ERROR, f"the run stopped with {type(error).__name__}: {error}")
        else:
            logger.info("the run stopped with %s; its traceback is in %s, and `oxrl report %s` writes a bug report to "
                        "paste into an issue", type(error).__name__, run_dir / FAILURE_FILE, run_dir)
        raise
    finally:
        root.removeHandler(handler)
        handler.close()
        for kept in early:
            root.addHandler(kept)


def _file_only(handler: logging.Handler, level: int, message: str) -> None:
    """A line in `train.log` that the console does not get (it gets the CLI's own)."""
    handler.handle(logging.LogRecord(logger.name, level, __file__, 0, message, None, None))
