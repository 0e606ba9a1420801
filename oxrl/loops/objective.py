"""The offline-objective interface: how a packed micro-batch becomes the input of a pure loss function.

An `Objective` says what its loss is normalised by (`count_units`: trained tokens, pairs, ...)
and how to compute it (`compute`: forward pass(es) -> pure loss from `oxrl.algorithms`). The
loop sums `count_units` over the whole optimizer step (all micro-batches, all ranks) and passes
that total as the normaliser, which makes gradient accumulation and data parallelism exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from oxrl.algorithms.sft import LossOutput
from oxrl.data.types import PackedBatch


@dataclass
class Objective:
    name: str
    count_units: Callable[[PackedBatch], int]
    compute: Callable[..., LossOutput]  # (model, batch, normaliser, reference=None) -> LossOutput
    needs_reference: bool = False
    # Its examples' sequences may be packed as continuations of a shared prompt (`pack(share_prefixes=True)`): only
    # objectives that read sequence log-prob sums, never a sequence's tokens (a DPO pair's chosen and rejected).
    shares_prefixes: bool = False
