"""Which examples each optimizer step sees: deterministic by seed, resumable from the step number.

The training stream is the concatenation of one permutation per epoch (epoch e is shuffled with
seed + e). Optimizer step s takes the next `global_batch_size` examples of the stream, so a run
resumed at step s sees exactly the data the uninterrupted run would have seen.
"""

from __future__ import annotations

import math
import random

from oxrl.config.schema import TrainConfig


class StepSampler:
    def __init__(self, num_examples: int, global_batch_size: int, seed: int, shuffle: bool = True):
        if num_examples == 0:
            raise ValueError("the training set is empty")
        self.num_examples = num_examples
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.shuffle = shuffle
        self._epochs: dict[int, list[int]] = {}

    def _epoch_order(self, epoch: int) -> list[int]:
        if epoch not in self._epochs:
            order = list(range(self.num_examples))
            if self.shuffle:
                random.Random(self.seed + epoch).shuffle(order)
            self._epochs = {epoch: order}  # keep one epoch: steps only move forward
        return self._epochs[epoch]

    def total_steps(self, train: TrainConfig) -> int:
        """`train.max_steps`, else `train.epochs` passes over the examples (read only then, as the config says)."""
        if train.max_steps is not None:
            return train.max_steps
        return max(1, math.floor(train.epochs * self.num_examples / self.global_batch_size))

    def step_indices(self, step: int) -> list[int]:
        start = step * self.global_batch_size
        indices = []
        for position in range(start, start + self.global_batch_size):
            epoch, offset = divmod(position, self.num_examples)
            indices.append(self._epoch_order(epoch)[offset])
        return indices

    def epoch_of(self, step: int) -> float:
        return step * self.global_batch_size / self.num_examples


def split_for_rank(indices: list[int], rank: int, world_size: int) -> list[int]:
    """A rank's contiguous share of a global batch."""
    share = len(indices) // world_size
    return indices[rank * share : (rank + 1) * share]


def balanced_split(items: list, sizes: list[int], rank: int, world_size: int) -> list:
    """A rank's share of a global batch: the same NUMBER of items on every rank (so every rank runs
    the same number of micro-batches, which sharded strategies need: each forward is a collective),
    and token totals as even as possible.

    Greedy largest-first (LPT) with a capacity of len/world items per rank: items by decreasing
    size (ties by position) each go to the open rank with the fewest tokens so far (ties: lowest
    rank). Its makespan is within 4/3 of the optimum. Deterministic, so a resumed run splits every
    step exactly as the uninterrupted run did. The share keeps the batch's order. The loss does
    not depend on the split: it is normalised by the global count (see oxrl/loops/sl.py).
    """
    if len(items) != len(sizes):
        raise ValueError(f"balanced_split: {len(items)} items but {len(sizes)} sizes")
    if len(items) % world_size:
        raise ValueError(f"balanced_split: {len(items)} items do not divide over {world_size} ranks")
    if world_size == 1:
        return list(items)
    capacity = len(items) // world_size
    loads = [0] * world_size
    members: list[list[int]] = [[] for _ in range(world_size)]
    for position in sorted(range(len(items)), key=lambda i: (-sizes[i], i)):
        target = min((r for r in range(world_size) if len(members[r]) < capacity), key=lambda r: (loads[r], r))
        members[target].append(position)
        loads[target] += sizes[position]
    return [items[i] for i in sorted(members[rank])]


def micro_batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]
