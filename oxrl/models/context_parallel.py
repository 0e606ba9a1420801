"""Context parallel for packed rows: each row's tokens split over the `cp` ranks of a mesh, attention that keeps every
packed sequence apart, and log-probs laid back in the whole row.

The split balances causal work. The row, padded to a multiple of 2 x cp tokens, is cut into 2 x cp equal chunks
and rank r takes chunks r and 2 cp - 1 - r: an early chunk (few keys to attend to) with a late one (many), as in
Llama 3's context parallel (arXiv:2407.21783, section 3.3.2) and ring attention's zigzag layout. Each token keeps
its own position id, so the rotary embedding is that of the whole row.

Attention gathers keys and values: each rank computes its tokens' queries, keys and values, the keys and values
of every rank are all-gathered (the backward adds each rank's gradient of them and hands each rank its own), and
each run of a rank's queries from one sequence attends to that sequence's keys up to its last query, with its
shared prefix in front for a continuation. That is the varlen layout of oxrl/models/packed_attention.py (a query
segment, a longer key segment, causal from the bottom-right corner), so the same kernels compute it. Why gather
rather than ring or Ulysses: packed rows need a per-sequence mask that changes inside every chunk, which a
gather of all keys gives exactly and simply (Llama 3 chose it for document masks too); with grouped-query
attention the keys and values are a few heads, so the gather costs less than the queries it serves, and it runs on
gloo, which has no all-to-all for Ulysses. Its cost: each layer's keys and values for the whole row are kept on
every rank for the backward (one layer's under activation checkpointing).

The loss needs nothing of this: each target's log-prob (and entropy) is computed on the rank holding the position
that predicts it, and the ranks' values are gathered back into the whole row (`gather_targets`), identical on
every rank of the group. So losses and their normalisers are computed over the whole row exactly as on one rank,
and the gradient of the gather hands each rank that of its own targets. The rows are split before the labels are
read: a target is always the row's next token, never shifted inside a chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from oxrl.data.types import PackedBatch
from oxrl.models.model_inputs import PACKED_ATTENTION, PADDED_FAMILIES, PackedRow, ParallelLayout, hf_config, segment_ends


def context_parallel_refusal(model) -> str | None:
    """Why `model`'s rows cannot be split over context-parallel ranks (a sentence), or None."""
    config = hf_config(model)
    if config.model_type in PADDED_FAMILIES or config.sub_configs:
        return f"the {config.model_type!r} model reads images, and context parallel splits text rows only"
    if getattr(config, "_attn_implementation", None) != PACKED_ATTENTION:
        return (f"it runs attention {getattr(config, '_attn_implementation', None)!r}, and context parallel runs on "
                f"oxRL's packed attention ({PACKED_ATTENTION}: model.attn_implementation auto or packed_sdpa, for a "
                "family without sliding windows or soft-capping)")
    return None


@dataclass(frozen=True)
class KeyGather:
    """What the attention kernel needs to attend over the whole row from one rank's tokens: the group to gather
    keys and values over. The row's `key_index` then indexes the gathered tokens (rank after rank, each in its own
    order)."""

    group: object
    size: int

    def __call__(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [B, H, T_local, D] -> [B, H, size x T_local, D]: every rank's tokens, rank after rank, in
        one collective (and one in the backward)."""
        both = _GatherTokens.apply(torch.stack([key, value]), self.group, self.size)
        return both[0], both[1]


class _GatherTokens(torch.autograd.Function):
    """All-gather along the token dimension (3 of [2, B, H, T, D]). Backward: every rank's gradient of the gathered
    tensor summed, and each rank's own slice returned (each rank's queries attend to every rank's keys)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group, size: int) -> torch.Tensor:
        ctx.group, ctx.size, ctx.rank = group, size, dist.get_rank(group)
        parts = [torch.empty_like(tensor) for _ in range(size)]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        return torch.cat(parts, dim=3)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(ctx.size, dim=3)[ctx.rank], None, None


class _GatherTargets(torch.autograd.Function):
    """Every rank's per-target values [n_r] into one [N] in the row's target order. Backward: this rank's targets'
    gradient, as it is: every rank of the group computes the same loss from the gathered values."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group, size: int, mine: torch.Tensor, counts: list[int], order: torch.Tensor):
        ctx.mine = mine
        width = max(counts)
        padded = local.new_zeros(width)
        padded[: local.numel()] = local
        parts = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(parts, padded, group=group)
        every = torch.cat([part[:count] for part, count in zip(parts, counts)])  # rank after rank
        return every[order]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad[ctx.mine], None, None, None, None, None


@dataclass
class RowShare:
    """One rank's tokens of a packed row under context parallel."""

    index: torch.Tensor  # [T_local] this rank's row positions (padding positions >= the row's length)
    owner: torch.Tensor  # [T_padded] the rank holding each position
    local: torch.Tensor  # [T_padded] each position's index among its owner's tokens
    layout: ParallelLayout

    def local_positions(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Of row positions [N]: which this rank holds (a [N] bool) and their indices among its tokens."""
        mine = self.owner[positions] == self.layout.cp_rank
        return mine, self.local[positions[mine]]

    def gather_targets(self, local: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Values [n] computed at the row positions this rank holds (`local_positions(positions)`'s, in their order)
        -> [N], one per position of `positions` in its order, the same on every rank of the group."""
        owners = self.owner[positions]
        counts = [int((owners == r).sum()) for r in range(self.layout.cp_size)]
        # Position of each target in the rank-after-rank concatenation of the ranks' values.
        rank_major = torch.cat([torch.nonzero(owners == r, as_tuple=True)[0] for r in range(self.layout.cp_size)])
        order = torch.empty_like(rank_major)
        order[rank_major] = torch.arange(rank_major.numel(), device=rank_major.device)
        return _GatherTargets.apply(local, self.layout.cp_group, self.layout.cp_size, owners == self.layout.cp_rank,
                                    counts, order)


def chunk_owners(length: int, size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """For a row of `length` tokens split over `size` ranks: the rank holding each padded position, its index among
    that rank's tokens, and the padded length (a multiple of 2 x size)."""
    chunks = 2 * size
    padded = -(-max(length, 1) // chunks) * chunks
    width = padded // chunks
    chunk = torch.arange(padded) // width
    owner = torch.where(chunk < size, chunk, chunks - 1 - chunk)
    second = chunk >= size  # a rank's late chunk follows its early one
    local = second * width + torch.arange(padded) % width
    return owner, local, padded


def share_row(batch: PackedBatch, layout: ParallelLayout) -> tuple[RowShare, dict]:
    """This rank's share of `batch`'s row and the model inputs that compute it: its tokens' ids and position ids,
    and a `PackedRow` whose query segments are its runs of one sequence and whose keys index the gathered tokens."""
    if batch.vision:
        raise ValueError("context parallel splits text rows only: a row with images keeps them whole "
                         "(set strategy.mesh.cp = 1 for a vision-language model)")
    length = batch.input_ids.shape[1]
    size, rank = layout.cp_size, layout.cp_rank
    owner, local, padded = chunk_owners(length, size)
    device = batch.input_ids.device
    # Padding positions form one extra sequence of their own: no targets, attended by nothing else.
    segment_of = torch.full((padded,), -1, dtype=torch.long)
    for i, s in enumerate(batch.segments):
        segment_of[s.start : s.start + s.length] = i
    flat = owner * (padded // size) + local  # row position -> index among the gathered tokens
    index = torch.nonzero(owner == rank, as_tuple=True)[0]
    index = index[torch.argsort(local[index])]  # this rank's tokens in their local order
    # Runs: this rank's tokens of one sequence at consecutive row positions (a chunk holds pieces of several).
    breaks = torch.ones(len(index), dtype=torch.bool)
    breaks[1:] = (index[1:] != index[:-1] + 1) | (segment_of[index[1:]] != segment_of[index[:-1]])
    starts = torch.nonzero(breaks, as_tuple=True)[0].tolist()
    ends = starts[1:] + [len(index)]
    queries, keys = [], []
    for start, end in zip(starts, ends):
        first, last = int(index[start]), int(index[end - 1])
        seq = int(segment_of[first])
        if seq < 0:  # padding: attends to its own run
            run = torch.arange(first, last + 1)
        else:
            s = batch.segments[seq]
            own = torch.arange(s.start, last + 1)
            run = torch.cat([torch.arange(s.root, s.root + s.shared), own]) if s.shared else own
        queries.append(end - start)
        keys.append(run)
    key_index = torch.cat(keys)
    pad = padded - length
    ids = torch.cat([batch.input_ids[0], batch.input_ids.new_zeros(pad)])[index.to(device)]
    positions = torch.cat([batch.position_ids[0], torch.arange(pad, device=device)])[index.to(device)]
    row = PackedRow((), len(index), segment_ends(queries, device), segment_ends([len(k) for k in keys], device),
                    max(queries), max(len(k) for k in keys), flat[key_index].to(device),
                    gather=KeyGather(layout.cp_group, size))
    share = RowShare(index.to(device), owner.to(device), local.to(device), layout)
    return share, {"input_ids": ids[None], "position_ids": positions[None], "packed_row": row}
