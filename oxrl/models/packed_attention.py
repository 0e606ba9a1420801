"""Variable-length attention for packed rows, plugged into transformers through its public
`AttentionInterface` / `AttentionMaskInterface` registries.

oxRL trains on packed rows: several sequences end to end in one row [1, T], position ids
restarting at 0 for each, no attention mask, no KV cache (`oxrl.data.types.pack`). Under
`attn_implementation="sdpa"` transformers detects the packing from the position ids and builds a
T x T block-diagonal causal mask, so SDPA computes all T^2 scores although only the
per-sequence causal blocks (sum of L_i^2) are needed, and on CUDA a per-layer `where` over that mask
grows with it too. Here each sequence attends only to itself: the variable-length ("varlen") idea
of FlashAttention (Dao et al. 2022, arXiv:2205.14135, `flash_attn_varlen_func` with `cu_seqlens`).
Which kernel does it (`packed_kernel`), all shipped with torch:

* CPU: stock SDPA once per sequence with `is_causal=True` (the fastest of the three there).
* CUDA, bf16/fp16: torch's `varlen_attn`, FlashAttention-2 over the whole row in one call.
* CUDA otherwise (fp32, or a torch without `varlen`): FlexAttention (arXiv:2412.05496) under
  `torch.compile`, with a document block mask built once per row.

The two CUDA kernels are in oxrl/models/cuda_attention.py, loaded only by a run on CUDA.

Where the boundaries come from: the packer. `row_forward` (oxrl/models/model_inputs.py) hands the
row's `PackedRow` to the model as the keyword `packed_row`; transformers' Llama-style decoder layers
forward their keyword arguments to the attention function, where the kernel reads it. Position ids
are never parsed for boundaries (a family whose layers mix sequences some other way, linear attention,
would see them differently); a single row whose positions restart but that carries no `packed_row`
is an error, not cross-sequence attention.

A continuation (`pack(share_prefixes=True)`: a DPO pair's rejected answer after the chosen one, the
later completions of a GRPO group) carries on from the first `shared` tokens of its root sequence, its
shared prompt, so its queries attend to those keys and to its own, causally (query i sees keys up to
`shared + i`). The varlen call gathers each continuation's keys (prefix, then its own), so its key
segment is `shared` longer than its query segment, and FlashAttention's causal mask, aligned at the
bottom-right corner, is exactly that; FlexAttention's mask names the prefix; the CPU loop concatenates.
Only this kernel reads that layout; `prefix_sharing(model)` says whether a model runs it.

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

from oxrl.models.model_inputs import PACKED_ATTENTION, PackedRow, hf_config

logger = logging.getLogger(__name__)


def packed_kernel(query: torch.Tensor, scaling: float | None) -> str:
    """Which kernel computes a packed row whose queries are `query`: "sdpa" (per sequence), "varlen" or "flex"."""
    if not query.is_cuda:
        return "sdpa"
    from oxrl.models.cuda_attention import VARLEN

    return "varlen" if VARLEN.applies(query, scaling) else "flex"


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
    returning ([B, T_q, H, D], None). A packed training row attends within each of its sequences (the
    `packed_row` keyword says where they are); anything else goes to transformers' `sdpa_attention_forward`."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    row: PackedRow | None = kwargs.pop("packed_row", None)
    if not _is_packed_training_call(query, key, attention_mask, causal, kwargs):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    if row is None:
        refuse_unlabelled_packing(module, kwargs.get("position_ids"))
        return sdpa_attention_forward(
            module, query, key, value, None, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    if row.length != query.shape[2]:
        raise ValueError(f"the packed row's layout covers {row.length} tokens but the attention call has {query.shape[2]}")
    if row.gather is not None:  # this rank's share of a row: its queries attend to every rank's keys
        key, value = row.gather(key, value)
    if dropout:
        raise ValueError(f"{PACKED_ATTENTION} does not apply attention dropout ({dropout}); set the model's "
                         "attention_dropout to 0 or use attn_implementation='sdpa'")
    kernel = packed_kernel(query, scaling)
    if kernel == "varlen":
        from oxrl.models.cuda_attention import varlen_attention

        return varlen_attention(query, key, value, row, scaling), None
    grouped_query = query.shape[1] != key.shape[1]  # GQA: the kernels share the kv heads themselves
    if row.gather is not None:  # the block mask covers a whole row; a share's keys are indexed (key_index)
        return key_segment_sdpa(query, key, value, row, scaling, grouped_query).transpose(1, 2).contiguous(), None
    if kernel == "flex":
        from oxrl.models.cuda_attention import flex_packed_attention

        return flex_packed_attention(query, key, value, row, scaling, grouped_query), None
    return per_sequence_sdpa(query, key, value, row, scaling, grouped_query).transpose(1, 2).contiguous(), None


def per_sequence_sdpa(query, key, value, row: PackedRow, scaling: float | None, grouped_query: bool) -> torch.Tensor:
    """[1, H, T, D]: one causal SDPA call per sequence (a continuation's with its root's prefix keys in front)."""
    outputs = []
    for segment in row.segments:
        own = slice(segment.start, segment.start + segment.length)
        q, k, v = query[:, :, own], key[:, :, own], value[:, :, own]
        if not segment.shared:
            outputs.append(F.scaled_dot_product_attention(q, k, v, scale=scaling, is_causal=True, enable_gqa=grouped_query))
            continue
        prefix = slice(segment.root, segment.root + segment.shared)
        keys, values = torch.cat([key[:, :, prefix], k], 2), torch.cat([value[:, :, prefix], v], 2)
        visible = torch.ones(q.shape[2], keys.shape[2], dtype=torch.bool, device=q.device).tril(segment.shared)
        outputs.append(F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=scaling,
                                                      enable_gqa=grouped_query))
    return torch.cat(outputs, dim=2)


def key_segment_sdpa(query, key, value, row: PackedRow, scaling: float | None, grouped_query: bool) -> torch.Tensor:
    """[1, H, T_q, D]: one SDPA call per query segment over its key segment (`row.key_index`), causal from the
    bottom-right corner: the varlen layout, computed segment by segment."""
    outputs = []
    cu_q, cu_k = row.cu_q.tolist(), row.cu_k.tolist()
    for i in range(len(cu_q) - 1):
        q = query[:, :, cu_q[i] : cu_q[i + 1]]
        keys = row.key_index[cu_k[i] : cu_k[i + 1]]
        visible = torch.ones(q.shape[2], len(keys), dtype=torch.bool, device=q.device).tril(len(keys) - q.shape[2])
        outputs.append(F.scaled_dot_product_attention(q, key[:, :, keys], value[:, :, keys], attn_mask=visible,
                                                      scale=scaling, enable_gqa=grouped_query))
    return torch.cat(outputs, dim=2)


def refuse_unlabelled_packing(module: torch.nn.Module, position_ids: torch.Tensor | None) -> None:
    """A row reached the kernel without the packer's layout: fine for one ordinary sequence (positions going up by
    one), an error where the positions restart (a packed row run outside `row_forward`) or are not passed at all,
    rather than attention across the sequences."""
    if position_ids is None:
        raise ValueError(
            f"{PACKED_ATTENTION} needs the row's position ids in the attention kwargs; "
            f"{type(module).__name__} does not pass them. Use attn_implementation='sdpa' for this model."
        )
    positions = position_ids.reshape(-1)
    if positions.numel() > 1 and bool((positions[1:] - positions[:-1] != 1).any()):
        raise ValueError(
            f"a packed row (position ids restarting) reached {PACKED_ATTENTION} without its layout: run packed rows "
            "through oxrl.models.model_inputs.row_forward (or pass `packed_row=packed_row(batch, device)`)"
        )


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
    that model; a precomputed table, keyed by each sequence's own tokens, never reads it. A vision-language model
    whose language model runs the kernel (`PACKED_LANGUAGE_MODELS`) keeps transformers' name on its top-level config,
    so its rows are not prefix-shared: a shared prompt's images would have to reach every continuation."""
    inner = getattr(model, "model", None) if not isinstance(model, torch.nn.Module) else model
    if inner is None:
        return False
    return getattr(hf_config(inner), "_attn_implementation", None) == PACKED_ATTENTION


def register_packed_attention() -> None:
    """Make `attn_implementation=PACKED_ATTENTION` known to transformers (idempotent)."""
    AttentionInterface.register(PACKED_ATTENTION, packed_sdpa_attention_forward)
    AttentionMaskInterface.register(PACKED_ATTENTION, packed_causal_mask)


# Vision-language families whose language model attends causally over image tokens as over text (packed == each
# sequence alone: tests/integration/test_vlm_rollout.py): it runs the kernel, the vision tower keeps its own attention.
# Without it a packed row of T tokens gets a T x T mask: memory quadratic in the row (a VLA episode is dozens of turns).
PACKED_LANGUAGE_MODELS = frozenset({"qwen2_vl", "idefics3"})


def packed_attention_unsupported_reason(model) -> str | None:
    """Why `model` (for a vision-language model: its language model) should not use the packed kernel, or None."""
    if model.config.sub_configs and model.config.model_type not in PACKED_LANGUAGE_MODELS:
        return "composite (e.g. multimodal) models build extra mask patterns this kernel does not reproduce"
    config = model.config.get_text_config()
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
    if (reason := packed_attention_unsupported_reason(model)) is not None:
        logger.info("keeping attention %r for %s: %s", model.config._attn_implementation,
                    getattr(model.config, "model_type", type(model).__name__), reason)
        return False
    register_packed_attention()
    model.set_attn_implementation({"text_config": PACKED_ATTENTION} if model.config.sub_configs else PACKED_ATTENTION)
    # set_attn_implementation only warns when a model class cannot switch at runtime.
    if model.config.get_text_config()._attn_implementation != PACKED_ATTENTION:
        logger.info("keeping attention %r: %s cannot switch its attention implementation at runtime",
                    model.config._attn_implementation, type(model).__name__)
        return False
    logger.debug("attention: %s (variable-length attention over packed rows: per-sequence SDPA on a CPU, varlen "
                "FlashAttention or FlexAttention on CUDA)", PACKED_ATTENTION)
    return True
