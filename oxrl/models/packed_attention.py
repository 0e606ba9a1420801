"""Per-sequence attention for packed rows, plugged into transformers through its public
`AttentionInterface` / `AttentionMaskInterface` registries.

oxRL trains on packed rows: several sequences end to end in one row [1, T], position ids
restarting at 0 for each, no attention mask, no KV cache (`oxrl.data.types.pack`). Under
`attn_implementation="sdpa"` transformers detects the packing from the position ids and builds a
T x T block-diagonal causal mask, so SDPA computes all T^2 scores although only the
per-sequence causal blocks (sum of L_i^2) are needed; with an explicit mask SDPA also cannot use
its `is_causal` fast path. Here each sequence gets its own `scaled_dot_product_attention(...,
is_causal=True)` call instead: the variable-length ("varlen") idea of FlashAttention (Dao et al.
2022, arXiv:2205.14135, `flash_attn_varlen_func` with `cu_seqlens`), done with stock SDPA one
sequence at a time.

How the sequence boundaries reach the kernel (public API only): the decoder layers of
transformers' Llama-style models forward `position_ids` to the attention function as a keyword
argument, so the kernel splits where the position ids do not go up by exactly 1, the rule of
transformers' own `find_packed_sequence_indices`. It recomputes this per layer (a diff over T
integers, negligible next to attention) rather than caching it anywhere.

A sequence whose positions do not start at 0 is a continuation (`oxrl.data.types.pack(share_prefixes=True)`: a
DPO pair's rejected answer after the chosen one, the later completions of a GRPO group): it carries on from the
first `start` tokens of the last sequence that did start at 0, its shared prompt, so its queries attend to those
keys and to its own, causally. Only this kernel reads that layout; `prefix_sharing(model)` says whether a model
runs it.

Every other call (a 2-D padding mask, a KV cache, batch > 1, decoding, sliding-window layers)
is handed unchanged to transformers' `sdpa_attention_forward` with the mask its `sdpa_mask` builds,
so generation is exactly sdpa's. One input differs from sdpa, on purpose: a single row with
restarting position ids, no cache and an all-ones 2-D attention mask. transformers skips its
packing detection when any 2-D mask is given and attends across the whole row; this kernel sees
no mask in either case (sdpa_mask drops an all-ones one) and keeps the sequences apart.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
# The two functions transformers' attention-interface docs point to for building on sdpa.
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from oxrl.algorithms.model_inputs import hf_config

logger = logging.getLogger(__name__)

# The name contains "sdpa" on purpose: transformers then runs its sdpa-support check on the model
# when the implementation is set (`get_correct_attn_implementation`), which we want because every
# call that is not a packed training forward is delegated to sdpa.
PACKED_ATTENTION = "oxrl_packed_sdpa"


def packed_sequence_lengths(position_ids: torch.Tensor) -> list[int]:
    """Lengths of the sequences of one packed row, from its position ids [1, T] or [T].

    A sequence starts wherever the position does not follow the previous one by exactly 1
    (transformers' rule in `masking_utils.find_packed_sequence_indices`), e.g.
    [0 1 2 0 1 0 1 2 3] -> [3, 2, 4].
    """
    positions = position_ids.reshape(-1)
    starts = (torch.nonzero(positions[1:] - positions[:-1] != 1).flatten() + 1).tolist()
    bounds = [0, *starts, positions.numel()]
    return [end - start for start, end in zip(bounds, bounds[1:])]


def _is_packed_training_call(query: torch.Tensor, key: torch.Tensor, attention_mask, causal: bool, kwargs) -> bool:
    """True for the one case this kernel handles itself: a causal forward over a single row
    [1, H, T, D] with no mask, no KV cache and full (not sliding-window) attention."""
    return (
        attention_mask is None
        and causal
        and query.shape[0] == 1
        and query.shape[2] == key.shape[2] > 1  # no cached prefix; decoding (T = 1) is sdpa's
        # transformers only detects packing without a cache; with one it attends across the row,
        # and so must we to stay identical to sdpa.
        and not kwargs.get("use_cache")
        and kwargs.get("sliding_window") is None
        and kwargs.get("softcap") is None
        and kwargs.get("position_bias") is None
        and kwargs.get("cache") is None  # continuous batching's paged cache
    )


def packed_sdpa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, T_q, D]
    key: torch.Tensor,  # [B, H_kv, T_kv, D]
    value: torch.Tensor,  # [B, H_kv, T_kv, D]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """An attention function with the signature of transformers' `sdpa_attention_forward`,
    returning ([B, T_q, H, D], None). Packed training rows are split per sequence; anything else
    goes to transformers' `sdpa_attention_forward` untouched."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if not _is_packed_training_call(query, key, attention_mask, causal, kwargs):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    position_ids = kwargs.get("position_ids")
    if position_ids is None or position_ids.numel() != query.shape[2]:
        # Our mask function skipped the block-diagonal mask, so without the position ids we
        # cannot see the boundaries: refuse rather than attend across sequences.
        raise ValueError(
            f"{PACKED_ATTENTION} needs the row's position ids in the attention kwargs; "
            f"{type(module).__name__} does not pass them. Use attn_implementation='sdpa' for this model."
        )
    lengths = packed_sequence_lengths(position_ids)
    if len(lengths) == 1:  # an ordinary causal forward: sdpa's own is_causal path
        return sdpa_attention_forward(
            module, query, key, value, None, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # GQA: SDPA shares the kv heads itself (enable_gqa, torch >= 2.5), no repeated copies of K and V.
    grouped_query = query.shape[1] != key.shape[1]
    starts = position_ids.reshape(-1)[torch.tensor(lengths).cumsum(0) - torch.tensor(lengths)].tolist()
    outputs, root_key, root_value = [], None, None  # each output [1, H, L_i, D]
    for q, k, v, start in zip(query.split(lengths, dim=2), key.split(lengths, dim=2), value.split(lengths, dim=2), starts):
        if start == 0:  # a sequence of its own
            outputs.append(F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True,
                                                          enable_gqa=grouped_query))
            root_key, root_value = k, v
            continue
        # A continuation (`pack(share_prefixes=True)`): it follows the first `start` tokens of the last sequence that
        # began at 0, so its queries see those keys and its own, causally (query i sees keys up to start + i).
        if root_key is None or start > root_key.shape[2]:
            raise ValueError(f"a packed row continues a prefix of {start} tokens that no earlier sequence holds")
        keys, values = torch.cat([root_key[:, :, :start], k], 2), torch.cat([root_value[:, :, :start], v], 2)
        visible = torch.ones(q.shape[2], keys.shape[2], dtype=torch.bool, device=q.device).tril(start)
        outputs.append(F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, dropout_p=dropout,
                                                      scale=scaling, enable_gqa=grouped_query))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def packed_causal_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    attention_mask: torch.Tensor | None = None,
    use_vmap: bool = False,
    **kwargs,
) -> torch.Tensor | None:
    """The mask function paired with the kernel (transformers' `AttentionMaskInterface` signature).

    For a single row with no padding mask and no cached prefix it returns None: there the kernel
    takes the boundaries from the position ids, and building the T x T block-diagonal mask that
    sdpa would get is exactly the waste we avoid. Everything else (padding, caches, sliding
    windows via `local_size`, custom or/and mask functions via `use_vmap`) gets the "sdpa" mask.
    """
    single_uncached_row = (
        batch_size == 1
        and attention_mask is None
        and q_length == kv_length > 1
        and isinstance(q_offset, int) and q_offset == 0  # a static cache passes a tensor offset
        and kv_offset == 0
    )
    plain_causal = not use_vmap and kwargs.get("local_size") is None and not kwargs.get("allow_is_bidirectional_skip")
    if single_uncached_row and plain_causal:
        return None
    return sdpa_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
        attention_mask=attention_mask, use_vmap=use_vmap, **kwargs,
    )


def prefix_sharing(model) -> bool:
    """Whether `model` reads the shared-prefix layout of `pack(share_prefixes=True)`: only oxRL's packed attention
    kernel does (a continuation's queries see the prefix it shares); any other attention would see each continuation
    as a sequence of its own, without its prompt. A reference with a model of its own (`FrozenModel`) is asked about
    that model; a precomputed table, keyed by each sequence's own tokens, never reads it."""
    inner = getattr(model, "model", None) if not isinstance(model, torch.nn.Module) else model
    if inner is None:
        return False
    return getattr(hf_config(inner), "_attn_implementation", None) == PACKED_ATTENTION


def register_packed_attention() -> None:
    """Make `attn_implementation=PACKED_ATTENTION` known to transformers (idempotent)."""
    AttentionInterface.register(PACKED_ATTENTION, packed_sdpa_attention_forward)
    AttentionMaskInterface.register(PACKED_ATTENTION, packed_causal_mask)


def packed_attention_unsupported_reason(model) -> str | None:
    """Why `model` should not use the packed kernel, or None when it can."""
    config = model.config
    if any(p.device.type == "cuda" for p in model.parameters()):
        return "on CUDA, attn_implementation='flash_attention_2' does variable-length packed attention natively"
    if config.sub_configs:
        return "composite (e.g. multimodal) models build extra mask patterns this kernel does not reproduce"
    if not getattr(config, "is_causal", True):
        return "the model is not causal"
    # Per-layer configs (Gemma 2/3, Qwen2, SmolLM3) name their sliding layers in `layer_types`, and may
    # keep an unused `sliding_window` (Qwen2-MoE: 0); the others (Mistral) window every layer.
    layer_types = getattr(config, "layer_types", None)
    windowed = (any(t != "full_attention" for t in layer_types) if layer_types
                else bool(getattr(config, "sliding_window", None)))
    if windowed:
        return "sliding-window / non-full attention layers are not supported"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "attention logit softcapping is not supported by SDPA"
    return None


def use_packed_attention(model) -> bool:
    """Switch a loaded causal LM to the per-sequence packed kernel through transformers' public
    `set_attn_implementation`; returns whether it did. A no-op, with the reason logged, where the
    kernel does not apply."""
    reason = packed_attention_unsupported_reason(model)
    if reason is not None:
        logger.info("keeping attention %r for %s: %s", model.config._attn_implementation,
                    getattr(model.config, "model_type", type(model).__name__), reason)
        return False
    register_packed_attention()
    model.set_attn_implementation(PACKED_ATTENTION)
    # set_attn_implementation only warns when a model class cannot switch at runtime.
    if model.config._attn_implementation != PACKED_ATTENTION:
        logger.info("keeping attention %r: %s cannot switch its attention implementation at runtime",
                    model.config._attn_implementation, type(model).__name__)
        return False
    logger.info("attention: %s (per-sequence SDPA over packed rows)", PACKED_ATTENTION)
    return True
