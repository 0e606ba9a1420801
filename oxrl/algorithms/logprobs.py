"""Token log-probabilities: the one place oxRL turns a forward pass into log p(token | prefix).

Every objective (SFT, DPO family, KTO, RL policy losses) gets its log-probs from here, so
packing, masking and shifting are done once and tested once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oxrl.data.types import PackedBatch


def forward_logits(model, batch: PackedBatch, temperature: float = 1.0) -> torch.Tensor:
    """Logits [T, V] of a packed row. No attention mask and no KV cache, so transformers builds
    the per-sequence (block-diagonal causal) mask from the restarting position ids.

    RL divides by the sampling temperature so that the trainer's log-probs describe the same
    distribution the rollout engine sampled from."""
    out = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    logits = out.logits[0]
    return logits / temperature if temperature != 1.0 else logits


def token_logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """logprobs[t] = log p(input_ids[t] | input_ids[<t]) from logits [T, V]; logprobs[0] = 0.

    Computed as -cross_entropy per chunk of tokens, so no full-vocabulary fp32 log-softmax copy
    of the whole sequence is ever materialised (only one chunk's worth, in fp32).
    Tokens that start a sequence in a packed row get a meaningless value here; their loss mask
    is always False, so callers never train on them.
    """
    targets = input_ids[1:]  # [T-1]
    predictors = logits[:-1]  # [T-1, V]
    pieces = []
    for start in range(0, targets.numel(), chunk_size):
        chunk = predictors[start : start + chunk_size].float()
        pieces.append(-F.cross_entropy(chunk, targets[start : start + chunk_size], reduction="none"))
    shifted = torch.cat(pieces) if pieces else logits.new_zeros(0, dtype=torch.float32)
    return torch.cat([shifted.new_zeros(1), shifted])  # [T]


def token_entropy_from_logits(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """entropy[t] of the distribution that predicts token t (aligned like the log-probs)."""
    predictors = logits[:-1]
    pieces = []
    for start in range(0, predictors.shape[0], chunk_size):
        chunk = predictors[start : start + chunk_size].float()
        logp = chunk.log_softmax(-1)
        pieces.append(-(logp.exp() * logp).sum(-1))
    shifted = torch.cat(pieces) if pieces else logits.new_zeros(0, dtype=torch.float32)
    return torch.cat([shifted.new_zeros(1), shifted])


def token_logprobs(model, batch: PackedBatch) -> torch.Tensor:
    """[T] log-probs of every token of a packed row under `model`."""
    return token_logprobs_from_logits(forward_logits(model, batch), batch.input_ids[0])


def sequence_sums(values: torch.Tensor, batch: PackedBatch, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of `values` [T] over the trained tokens of each sequence -> [S]."""
    mask = batch.loss_mask[0] if mask is None else mask
    out = values.new_zeros(batch.num_sequences)
    return out.index_add(0, batch.seq_index, values * mask.to(values.dtype))
