"""Rank-aware logging: rank 0 logs at INFO on the console, other ranks only warnings and errors.

Rank 0's DEBUG lines (what oxRL chose for this machine: the precision, the allocator, the attention kernel) stay off
the console and go to the run's `train.log` (oxrl/logging/run_log.py). Some are logged before the run's directory
exists (while the strategy is built), so they are kept (`EarlyRecords`) until the run's log file opens.
"""

from __future__ import annotations

import logging
import os
from collections import deque

from oxrl.logging.quiet import quiet_other_libraries
from oxrl.logging.redaction import RedactingFilter

EARLY_RECORDS = 200  # at most, the newest kept


class EarlyRecords(logging.Handler):
    """The newest `oxrl` records logged while no run's `train.log` is open, for the next one to begin with."""

    def __init__(self):
        super().__init__()
        self.records: deque[logging.LogRecord] = deque(maxlen=EARLY_RECORDS)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def replay(self, handler: logging.Handler) -> None:
        """Hand the kept records to `handler` (a run's file), once."""
        while self.records:
            handler.handle(self.records.popleft())


def setup_logging(level: str | int = "INFO") -> None:
    rank = int(os.environ.get("RANK", "0"))
    quiet_other_libraries()
    root = logging.getLogger("oxrl")
    if root.handlers:
        return
    handler = logging.StreamHandler()
    prefix = f"[rank {rank}] " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    handler.addFilter(RedactingFilter())  # no API key or token on the console (oxrl.logging.redaction)
    handler.setLevel(level)
    root.addHandler(handler)
    root.addHandler(EarlyRecords())
    root.setLevel(logging.DEBUG if rank == 0 else logging.WARNING)  # rank 0's DEBUG lines: train.log only
    root.propagate = False
