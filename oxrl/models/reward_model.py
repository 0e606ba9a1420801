"""Reward models: a sequence classifier with one output, scored on packed rows.

The model is `AutoModelForSequenceClassification(num_labels=1)` built from the policy's weights
(transformers adds a fresh `score` head, a linear map of the last hidden state to one number), so
the trained folder is a plain HF checkpoint that `from_pretrained` loads for scoring.

A sequence's score is the head's output at its last token that is not the pad token: exactly
the token transformers' own forward pools at, so the scores we train are the ones users get
from the saved model. That forward returns only the pooled [B, 1] scores (of the row's last
non-pad token), which for a packed row would be one score for all its sequences. So on packed
rows we run its two stages ourselves (the base transformer with restarting position ids, then
the head: per-token scores [1, T, 1]) and gather each sequence's last non-pad position.
"""

from __future__ import annotations

import logging

import torch

from oxrl.models.model_inputs import forward_inputs
from oxrl.config.schema import ModelConfig
from oxrl.data.types import PackedBatch

logger = logging.getLogger(__name__)


def load_reward_model(cfg: ModelConfig, device: torch.device, pad_token_id: int):
    """A one-output sequence classifier from `cfg.name_or_path`; `pad_token_id` goes into its config
    so that the saved model scores padded batches (transformers needs it to find the last token)."""
    from transformers import AutoModelForSequenceClassification

    from oxrl.models.load import compile_blocks, enable_activation_checkpointing, hf_attn_implementation, resolve_dtype
    from oxrl.models.source import from_pretrained_or_explain, resolve_source
    from oxrl.logging.quiet import no_key_report

    source = resolve_source(cfg.name_or_path)
    with no_key_report():  # a causal LM's lm_head unused and its score head new: the point, said in one line below
        model, info = from_pretrained_or_explain(
            AutoModelForSequenceClassification,
            source,
            "reward model",
            num_labels=1,
            pad_token_id=pad_token_id,
            dtype=resolve_dtype(cfg.dtype, device),
            attn_implementation=hf_attn_implementation(cfg.attn_implementation),
            trust_remote_code=cfg.trust_remote_code,
            revision=cfg.revision,
            use_safetensors=None if source.gguf_file else True,
            output_loading_info=True,
        )
    if info["missing_keys"]:
        logger.info("reward model: %s with a new score head (%s)", cfg.name_or_path, ", ".join(sorted(info["missing_keys"])))
    model.to(device)
    if cfg.compile_blocks:
        compile_blocks(model)
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
    return model


def last_scored_positions(batch: PackedBatch, pad_token_id: int | None) -> torch.Tensor:
    """[S] row position of each sequence's last non-pad token (its last token when pad is None or all is pad)."""
    positions = torch.arange(batch.input_ids.shape[1], device=batch.input_ids.device)
    unset = torch.full((batch.num_sequences,), -1, dtype=torch.long, device=positions.device)
    last_token = unset.scatter_reduce(0, batch.seq_index, positions, reduce="amax")
    if pad_token_id is None:
        return last_token
    not_pad = positions.masked_fill(batch.input_ids[0] == pad_token_id, -1)
    last_not_pad = unset.scatter_reduce(0, batch.seq_index, not_pad, reduce="amax")
    return torch.where(last_not_pad >= 0, last_not_pad, last_token)


def sequence_scores(model, batch: PackedBatch) -> torch.Tensor:
    """[S] scalar reward of every sequence of a packed row, with grad."""
    head = getattr(model, "score", None)
    if head is None:
        raise TypeError(f"{type(model).__name__} has no `score` head; a reward model must be a decoder sequence classifier")
    transformer = getattr(model, model.base_model_prefix)
    hidden = transformer(**forward_inputs(transformer, batch), use_cache=False).last_hidden_state
    token_scores = head(hidden)[0, :, 0]  # [T]
    return token_scores[last_scored_positions(batch, model.config.pad_token_id)]
