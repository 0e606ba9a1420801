"""Turning sampled completions into training tensors, and log-probs back into per-completion rows.

A completion is trained as one `Sequence` = prompt tokens + exactly the sampled completion tokens
(never re-tokenised text), with the loss mask on the completion. Micro-batches pack several such
sequences in one row; `completion_rows` then gathers each completion's positions into a padded
[S, L] layout, the one the policy losses take.
"""

from __future__ import annotations

import torch

from oxrl.algorithms.logprobs import token_logprobs
from oxrl.data.types import Example, PackedBatch, Sequence
from oxrl.rollout.base import Completion


def completion_example(completion: Completion) -> Example:
    ids = completion.prompt_ids + completion.completion_ids
    mask = [False] * len(completion.prompt_ids) + [True] * len(completion.completion_ids)
    return Example([Sequence(ids, mask)])


def completion_index(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [S, L] of each sequence's trained tokens in the packed row, and their mask [S, L]."""
    mask_row = batch.loss_mask[0]
    positions = torch.nonzero(mask_row, as_tuple=True)[0]  # [N trained tokens], in row order
    owner = batch.seq_index[positions]  # [N]
    counts = torch.bincount(owner, minlength=batch.num_sequences)  # [S]
    width = int(counts.max()) if counts.numel() else 0
    starts = torch.cumsum(counts, 0) - counts  # [S]
    column = torch.arange(positions.numel(), device=positions.device) - starts[owner]
    index = torch.zeros(batch.num_sequences, width, dtype=torch.long, device=positions.device)
    valid = torch.zeros(batch.num_sequences, width, dtype=torch.bool, device=positions.device)
    index[owner, column] = positions
    valid[owner, column] = True
    return index, valid


def policy_rows(model, batch: PackedBatch, temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Log-probs [S, L] (and entropies) of each completion's tokens, with the mask [S, L]."""
    index, valid = completion_index(batch)
    if with_entropy:
        logprobs, entropy = token_logprobs(model, batch, temperature=temperature, with_entropy=True)
        return logprobs[index] * valid, entropy[index] * valid, valid
    return token_logprobs(model, batch, temperature=temperature)[index] * valid, None, valid


def pad_rows(values: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(values), width)
    for row, value in enumerate(values):
        out[row, : value.numel()] = value
    return out
