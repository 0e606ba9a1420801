"""Files that are not data: a FIFO a reader would wait on forever, and a check that a call returns at once
however it treats one (so that a test of a FIFO fails, rather than hangs, where the FIFO is opened)."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path


def make_fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def raised_within(seconds: float, call: Callable[[], object], fifos: list[Path]) -> BaseException | None:
    """What `call` raised (None if it returned), run in a thread; AssertionError if it still runs after `seconds`
    (it then waits on one of `fifos`: each is opened for writing and closed, so that the waiting read ends)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - handed to the test, which asserts on it
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a blocked reader sees end-of-file
            except OSError as error:
                if error.errno != errno.ENXIO:  # ENXIO: no reader waits on this one
                    raise
        thread.join(seconds)
        raise AssertionError(f"still running after {seconds} s: it waited on a FIFO")
    return outcome[0]
