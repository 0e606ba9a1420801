"""Turning sampled completions into training tensors, and log-probs back into per-completion rows.

A completion is trained as one `Sequence` = prompt tokens + exactly the sampled completion tokens
(never re-tokenised text), with the loss mask on the sampled tokens only (a multi-turn episode's
environment-written tokens are context, not trained). An episode whose context restarted
(`Completion.context_starts`) becomes several sequences of one `Example`, each with its own
positions, so the trainer sees exactly the context the engine saw. Micro-batches pack several
examples in one row; `completion_index` then gathers each completion's trained positions into a
padded [S, L] layout (one row per completion), the one the policy losses take.
"""

from __future__ import annotations

import torch

from oxrl.models.logprobs import token_logprobs
from oxrl.data.sampler import micro_batches
from oxrl.data.types import Example, PackedBatch, Sequence, pack
from oxrl.models.packed_attention import prefix_sharing
from oxrl.rollout.base import Completion


def completion_example(completion: Completion) -> Example:
    """Prompt + completion as one training example: the loss mask is on the sampled tokens only, and
    every context restart begins a new sequence (its first token, written by the environment, is untrained) with the
    images of that context (`Completion.context_vision`)."""
    ids = completion.prompt_ids + completion.completion_ids
    sampled = completion.loss_mask if completion.loss_mask is not None else [True] * len(completion.completion_ids)
    mask = [False] * len(completion.prompt_ids) + list(sampled)
    cuts = [0, *(len(completion.prompt_ids) + start for start in completion.context_starts), len(ids)]
    vision = [completion.vision, *(completion.context_vision or [None] * len(completion.context_starts))]
    return Example([Sequence(ids[a:b], mask[a:b], images) for a, b, images in zip(cuts, cuts[1:], vision)])


def completion_index(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [E, L] of each example's (completion's) trained tokens in the packed row, in order, and
    their mask [E, L]; an example of several sequences (a restarted context) gets one row."""
    mask_row = batch.loss_mask[0]
    positions = torch.nonzero(mask_row, as_tuple=True)[0]  # [N trained tokens], in row order
    owner = batch.seq_example[batch.seq_index[positions]]  # [N]
    counts = torch.bincount(owner, minlength=batch.num_examples)  # [E]
    width = int(counts.max()) if counts.numel() else 0
    starts = torch.cumsum(counts, 0) - counts  # [E]
    column = torch.arange(positions.numel(), device=positions.device) - starts[owner]
    index = torch.zeros(batch.num_examples, width, dtype=torch.long, device=positions.device)
    valid = torch.zeros(batch.num_examples, width, dtype=torch.bool, device=positions.device)
    index[owner, column] = positions
    valid[owner, column] = True
    return index, valid


def policy_rows(model, batch: PackedBatch, temperature: float, with_entropy: bool,
                value_head=None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """Log-probs [S, L] (and entropies; and with PPO's shared `value_head`, the values of the same forward)
    of each completion's trained (sampled) tokens, with the mask [S, L]: (logprobs, entropy, values, valid)."""
    index, valid = completion_index(batch)
    if value_head is not None:
        logprobs, entropy, values = token_logprobs(model, batch, temperature=temperature, with_entropy=with_entropy,
                                                   value_head=value_head)
    elif with_entropy:
        (logprobs, entropy), values = token_logprobs(model, batch, temperature=temperature, with_entropy=True), None
    else:
        logprobs, entropy, values = token_logprobs(model, batch, temperature=temperature), None, None

    def rows(per_token: torch.Tensor | None) -> torch.Tensor | None:  # [T] -> [S, L]
        return None if per_token is None else per_token[index] * valid

    return rows(logprobs), rows(entropy), rows(values), valid


def pad_rows(values: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(values), width)
    for row, value in enumerate(values):
        out[row, : value.numel()] = value
    return out


def score_logprobs(model, completions: list[Completion], micro_size: int, temperature: float) -> list[torch.Tensor]:
    """Per-completion token log-probs under `model` (packed micro-batches, no grad)."""
    return score_logprobs_and_values(model, completions, micro_size, temperature)[0]


@torch.no_grad()
def score_logprobs_and_values(model, completions: list[Completion], micro_size: int, temperature: float,
                              value_head=None) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per-completion token log-probs under `model` (packed micro-batches, no grad) and, with PPO's shared
    `value_head`, the values [len] of every sampled token's state from the same forward passes."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    logprob_rows: list[torch.Tensor] = []
    value_rows: list[torch.Tensor] = []
    for chunk in micro_batches(completions, micro_size):
        batch = pack([completion_example(c) for c in chunk], share_prefixes=prefix_sharing(model)).to(device)
        logprobs, _, values, valid = policy_rows(model, batch, temperature, False, value_head)
        logprob_rows.extend(row[mask].float().cpu() for row, mask in zip(logprobs, valid))
        if values is not None:
            value_rows.extend(row[mask].float().cpu() for row, mask in zip(values, valid))
    model.train(was_training)
    return logprob_rows, value_rows if value_head is not None else None
