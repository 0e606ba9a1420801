"""Rank-aware logging: rank 0 logs at INFO, other ranks only warnings and errors."""

from __future__ import annotations

import logging
import os

from oxrl.logging.quiet import quiet_other_libraries
from oxrl.logging.redaction import RedactingFilter


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
    root.addHandler(handler)
    root.setLevel(level if rank == 0 else logging.WARNING)
    root.propagate = False
