"""Mix several datasets by ratio, deterministically by seed.

Sizes: the mixture has `total` items (default: the sum of the dataset sizes). With no weights a
dataset contributes in proportion to its size (so with no `total`, every row exactly once); with
weights (all datasets must set one) dataset i contributes round(total * w_i / sum(w)) items,
rounded by largest remainder so that the counts add up to `total` exactly.

Which items: a dataset asked for `count` items out of `size` contributes `count // size` whole
passes, then a sample of `count % size` distinct items drawn with `Random(f"{seed}:{name}")` - so
adding another dataset to a mix does not change which rows this one contributes. The result keeps
dataset order and, inside a dataset, row order: shuffling is the sampler's job (`data.shuffle`).
"""

from __future__ import annotations

import logging
import math
import random
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


def mixture_counts(sizes: dict[str, int], weights: dict[str, float | None], total: int | None) -> dict[str, int]:
    """How many items each dataset contributes (see the module docstring)."""
    set_weights = {name: w for name, w in weights.items() if w is not None}
    if set_weights and len(set_weights) != len(sizes):
        missing = [name for name in sizes if weights.get(name) is None]
        raise ValueError(
            f"datasets {missing} have no `weight` while others do; set a weight on every training dataset or on none"
        )
    if not set_weights and total is None:
        return dict(sizes)
    ratios = set_weights if set_weights else {name: float(size) for name, size in sizes.items()}
    total = sum(sizes.values()) if total is None else total
    norm = sum(ratios.values())
    if norm <= 0:
        raise ValueError("cannot mix datasets that are all empty")
    quotas = {name: total * ratios[name] / norm for name in sizes}
    counts = {name: math.floor(q) for name, q in quotas.items()}
    # Largest remainder; ties go to the dataset listed first (sorted is stable).
    by_remainder = sorted(sizes, key=lambda name: quotas[name] - counts[name], reverse=True)
    for name in by_remainder[: total - sum(counts.values())]:
        counts[name] += 1
    return counts


def mix(
    datasets: dict[str, list[T]], weights: dict[str, float | None], *, total: int | None, seed: int
) -> tuple[list[T], dict[str, int]]:
    """The mixture (dataset order, then row order) and how many items each dataset contributed."""
    counts = mixture_counts({name: len(items) for name, items in datasets.items()}, weights, total)
    mixture: list[T] = []
    for name, items in datasets.items():
        count = counts[name]
        if count and not items:
            raise ValueError(f"dataset {name!r} has no usable rows but is asked for {count}")
        mixture.extend(items[i] for i in _pick(len(items), count, random.Random(f"{seed}:{name}")))
        passes = count / len(items) if items else 0.0
        logger.info("mix: %s contributes %d of %d rows (%.2f passes)", name, count, len(items), passes)
    return mixture, counts


def _pick(size: int, count: int, rng: random.Random) -> list[int]:
    whole_passes, rest = divmod(count, size) if size else (0, 0)
    return list(range(size)) * whole_passes + sorted(rng.sample(range(size), rest))
