"""What a vision-language model's forward takes for a packed row: the image tensors, and the position ids its
rotary embedding needs.

Most families (Idefics3 / SmolVLM, LLaVA) use 1-D positions, so a packed row's positions restarting at 0 for each
sequence are all they need. Qwen2-VL, Qwen2.5-VL and Qwen3-VL use multimodal RoPE: an image token's position is
3-D (time, height, width in its grid) and the text after an image continues from the image's largest position,
not from its token count. Their models compute those positions themselves only for an unpacked batch; for a
packed row oxRL asks the model's own `get_rope_index` for each sequence (as an unpacked, padded batch) and lays
the result back into the row, with the restarting 1-D positions first: the `[4, 1, T]` form in which transformers
reads row 0 to keep attention within each packed sequence and rows 1-3 as the rotary positions.

A text-only row of such a model gets the same 4-row form (its three rotary rows equal to the 1-D positions), since
the plain `[1, T]` form is read as one unpacked sequence and would let packed sequences attend to each other.
"""

from __future__ import annotations

import torch

from oxrl.data.types import PackedBatch


def image_token_ids(model) -> list[int]:
    """The ids that stand for image (and video) features in a vision-language model's input; empty for a text model.
    They are never sampled: a completion holding one would ask the trainer for features of an image there is none of."""
    config = model.config
    found = {getattr(config, key, None) for key in ("image_token_id", "video_token_id", "image_token_index")}
    return sorted(i for i in found if isinstance(i, int))


def rope_index_owner(model):
    """The submodule whose `get_rope_index` gives multimodal RoPE positions (Qwen-VL families), or None."""
    return next((module for module in model.modules() if hasattr(module, "get_rope_index")), None)


def forward_inputs(model, batch: PackedBatch) -> dict[str, torch.Tensor]:
    """Keyword arguments of `model(...)` for a packed row: ids, positions, and the row's image tensors."""
    owner = rope_index_owner(model)
    positions = batch.position_ids if owner is None else multimodal_positions(owner, batch)
    return {"input_ids": batch.input_ids, "position_ids": positions, **batch.vision}


def multimodal_positions(owner, batch: PackedBatch) -> torch.Tensor:
    """[4, 1, T]: the packed row's 1-D positions, then each sequence's 3-D rotary positions from `owner.get_rope_index`."""
    ids, text_positions = batch.input_ids[0], batch.position_ids[0]
    rows = ids.new_zeros(batch.num_sequences, int(text_positions.max()) + 1)
    present = torch.zeros_like(rows)
    rows[batch.seq_index, text_positions] = ids
    present[batch.seq_index, text_positions] = 1
    padded = padded_positions(owner, rows, present, batch.vision.get("image_grid_thw"))  # [4, S, L]
    return padded[:, batch.seq_index, text_positions][:, None, :]  # back in the packed row's order


def padded_positions(owner, ids: torch.Tensor, attention: torch.Tensor, image_grid_thw: torch.Tensor | None) -> torch.Tensor:
    """[4, B, L] for a padded batch (left or right): each token's 1-D position (real tokens before it), then its
    3-D rotary position from `owner.get_rope_index` (image tokens located by id, images in row order)."""
    image_tokens = (ids == owner.config.image_token_id).int() * attention
    rotary, _ = owner.get_rope_index(ids, mm_token_type_ids=image_tokens, image_grid_thw=image_grid_thw,
                                     attention_mask=attention)
    return torch.cat([(attention.cumsum(-1) - 1).clamp(min=0)[None], rotary])
