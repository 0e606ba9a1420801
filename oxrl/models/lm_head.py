"""Log-probs and entropy of a long row without its whole [tokens, vocabulary] logits.

The update needs log p(target) (and for some losses the entropy) at each trained position. Taken from the model's
logits, that is a [N, V] fp32 tensor, and the log-softmax saved for its backward is another: for a 150k vocabulary
at 8k trained tokens, 4.9 GB each. Above `FULL_LOGITS_ELEMENTS` oxRL instead takes the final hidden states [N, H]
from the forward and runs the model's own output layer one chunk of rows at a time, under activation checkpointing:
a chunk's logits exist only while its log-probs are computed, and again while its gradient is, so memory is bounded
by one chunk whatever N x V is. The price is the output layer's forward run twice for those rows (its matmul is
then 4/3 of what it was), which is why short rows keep the plain path, where the whole [N, V] costs little.

The output layer is the model's `get_output_embeddings()` module (called as a module, so FSDP2's and DeepSpeed's
hooks gather its weights and LoRA on it applies) followed by the family's own step from projection to logits:
Gemma's final soft-capping, Cohere's and Falcon-H1's scale, Granite's division. Each forward also asks the model
for its real logits at one kept position and checks that this head reproduces them, so a family that does
something else is an error naming it, never silently different log-probs.

Sharded weights: FSDP2 keeps its root unit (which holds the output layer) gathered from the forward to the end of
the backward (oxrl/training/fsdp.py), so the chunks are plain matmuls. DeepSpeed ZeRO-3 instead gathers a module's
partitioned weights on every call, a collective that every rank must join: there the choice to chunk and the
number of chunks are agreed across ranks (the maximum), and a rank with fewer rows makes empty calls, which stay
in the loss's graph so that their recomputation in the backward gathers in step with the other ranks' too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.utils.checkpoint import checkpoint

from oxrl.models.model_inputs import hf_config, layout_of

if TYPE_CHECKING:
    from oxrl.models.parallel import VocabShard

# N x V above which logits are never held whole (512 MiB in fp32), and the size of one chunk (128 MiB).
FULL_LOGITS_ELEMENTS = 2**27
CHUNK_ELEMENTS = 2**25


@dataclass(frozen=True)
class OutputHead:
    """A causal LM's step from final hidden states [N, H] to logits [N, V]."""

    projection: torch.nn.Module  # the lm_head
    model_type: str
    multiplier: float = 1.0  # Cohere `logit_scale`, Falcon-H1 `lm_head_multiplier`, 1 / Granite `logits_scaling`
    softcap: float | None = None  # Gemma `final_logit_softcapping`: logits = cap * tanh(logits / cap)
    gathers_per_call: bool = False  # each call is a collective (ZeRO-3): every rank makes as many
    shard: "VocabShard | None" = None  # tensor parallel: this rank's slice of the vocabulary (oxrl/models/parallel.py)

    @property
    def vocab_size(self) -> int:
        """The logits' width on this rank."""
        if self.shard is not None:
            return self.shard.size
        return int(self.projection.out_features)  # kept by ZeRO-3, whose partitioned weight has no shape

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.projection(hidden) if self.shard is None else self.shard.logits(self.projection, hidden)
        if self.multiplier != 1.0:
            logits = logits * self.multiplier
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def check(self, hidden_row: torch.Tensor, model_logits_row: torch.Tensor) -> None:
        """Raises unless this head turns `hidden_row` [1, H] into the model's own logits `model_logits_row` [1, V]."""
        with torch.no_grad():
            ours = self.logits(hidden_row).float()
            theirs = model_logits_row.float()
            if self.shard is not None:
                theirs = theirs[:, self.shard.offset : self.shard.offset + self.shard.size]
            gap = float((ours - theirs).abs().max())
            if gap > 1e-3 * (1.0 + float(theirs.abs().max())):
                raise ValueError(
                    f"oxRL's chunked log-probs do not reproduce the logits of this {self.model_type!r} model (max gap "
                    f"{gap:.3g}): the family turns its final hidden states into logits in a way oxRL does not know "
                    f"(oxrl/models/lm_head.py lists the known ones), so rows above {FULL_LOGITS_ELEMENTS:,} "
                    "positions x vocabulary cannot be scored by it; use shorter micro-batches "
                    "(train.micro_batch_size_per_device / data.max_length)"
                )


def output_head(model) -> OutputHead:
    """The model's output layer and its family's logit step, read from its (text) config."""
    inner = getattr(model, "module", model)  # DeepSpeed's engine wraps the model
    config = hf_config(model)
    text = config.get_text_config()
    multiplier = 1.0
    for key in ("logit_scale", "lm_head_multiplier"):
        value = getattr(text, key, None)
        if isinstance(value, (int, float)):
            multiplier *= float(value)
    scaling = getattr(text, "logits_scaling", None)
    if isinstance(scaling, (int, float)):
        multiplier /= float(scaling)
    shard = None
    if layout_of(model).tp_size > 1:  # (loaded only for a split model)
        from oxrl.models.parallel import vocab_shard

        shard = vocab_shard(model)
    return OutputHead(inner.get_output_embeddings(), config.model_type, multiplier,
                      getattr(text, "final_logit_softcapping", None) or None, gathers_per_call(model), shard)


def gathers_per_call(model) -> bool:
    """Whether each call of the model's modules gathers their weights: a DeepSpeed engine at ZeRO stage 3."""
    partitioned = getattr(model, "zero_optimization_partition_weights", None)
    return callable(partitioned) and bool(partitioned())


def most_over_ranks(value: int, device: torch.device) -> int:
    """The largest `value` any rank holds (ZeRO-3 runs in an initialised process group)."""
    tensor = torch.tensor([value], device=device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return int(tensor.item())


def should_chunk(model, rows: int) -> bool:
    """Whether `rows` positions' logits would be too large to hold whole (on any rank, where weights are gathered
    per call: every rank must then take the chunked path together). A model split by tensor or context parallel
    always takes it: its logits are never gathered, and its rows are computed from their ranks' hidden states."""
    if layout_of(model).splits:
        return True
    chunk = rows * int(hf_config(model).get_text_config().vocab_size) > FULL_LOGITS_ELEMENTS
    if gathers_per_call(model):
        chunk = bool(most_over_ranks(int(chunk), next(model.parameters()).device))
    return chunk


def chunked_logprobs(head: OutputHead, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                     with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits[i] / temperature)[targets[i]] [N] and, with `with_entropy`, each row's entropy [N], from
    hidden states [N, H]: the same numbers as from the full logits, with one chunk of logits alive at a time."""
    rows = max(1, CHUNK_ELEMENTS // head.vocab_size)

    def chunk(states: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if head.shard is not None:
            from oxrl.models.parallel import vocab_parallel_logprobs

            logp, entropy = vocab_parallel_logprobs(head.logits(states).float() / temperature, ids, head.shard,
                                                    with_entropy)
            return logp, entropy if with_entropy else logp.new_zeros(0)
        logp = (head.logits(states).float() / temperature).log_softmax(-1)
        entropy = -(logp.exp() * logp).sum(-1) if with_entropy else logp.new_zeros(0)
        return logp.gather(-1, ids[:, None])[:, 0], entropy

    # Without a graph (reference models, scoring) there is nothing to recompute, so no checkpoint.
    run = (lambda *args: checkpoint(chunk, *args, use_reentrant=False)) if torch.is_grad_enabled() else chunk
    states, ids = list(hidden.split(rows)), list(targets.split(rows))
    if head.gathers_per_call:  # as many calls as the rank with the most chunks (module docstring)
        missing = most_over_ranks(len(states), hidden.device) - len(states)
        states, ids = states + [hidden[:0]] * missing, ids + [targets[:0]] * missing
    if not hidden.shape[0] and not head.gathers_per_call:  # no row (a context-parallel rank that predicts no target)
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty if with_entropy else None
    pieces = [run(chunk_states, chunk_ids) for chunk_states, chunk_ids in zip(states, ids)]
    logprobs = torch.cat([logp for logp, _ in pieces])
    return logprobs, torch.cat([entropy for _, entropy in pieces]) if with_entropy else None
