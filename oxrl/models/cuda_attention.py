"""The CUDA kernels of packed rows (oxrl/models/packed_attention.py picks them: `packed_kernel`), loaded only on CUDA.

* bf16/fp16: `torch.nn.attention.varlen.varlen_attn`, FlashAttention-2 (arXiv:2205.14135) over the whole row in one
  call (torch >= 2.10; its keyword for causality changed from `is_causal` (2.10) to `window_size=(-1, 0)` (2.11+),
  and `enable_gqa` came in 2.12: `VarlenCall` reads the installed signature once).
* otherwise (fp32, or a torch without `varlen`): FlexAttention (arXiv:2412.05496) under `torch.compile`, with a
  document block mask built once per row (`document_block_mask`).
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

from oxrl.models.model_inputs import PackedRow


class VarlenCall:
    """`torch.nn.attention.varlen.varlen_attn` as the installed torch spells it (None where it has none)."""

    def __init__(self) -> None:
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:  # torch < 2.10
            self.function = None
            return
        self.function = varlen_attn
        parameters = inspect.signature(varlen_attn).parameters
        self.causal = {"is_causal": True} if "is_causal" in parameters else {"window_size": (-1, 0)}
        self.takes_scale = "scale" in parameters
        self.takes_gqa = "enable_gqa" in parameters

    def applies(self, query: torch.Tensor, scaling: float | None) -> bool:
        """Whether it computes this call: FlashAttention needs CUDA and half precision, and a torch without a
        `scale` keyword only the default 1/sqrt(D)."""
        default_scale = scaling is None or math.isclose(scaling, query.shape[-1] ** -0.5, rel_tol=1e-6)
        return (self.function is not None and query.is_cuda and query.dtype in (torch.bfloat16, torch.float16)
                and (self.takes_scale or default_scale))

    def __call__(self, query, key, value, cu_q, cu_k, max_q: int, max_k: int, scaling: float | None) -> torch.Tensor:
        """[T_q, H, D] queries, [T_k, H_kv, D] keys and values -> [T_q, H, D]."""
        extra = dict(self.causal)
        if self.takes_scale and scaling is not None:
            extra["scale"] = scaling
        if key.shape[1] != query.shape[1]:
            if self.takes_gqa:
                extra["enable_gqa"] = True
            else:  # torch < 2.12 has no `enable_gqa`: give it as many kv heads as query heads
                groups = query.shape[1] // key.shape[1]
                key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        return self.function(query, key, value, cu_q, cu_k, max_q, max_k, **extra)


VARLEN = VarlenCall()


def document_block_mask(row: PackedRow):
    """FlexAttention's BlockMask over the row itself: a query sees its own sequence's earlier tokens and, for a
    continuation, its root's first `shared` tokens."""
    from torch.nn.attention.flex_attention import create_block_mask

    device = row.cu_q.device
    sequence = torch.repeat_interleave(torch.arange(len(row.segments), device=device),
                                       torch.tensor([s.length for s in row.segments], device=device))
    root = torch.tensor([s.root for s in row.segments], device=device)
    shared = torch.tensor([s.shared for s in row.segments], device=device)

    def visible(batch, head, q, kv):
        own = (sequence[q] == sequence[kv]) & (kv <= q)
        prefix = (kv >= root[sequence[q]]) & (kv < root[sequence[q]] + shared[sequence[q]])
        return own | prefix

    # Built as compiled code on CUDA (what FlexAttention's docs advise for long rows): eagerly it would hold T x T.
    build = compiled(create_block_mask) if device.type == "cuda" else create_block_mask
    return build(visible, None, None, row.length, row.length, device=device)


@functools.cache
def compiled(function):
    """`function` under `torch.compile`, wrapped once per process."""
    return torch.compile(function)


def varlen_attention(query, key, value, row: PackedRow, scaling: float | None) -> torch.Tensor:
    """[1, T_q, H, D] from [1, H, T, D] queries, keys and values: FlashAttention's varlen call over the row."""
    # [T, H, D], each sequence's tokens contiguous, as FlashAttention's varlen layout wants them
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    if row.continues:
        k, v = k[row.key_index], v[row.key_index]
    return VARLEN(q, k, v, row.cu_q, row.cu_k, row.max_q, row.max_k, scaling)[None]


def flex_packed_attention(query, key, value, row: PackedRow, scaling: float | None, grouped_query: bool) -> torch.Tensor:
    """[1, T, H, D] from [1, H, T, D] queries, keys and values: compiled FlexAttention under the row's block mask."""
    from torch.nn.attention.flex_attention import flex_attention

    if "block_mask" not in row.kernel_state:  # once per row: every layer, and their backward, reuse it
        row.kernel_state["block_mask"] = document_block_mask(row)
    # Compiled: uncompiled FlexAttention materialises every score.
    out = compiled(flex_attention)(query, key, value, block_mask=row.kernel_state["block_mask"], scale=scaling,
                                   enable_gqa=grouped_query)
    return out.transpose(1, 2).contiguous()
