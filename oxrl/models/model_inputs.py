"""A forward pass of a packed row (`row_forward`), and what a vision-language model's forward takes for one: the
image tensors, and the position ids its rotary embedding needs.

Most families (Idefics3 / SmolVLM, LLaVA) use 1-D positions, so a packed row's positions restarting at 0 for each
sequence are all they need. Qwen2-VL, Qwen2.5-VL and Qwen3-VL use multimodal RoPE: an image token's position is
3-D (time, height, width in its grid) and the text after an image continues from the image's largest position,
not from its token count. Their models compute those positions themselves only for an unpacked batch; for a
packed row oxRL asks the model's own `get_rope_index` for each sequence (as an unpacked, padded batch) and lays
the result back into the row, with the restarting 1-D positions first: the `[4, 1, T]` form in which transformers
reads row 0 to keep attention within each packed sequence and rows 1-3 as the rotary positions.

A text-only row of such a model gets the same 4-row form (its three rotary rows equal to the 1-D positions), since
the plain `[1, T]` form is read as one unpacked sequence and would let packed sequences attend to each other.

Gemma 3's image tokens attend to each other both ways (the model builds that mask from `token_type_ids`, 1 on image
tokens). A packed row does not reproduce it: measured on a tiny Gemma 3, a row holding a text-only sequence and an
image sequence moved the later one's log-probs by 5e-3 against its own forward. Such a family (`PADDED_FAMILIES`)
runs the row's sequences as a padded batch instead (attention mask, token types), and `row_forward` lays the
outputs back in the row's order, so callers never see the difference.
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass, field

import torch

from oxrl.data.types import PackedBatch, Segment

# oxRL's packed attention kernel (oxrl/models/packed_attention.py) as transformers knows it. The name contains "sdpa"
# on purpose: transformers then runs its sdpa-support check on the model when the implementation is set
# (`get_correct_attn_implementation`), which we want because every call that is not a packed training forward is
# delegated to sdpa.
PACKED_ATTENTION = "oxrl_packed_sdpa"


@dataclass
class PackedRow:
    """What the kernel reads of one packed row, from the packer's `Segment`s: per sequence its query tokens and
    its keys (a continuation's shared prefix, then its own tokens). Built once per forward (`packed_row`) and read by
    oxRL's packed attention kernel (oxrl/models/packed_attention.py)."""

    segments: tuple[Segment, ...]  # the packer's, row order
    length: int  # T
    cu_q: torch.Tensor  # [S + 1] int32 on the row's device: query segment ends
    cu_k: torch.Tensor  # [S + 1] int32: key segment ends (longer than the queries' by each continuation's prefix)
    max_q: int
    max_k: int
    key_index: torch.Tensor | None  # [T_k] row positions of the keys, in key-segment order; None: the row itself
    kernel_state: dict = field(default_factory=dict, repr=False)  # what a kernel builds once per row (a block mask)
    # Context parallel (oxrl/models/context_parallel.py): the row is one rank's share of a longer row, its keys and
    # values are gathered from every rank by this callable, and `key_index` indexes the gathered tokens.
    gather: object = None

    @property
    def continues(self) -> bool:
        return self.key_index is not None


@dataclass(frozen=True)
class ParallelLayout:
    """The process groups one model is split over (`strategy.mesh`): `tp` ranks split its layers
    (oxrl/models/parallel.py), `cp` ranks each row's tokens (oxrl/models/context_parallel.py)."""

    tp_group: object = None
    tp_size: int = 1
    tp_rank: int = 0
    cp_group: object = None
    cp_size: int = 1
    cp_rank: int = 0

    @property
    def splits(self) -> bool:
        return self.tp_size > 1 or self.cp_size > 1


ONE_RANK = ParallelLayout()
_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def set_layout(model: torch.nn.Module, layout: ParallelLayout) -> None:
    """Record how the strategy split `model`."""
    _LAYOUTS[model] = layout


def layout_of(model) -> ParallelLayout:
    """The layout the strategy recorded for `model` (a frozen reference is asked about its own model), else one rank."""
    module = model if isinstance(model, torch.nn.Module) else getattr(model, "model", None)
    return _LAYOUTS.get(module, ONE_RANK) if module is not None else ONE_RANK


def packed_row(batch: PackedBatch, device: torch.device | str) -> PackedRow:
    """The `PackedRow` of `batch`'s row, its index tensors on `device`."""
    segments = batch.segments
    roots = {s.start: s for s in segments if not s.shared}
    for s in segments:
        if s.shared and (s.root not in roots or s.shared > roots[s.root].length or s.root >= s.start):
            raise ValueError(f"a packed row's sequence at {s.start} continues a prefix of {s.shared} tokens at {s.root} "
                             "that no earlier sequence holds")
    own = [s.length for s in segments]
    keys = [s.shared + s.length for s in segments]
    key_index = None
    if any(s.shared for s in segments):
        key_index = torch.cat([torch.cat([torch.arange(s.root, s.root + s.shared), torch.arange(s.start, s.start + s.length)])
                               for s in segments]).to(device)
    return PackedRow(segments, sum(own), segment_ends(own, device), segment_ends(keys, device), max(own, default=0),
                     max(keys, default=0), key_index)


def segment_ends(lengths: list[int], device: torch.device | str) -> torch.Tensor:
    """[S + 1] int32 cumulative lengths from 0, FlashAttention's `cu_seqlens`."""
    return torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)


def cache_keyword(model) -> str:
    """The keyword a model's forward (and `generate`) takes its KV cache by: `cache` since transformers 5.2x, where
    `past_key_values` is deprecated (and warns at every call), `past_key_values` before."""
    forward = getattr(model, "module", model).forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def hf_config(model):
    """`model`'s transformers config, also through a wrapper whose own `config` is another thing (DeepSpeed's engine)."""
    return getattr(model, "module", model).config


def image_token_ids(model) -> list[int]:
    """The ids that stand for image (and video) features in a vision-language model's input; empty for a text model.
    They are never sampled: a completion holding one would ask the trainer for features of an image there is none of."""
    config = hf_config(model)
    found = {getattr(config, key, None) for key in ("image_token_id", "video_token_id", "image_token_index")}
    return sorted(i for i in found if isinstance(i, int))


# Families whose attention over image tokens a packed row cannot give: their rows run as padded batches.
PADDED_FAMILIES = frozenset({"gemma3"})


def row_forward(model, batch: PackedBatch, keep: torch.Tensor | None = None, hidden: bool = False,
                logits_at: int | None = None, inputs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits [N, V] at the row's positions `keep` (all T positions when None) and, with `hidden`, the final hidden
    states there [N, H]: one forward of the packed row, or for a `PADDED_FAMILIES` model one of its sequences as a
    padded batch. With `logits_at` (an index into `keep`), only that one kept position goes through the lm_head
    (logits [1, V]; the chunked log-probs of oxrl/models/lm_head.py check their head against it). `inputs` replaces
    the row's own model inputs (one rank's share of the row under context parallel; `keep` then indexes it)."""
    with_hidden = {"output_hidden_states": True} if hidden else {}
    if hf_config(model).model_type in PADDED_FAMILIES:
        rows, present = padded_rows(batch)
        seqs, positions = batch.seq_index, batch.position_ids[0]
        if keep is not None:
            seqs, positions = seqs[keep], positions[keep]
        projected = {} if logits_at is None else {"logits_to_keep": positions[logits_at : logits_at + 1]}
        out = model(input_ids=rows, attention_mask=present, use_cache=False, **batch.vision,
                    **token_type_inputs(model, rows * present), **with_hidden, **projected)
        logits = out.logits[seqs, positions] if logits_at is None else out.logits[seqs[logits_at], :1]
        return logits, out.hidden_states[-1][seqs, positions] if hidden else None
    if logits_at is not None:
        projected = {"logits_to_keep": (keep if keep is not None else torch.arange(batch.input_ids.shape[1]))[logits_at : logits_at + 1]}
    else:
        projected = {} if keep is None else {"logits_to_keep": keep}  # only the kept positions through the lm_head
    out = model(**(inputs or forward_inputs(model, batch)), use_cache=False, **projected, **with_hidden)
    states = out.hidden_states[-1][0] if hidden else None  # every position: `logits_to_keep` slices logits only
    return out.logits[0], None if states is None else (states if keep is None else states[keep])


def token_type_inputs(model, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """`token_type_ids` (1 on image tokens) for a family that builds its image attention from them, else nothing."""
    config = hf_config(model)
    if config.model_type not in PADDED_FAMILIES:
        return {}
    return {"token_type_ids": (ids == config.image_token_id).long()}


def padded_rows(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed row's sequences as a right-padded batch: ids [S, L] and which of them are real [S, L]."""
    positions = batch.position_ids[0]
    rows = batch.input_ids.new_zeros(batch.num_sequences, int(positions.max()) + 1)
    present = torch.zeros_like(rows)
    rows[batch.seq_index, positions] = batch.input_ids[0]
    present[batch.seq_index, positions] = 1
    return rows, present


def rope_index_owner(model):
    """The submodule whose `get_rope_index` gives multimodal RoPE positions (Qwen-VL families), or None."""
    return next((module for module in model.modules() if hasattr(module, "get_rope_index")), None)


def forward_inputs(model, batch: PackedBatch) -> dict:
    """Keyword arguments of `model(...)` for a packed row: ids, positions, the row's image tensors, and where its
    sequences lie for the attention kernel that reads it (`boundary_inputs`)."""
    owner = rope_index_owner(model)
    positions = batch.position_ids if owner is None else multimodal_positions(owner, batch)
    return {"input_ids": batch.input_ids, "position_ids": positions, **batch.vision, **boundary_inputs(model, batch)}


def boundary_inputs(model, batch: PackedBatch) -> dict:
    """The packer's sequence boundaries in the form the model's attention reads them: oxRL's kernel takes the row's
    `PackedRow`, transformers' `flash_attention_2` the FlashAttention `cu_seq_lens_*` / `max_length_*` keywords
    (transformers' own names, which its decoder layers pass on to the attention function). Other implementations
    get nothing: transformers' sdpa and eager build their block-diagonal mask from the position ids themselves."""
    implementation = getattr(hf_config(model).get_text_config(), "_attn_implementation", None)  # (a VLM's LM's)
    if implementation == PACKED_ATTENTION:
        return {"packed_row": packed_row(batch, batch.input_ids.device)}
    if implementation == "flash_attention_2":
        row = packed_row(batch, batch.input_ids.device)
        return {"cu_seq_lens_q": row.cu_q, "cu_seq_lens_k": row.cu_k, "max_length_q": row.max_q, "max_length_k": row.max_k}
    return {}


def multimodal_positions(owner, batch: PackedBatch) -> torch.Tensor:
    """[4, 1, T]: the packed row's 1-D positions, then each sequence's 3-D rotary positions from `owner.get_rope_index`."""
    rows, present = padded_rows(batch)
    padded = padded_positions(owner, rows, present, batch.vision.get("image_grid_thw"))  # [4, S, L]
    return padded[:, batch.seq_index, batch.position_ids[0]][:, None, :]  # back in the packed row's order


def padded_positions(owner, ids: torch.Tensor, attention: torch.Tensor, image_grid_thw: torch.Tensor | None) -> torch.Tensor:
    """[4, B, L] for a padded batch (left or right): each token's 1-D position (real tokens before it), then its
    3-D rotary position from `owner.get_rope_index` (image tokens located by id, images in row order)."""
    image_tokens = (ids == owner.config.image_token_id).int() * attention
    rotary, _ = owner.get_rope_index(ids, mm_token_type_ids=image_tokens, image_grid_thw=image_grid_thw,
                                     attention_mask=attention)
    return torch.cat([(attention.cumsum(-1) - 1).clamp(min=0)[None], rotary])
