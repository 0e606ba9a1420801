"""The bf16 copy of the policy that the `hf` engine samples from under `rl.rollout.precision: bf16`.

Decoding a small batch reads every weight at every token, and on a CPU with native bf16 the skinny matmuls of a
decoding step run 2-3x faster in bf16 than in fp32 (SmolLM2-135M, 32 rows: the output layer 11 ms against 33 ms).
Autocast recasts activations at every op and keeps the fp32 weights as the source, so the engine holds its own
bf16 copy instead: made once, its weights overwritten in place from the trainer's at every weight sync (a copy of
each parameter, no reallocation). Buffers (rotary inverse frequencies) stay as they are: position angles keep fp32.

The copy is a different network numerically: the log-probs the engine reports are the copy's (what it sampled
from), and the RL loop reports their gap to the trainer's recomputed ones every step (`logprob_mismatch/*`);
`rl.off_policy_correction` (e.g. `tis`) weights the loss by the truncated ratio where that gap matters.
"""

from __future__ import annotations

import copy

import torch


def bf16_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen, eval-mode copy of `model` whose floating-point parameters are bf16 (tied weights stay tied). On a CPU
    it attends with transformers' `eager` attention: one query row per decoding step against a short cache runs
    faster as plain matmuls than through the CPU's SDPA kernels (SmolLM2-135M, 32 rows x 64 tokens: 5.8-6.3 s against
    6.9-7.4 s). Its cost grows with prompt length squared in the prefill, which reads each prompt once."""
    replica = copy.deepcopy(model).eval().requires_grad_(False)
    for parameter in replica.parameters():
        if parameter.is_floating_point():
            parameter.data = parameter.data.to(torch.bfloat16)
    if next(replica.parameters()).device.type == "cpu":
        replica.set_attn_implementation("eager")
    return replica


@torch.no_grad()
def refresh(replica: torch.nn.Module, model: torch.nn.Module) -> None:
    """Overwrite the copy's parameters with `model`'s current values (rounded to the copy's dtype)."""
    for target, source in zip(replica.parameters(), model.parameters(), strict=True):
        target.copy_(source)
