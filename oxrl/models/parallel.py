"""Tensor parallel: each layer's weights split over the ranks of a mesh dimension, and log-probs over a vocabulary
split the same way.

Tensor parallel (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053) with torch's DTensor plans
(`parallelize_module`). Which projection splits how is the family's own declaration, transformers'
`config.base_model_tp_plan`: q/k/v and gate/up split by output features (`colwise`), so each rank computes its
heads and its slice of the MLP, o/down by input features (`rowwise`), whose partial outputs one all-reduce per
block adds up. Phi-3's fused qkv and gate/up projections (`colwise_gather_output`) are split by weight and their
outputs gathered, and the next projection takes its slice of them (`rowwise_split_input`). Qwen3's per-head norms
(`replicated_with_grad_allreduce`) keep their weight whole, normalise the rank's own heads and sum their gradient
over the ranks. A mixture of experts keeps its experts whole on every rank (`moe_tp_experts` and the entries under
it are left out: each rank computes every expert, on the whole hidden state the attention block gathered), its
router too; its attention is split. A plan entry of any other kind is refused by name, never silently replicated.

The input embedding is split by vocabulary. The output layer is too, and training never gathers its logits:
log p(target) and the entropy come from a log-sum-exp over the ranks' slices (`vocab_parallel_logprobs`), so no rank
holds a [tokens, vocabulary] tensor of the whole vocabulary. Generation, which needs one row of logits per step,
gets them gathered.

Tied embeddings (SmolLM2, Gemma) stay tied: the embedding and the output layer split their one weight the same way,
by vocabulary rows, so the output layer takes the embedding's split weight back. LoRA adapters are not split
(refused in the config).

Which ranks a model is split over is its `ParallelLayout` (oxrl/models/model_inputs.py), recorded by the strategy
that split it (oxrl/training/fsdp.py) and read by the forward of a packed row: the log-probs (oxrl/models/logprobs.py,
oxrl/models/lm_head.py) load this module and oxrl/models/context_parallel.py only for a model that is split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from oxrl.models.model_inputs import hf_config, layout_of
from oxrl.models.shape import tensor_parallel_plan, tensor_parallel_refusal


# --------------------------------------------------------------------------------------------- the plan


def plan_styles() -> dict:
    """Each kind of plan entry oxRL splits (oxrl/models/shape.py SUPPORTED_STYLES) -> a factory of its DTensor style."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
        # A per-head norm (Qwen3's q_norm, k_norm) over this rank's heads [batch, tokens, heads, head_dim]: its weight
        # replicated, its input split by heads, its gradient summed over the ranks.
        "replicated_with_grad_allreduce": lambda: SequenceParallel(sequence_dim=2, use_local_output=True),
    }


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh) -> None:
    """Split `model` (a transformers causal LM) over the 1-D mesh `tp_mesh` in place: its family's plan for the
    decoder layers, the embedding and the output layer by vocabulary."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    refusal = tensor_parallel_refusal(hf_config(model), tp_mesh.size())
    if refusal:
        raise ValueError(f"strategy.mesh.tp = {tp_mesh.size()} cannot split this model: {refusal}")
    styles = plan_styles()
    backbone = getattr(model, model.base_model_prefix)
    kept, _ = tensor_parallel_plan(hf_config(model))  # (a mixture of experts' experts stay whole)
    parallelize_module(backbone, tp_mesh, {name: styles[style]() for name, style in kept.items()})
    embedding, output = model.get_input_embeddings(), model.get_output_embeddings()
    tied = output.weight is embedding.weight
    names = {module: name for name, module in model.named_modules()}
    parallelize_module(model, tp_mesh, {
        names[embedding]: RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        # Whole logits only where the model's own forward computes them (a decoding step, one checked position).
        names[output]: ColwiseParallel(output_layouts=Replicate()),
    })
    if tied:  # both split their weight by vocabulary rows (Shard(0)): one parameter again, as transformers tied it
        output.weight = embedding.weight


# --------------------------------------------------------------------------------------------- vocabulary-parallel


class _SumOverRanks(torch.autograd.Function):
    """Forward: the sum over the group's ranks. Backward: the gradient as it is. Every rank of the group computes
    the same loss from the sum, so each rank's share gets the loss's gradient exactly once (Megatron-LM's
    "reduce from the tensor-parallel region")."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _SharedInput(torch.autograd.Function):
    """Forward: the tensor as it is. Backward: the gradient summed over the group. A replicated input (the final
    hidden states) that each rank multiplies by its own slice of a weight gets its whole gradient from every slice
    (Megatron-LM's "copy to the tensor-parallel region")."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


@dataclass(frozen=True)
class VocabShard:
    """This rank's slice [offset, offset + size) of an output layer split by vocabulary over `group`."""

    group: object
    offset: int
    size: int

    def logits(self, projection: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's logits [N, size] of hidden states [N, H] replicated over the group."""
        weight = projection.weight
        weight = weight.to_local() if hasattr(weight, "to_local") else weight
        bias = projection.bias.to_local() if getattr(projection, "bias", None) is not None else None
        return F.linear(_SharedInput.apply(hidden, self.group), weight, bias)


def vocab_shard(model) -> VocabShard | None:
    """The output layer's slice on this rank when `model` is split by tensor parallel, else None."""
    layout = layout_of(model)
    if layout.tp_size == 1:
        return None
    size = int(hf_config(model).get_text_config().vocab_size) // layout.tp_size
    return VocabShard(layout.tp_group, layout.tp_rank * size, size)


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor, shard: VocabShard,
                            with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(z)[target] [N] and, with `with_entropy`, the entropy [N], from this rank's slice of the logits
    z [N, size] (fp32): a log-sum-exp over the ranks' slices, lse = m + log sum_ranks sum_v exp(z_v - m), the
    target's logit from the rank holding it, and H = lse - sum_v p_v z_v (Megatron-LM's vocabulary-parallel cross
    entropy, with the entropy beside it). Two all-reduces: the maximum, then the sums; the same numbers as the
    whole vocabulary's log-softmax, up to float summation order. Every rank of the group must compute the same loss
    from the results (their gradient reaches each rank's slice once)."""
    with torch.no_grad():
        peak = logits.max(-1).values
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=shard.group)
    shifted = logits - peak[:, None]
    exp = shifted.exp()
    local = targets - shard.offset
    here = (local >= 0) & (local < shard.size)
    picked = shifted.gather(-1, local.clamp(0, shard.size - 1)[:, None])[:, 0] * here
    parts = [exp.sum(-1), picked] + ([(exp * shifted).sum(-1)] if with_entropy else [])
    sums = _SumOverRanks.apply(torch.stack(parts), shard.group)  # one all-reduce for the two (three) sums
    log_total = sums[0].log()
    logprobs = sums[1] - log_total
    return logprobs, (log_total - sums[2] / sums[0]) if with_entropy else None
