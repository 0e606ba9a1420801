"""Progress of a long phase that is not a training step (scoring a reference, say): a bar, or log lines.

    for chunk in progress(chunks, "reference log-probs", unit="batch", bar=cfg.logging.progress_bar):
        ...

With `bar` (and on rank 0: `enabled`), a tqdm bar on stderr, like the training bar of oxrl/logging/metrics.py. Without
one (`logging.progress_bar: false`, a log file), a line when the phase starts and one about every tenth of it, so
that a phase of minutes is never silent. Other ranks show nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

logger = logging.getLogger(__name__)
Item = TypeVar("Item")


def progress(items: Iterable[Item], what: str, *, total: int | None = None, unit: str = "it", bar: bool = True,
             enabled: bool = True) -> Iterator[Item]:
    """`items`, reporting `what` as they are consumed (`total`: their number, when `items` has no len)."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    total = len(items) if total is None else total
    if not enabled:
        yield from items
        return
    if bar:
        with tqdm(items, total=total, desc=what, unit=unit, dynamic_ncols=True) as shown:
            yield from shown
        return
    logger.info("%s: %d %s(s)...", what, total, unit)
    every = max(1, total // 10)
    for done, item in enumerate(items, 1):
        yield item
        if done % every == 0 and done < total:
            logger.info("%s: %d/%d %s(s)", what, done, total, unit)
