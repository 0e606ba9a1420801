"""Token log-probabilities: the one place oxRL turns a forward pass into log p(token | prefix).

Every objective (SFT, DPO family, KTO, RL policy losses) gets its log-probs from here, so
packing, masking and shifting are done once and tested once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oxrl.data.types import PackedBatch
from oxrl.models.lm_head import OutputHead, chunked_logprobs, output_head, should_chunk
from oxrl.models.model_inputs import layout_of, row_forward


def forward_logits(model, batch: PackedBatch, temperature: float = 1.0) -> torch.Tensor:
    """Logits [T, V] of a packed row. No attention mask and no KV cache, so transformers builds
    the per-sequence (block-diagonal causal) mask from the restarting position ids (a family that cannot
    pack runs as a padded batch: `row_forward`).

    RL divides by the sampling temperature so that the trainer's log-probs describe the same
    distribution the rollout engine sampled from."""
    logits, _ = row_forward(model, batch)
    return logits / temperature if temperature != 1.0 else logits


def selected_logprobs(logits: torch.Tensor, ids: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """log softmax(logits[i])[ids[i]] for rows [N, V] -> [N], computed as -cross_entropy one
    chunk at a time, so no fp32 copy of the whole [N, V] log-softmax is ever held."""
    # `split`, not slicing: the backward of a slice allocates a zeroed [N, V] gradient for every chunk.
    pieces = [-F.cross_entropy(rows.float(), targets, reduction="none")
              for rows, targets in zip(logits.split(chunk_size), ids.split(chunk_size))]
    return torch.cat(pieces) if pieces else logits.new_zeros(0, dtype=torch.float32)


def token_logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """logprobs[t] = log p(input_ids[t] | input_ids[<t]) from full logits [T, V]; logprobs[0] = 0.

    Tokens that start a sequence in a packed row get a meaningless value here; their loss mask
    is always False, so callers never train on them.
    """
    shifted = selected_logprobs(logits[:-1], input_ids[1:])
    return torch.cat([shifted.new_zeros(1), shifted])  # [T]


def token_logprobs(model, batch: PackedBatch, targets: torch.Tensor | None = None, temperature: float = 1.0,
                   with_entropy: bool = False, value_head=None):
    """[T] log-probs of the `targets` tokens of a packed row under `model` (0 elsewhere).

    `targets` [T] bool defaults to the batch's loss mask. Only the positions that predict a target
    go through the lm_head (transformers' `logits_to_keep`): prompt tokens cost a backbone pass
    but no vocabulary projection, which is most of a small model's FLOPs on long prompts.
    With `with_entropy`, also returns the [T] entropy of each target's predictive distribution.
    With `value_head` (final hidden states [N, H] -> [N]: PPO's shared critic, oxrl/models/value_head.py),
    the same forward also gives the [T] value of the state before each target, read where its logits
    are (position t - 1); the result is then (log-probs, entropy or None, values).
    """
    targets = batch.loss_mask[0] if targets is None else targets
    positions = torch.nonzero(targets, as_tuple=True)[0]  # [N] token positions t >= 1
    if positions.numel() and int(positions[0]) == 0:
        raise ValueError("the first token of a packed row has no prediction and cannot be a target")
    # An empty selection still runs one position, so the loss keeps a graph to backpropagate.
    if not positions.numel():
        keep = torch.tensor([0], device=positions.device)
    else:  # the position whose logits predict each target: the one before it, or a shared prefix's end
        keep = positions - 1 if batch.predictor is None else batch.predictor[positions]
    if should_chunk(model, positions.numel()):  # long row: never the whole [N, V] (lm_head.py)
        head = output_head(model)
        if layout_of(model).cp_size > 1:
            if value_head is not None:
                raise ValueError("context parallel computes log-probs only: a value head (PPO's shared critic) "
                                 "needs strategy.mesh.cp = 1")
            return _context_parallel(model, head, batch, positions, keep, temperature, with_entropy)
        check_logits, hidden = row_forward(model, batch, keep, hidden=True, logits_at=0)
        head.check(hidden[:1], check_logits)
        # With no target (a rank that chunks only because another does), no row: `keep`'s one is not scored.
        selected, row_entropy = chunked_logprobs(head, hidden[:positions.numel()], batch.input_ids[0, positions],
                                                 temperature, with_entropy)
        return _laid_out(batch, positions, selected, row_entropy, with_entropy, value_head, hidden)
    logits, hidden = row_forward(model, batch, keep, hidden=value_head is not None)  # [N, V]: row i predicts positions[i]
    if temperature != 1.0:
        logits = logits / temperature
    if positions.numel() == 0:  # no target: zeros that still hold a graph
        return _laid_out(batch, positions, 0.0 * logits.sum()[None], 0.0 * logits.sum()[None], with_entropy,
                         value_head, hidden)
    targets_ids = batch.input_ids[0, positions]
    if with_entropy:
        selected, row_entropy = selected_logprobs_and_entropy(logits, targets_ids)
    else:
        selected, row_entropy = selected_logprobs(logits, targets_ids), None
    return _laid_out(batch, positions, selected, row_entropy, with_entropy, value_head, hidden)


def _context_parallel(model, head: OutputHead, batch: PackedBatch, positions: torch.Tensor, keep: torch.Tensor,
                      temperature: float, with_entropy: bool):
    """`token_logprobs` of a row split over context-parallel ranks (oxrl/models/context_parallel.py): each rank
    scores the targets whose predicting position it holds, and the values are gathered into the whole row."""
    # (loaded only for a split model; the strategy refused a model it cannot split when it took it)
    from oxrl.models.context_parallel import share_row

    share, inputs = share_row(batch, layout_of(model))
    count = positions.numel()
    mine, local_keep = share.local_positions(keep[:count])
    # A rank with no target still runs a forward, and its backward: the other ranks gather keys from it.
    forward_keep = local_keep if local_keep.numel() else torch.zeros(1, dtype=torch.long, device=keep.device)
    check_logits, hidden = row_forward(model, batch, forward_keep, hidden=True, logits_at=0, inputs=inputs)
    if local_keep.numel():
        head.check(hidden[:1], check_logits)
    rows, ids = local_keep.numel(), batch.input_ids[0, positions[mine]]
    # A rank without a target scores the dummy row: every rank's gradients then hold the same parameters (the
    # output layer's too), which FSDP2 reduces together.
    selected, row_entropy = chunked_logprobs(head, hidden, ids if rows else ids.new_zeros(1), temperature, with_entropy)
    anchor = 0.0 * (hidden.sum() + selected.sum())  # keeps every layer of this rank in the loss's graph
    if not count:
        return _laid_out(batch, positions, anchor[None], anchor[None], with_entropy, None, None)
    predictors = keep[:count]
    selected = share.gather_targets(selected[:rows], predictors) + anchor
    if with_entropy:
        row_entropy = share.gather_targets(row_entropy[:rows], predictors) + anchor
    return _laid_out(batch, positions, selected, row_entropy, with_entropy, None, None)


def _laid_out(batch: PackedBatch, positions: torch.Tensor, selected: torch.Tensor, row_entropy: torch.Tensor | None,
              with_entropy: bool, value_head, hidden: torch.Tensor | None):
    """`token_logprobs`' result: the per-target values [N] placed at their positions of the [T] row."""
    values = torch.zeros(batch.input_ids.shape[1], dtype=torch.float32, device=selected.device)
    entropy = torch.zeros_like(values) if with_entropy else None
    if value_head is not None:
        # The final hidden state (after the final norm: what the LM head reads) at the kept positions only.
        head_out = value_head(hidden)  # [N]
        state_values = torch.zeros_like(values)
        state_values = (state_values + 0.0 * head_out.sum() if positions.numel() == 0
                        else state_values.index_put((positions,), head_out))
    if positions.numel() == 0:
        values = values + selected.sum()
        entropy = entropy + row_entropy.sum() if with_entropy else None
    else:
        values = values.index_put((positions,), selected)
        if with_entropy:
            entropy = entropy.index_put((positions,), row_entropy)
    if value_head is not None:
        return values, entropy, state_values
    return (values, entropy) if with_entropy else values


def selected_logprobs_and_entropy(logits: torch.Tensor, ids: torch.Tensor,
                                  chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """`selected_logprobs` and the entropy of each row's distribution ([N, V] -> [N], [N]) from one fp32 log-softmax
    per chunk: the [N, V] softmax is the costliest non-matmul work of an RL update, so it is computed once."""
    selected, entropy = [], []
    for rows, targets in zip(logits.split(chunk_size), ids.split(chunk_size)):
        logp = rows.float().log_softmax(-1)
        selected.append(logp.gather(-1, targets[:, None])[:, 0])
        entropy.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(selected), torch.cat(entropy)


def sequence_sums(values: torch.Tensor, batch: PackedBatch, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of `values` [T] over the trained tokens of each sequence -> [S]."""
    mask = batch.loss_mask[0] if mask is None else mask
    out = values.new_zeros(batch.num_sequences)
    return out.index_add(0, batch.seq_index, values * mask.to(values.dtype))
