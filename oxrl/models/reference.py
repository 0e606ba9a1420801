"""Fixed models an objective compares the policy against: the reference of DPO/KTO, the KD teacher.

A fixed model is never trained; objectives ask it for `sequence_logps(batch)` (the summed
log-probs of each packed sequence's trained tokens, [S]) or `logits(batch)` ([T, V]), always
without gradient. Three ways to get the reference pi_ref, all equal to the policy as it was
before its first update (`preference.reference`):

* `frozen_copy`   a deep copy of the policy in eval mode, requires_grad off. Costs one model's
                  memory; works for any model.
* `lora_disabled` the policy itself inside peft's `disable_adapter()` context: with LoRA the
                  base weights never change, so the base model IS the reference. No second copy.
* `precomputed`   the policy scores every training and validation sequence once before training
                  (it is still the reference then); only the numbers are kept, in memory, keyed by
                  the sequence's tokens and loss mask. No reference forward pass during training
                  and no reference weights in memory. Sequences that were not scored (e.g. KTO's
                  mismatched pairs, which depend on the micro-batch) cannot be looked up.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from contextlib import contextmanager
from typing import Iterator

import torch

from oxrl.models.logprobs import forward_logits, sequence_sums, token_logprobs
from oxrl.config.schema import ModelConfig
from oxrl.data.sampler import micro_batches
from oxrl.data.types import Example, PackedBatch, pack
from oxrl.models.load import is_peft

logger = logging.getLogger(__name__)


class FrozenModel:
    """A model used only for inference: every call runs without gradient."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    @contextmanager
    def active(self) -> Iterator[None]:
        """`self.model` is the fixed model inside (no gradient)."""
        with torch.no_grad():
            yield

    def logits(self, batch: PackedBatch) -> torch.Tensor:
        """[T, V] logits of a packed row."""
        with self.active():
            return forward_logits(self.model, batch)

    def sequence_logps(self, batch: PackedBatch) -> torch.Tensor:
        """[S] log-prob sums over each sequence's trained tokens."""
        with self.active():
            return sequence_sums(token_logprobs(self.model, batch), batch)


class AdapterDisabledReference(FrozenModel):
    """The base model under a peft policy: the same module with its LoRA adapters switched off."""

    def __init__(self, policy: torch.nn.Module):
        if not is_peft(policy):
            raise ValueError("preference.reference `lora_disabled` needs a LoRA (peft) policy: set lora.enabled: true")
        super().__init__(policy)

    @contextmanager
    def active(self) -> Iterator[None]:
        # Eval mode for the reference pass (no dropout), then back to whatever the loop had set.
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self.model.disable_adapter():
                yield
        finally:
            self.model.train(was_training)


def sequence_keys(batch: PackedBatch) -> list[bytes]:
    """One key per packed sequence: a digest of its token ids and loss mask (what its log-prob sum depends on)."""
    ids = batch.input_ids[0].cpu()
    mask = batch.loss_mask[0].cpu()
    lengths = torch.bincount(batch.seq_index.cpu(), minlength=batch.num_sequences).tolist()
    keys, start = [], 0
    for length in lengths:
        piece_ids, piece_mask = ids[start : start + length], mask[start : start + length]
        keys.append(hashlib.blake2b(piece_ids.numpy().tobytes() + piece_mask.numpy().tobytes(), digest_size=16).digest())
        start += length
    return keys


class PrecomputedReference:
    """Reference sequence log-probs looked up from a table filled before training."""

    def __init__(self, table: dict[bytes, float]):
        self.table = table

    def sequence_logps(self, batch: PackedBatch) -> torch.Tensor:
        keys = sequence_keys(batch)
        missing = sum(key not in self.table for key in keys)
        if missing:
            raise KeyError(f"{missing} of {len(keys)} sequences of this micro-batch were not scored before training; "
                           "preference.reference `precomputed` only knows the training and validation sequences")
        return torch.tensor([self.table[key] for key in keys], dtype=torch.float32, device=batch.input_ids.device)


def precompute_reference(model: torch.nn.Module, examples: list[Example], micro_size: int, strategy,
                         progress_bar: bool = True) -> PrecomputedReference:
    """Score every sequence of `examples` with `model` (which must still be the reference) once: the examples the run
    will use (oxrl.loops.sl.examples_used), shown as they are scored (a bar, or log lines: oxrl/logging/progress.py)."""
    from oxrl.logging.progress import progress

    table: dict[bytes, float] = {}
    was_training = model.training
    model.eval()
    chunks = micro_batches(examples, micro_size)
    try:
        for chunk in progress(chunks, "reference log-probs", unit="micro-batch", bar=progress_bar,
                              enabled=strategy.is_main):
            batch = pack(chunk).to(strategy.device)
            # Same autocast as the training loop, so the numbers match a reference run inside it.
            with torch.no_grad(), strategy.autocast():
                logps = sequence_sums(token_logprobs(model, batch), batch)
            table.update(zip(sequence_keys(batch), logps.float().tolist()))
    finally:
        model.train(was_training)
    logger.info("precomputed reference log-probs of %d sequences", len(table))
    return PrecomputedReference(table)


def build_reference(kind: str, policy: torch.nn.Module, examples: list[Example], micro_size: int, strategy,
                    progress_bar: bool = True):
    """The reference of `kind` (`preference.reference`'s choices) for a policy that has not been updated yet: every
    objective's, RL's KL term's and SPIN's opponent. A frozen copy is sharded like the policy (the strategy's
    `prepare_frozen`); `lora_disabled` is the policy itself, which the loop prepares; `precomputed` scores `examples`
    (`progress_bar`: shown with a bar, else with log lines)."""
    if kind == "frozen_copy":
        return FrozenModel(strategy.prepare_frozen(copy.deepcopy(policy).eval().requires_grad_(False)))
    if kind == "lora_disabled":
        return AdapterDisabledReference(policy)
    if kind == "precomputed":
        return precompute_reference(policy, examples, micro_size, strategy, progress_bar)
    raise ValueError(f"unknown preference.reference {kind!r}; valid: frozen_copy, lora_disabled, precomputed")


def load_teacher(path: str, student_cfg: ModelConfig, student: torch.nn.Module, device: torch.device) -> FrozenModel:
    """The KD teacher from `path`, loaded like the student (dtype, attention), frozen and in eval mode."""
    from oxrl.models.load import load_model

    teacher_cfg = student_cfg.model_copy(update={"name_or_path": path, "gradient_checkpointing": False, "tokenizer": None})
    teacher = load_model(teacher_cfg, device).eval().requires_grad_(False)
    student_vocab = student.get_output_embeddings().weight.shape[0]
    teacher_vocab = teacher.get_output_embeddings().weight.shape[0]
    if student_vocab != teacher_vocab:
        raise ValueError(f"the teacher {path} has {teacher_vocab} output logits, the student {student_vocab}: "
                         "distillation compares them token by token, so both need the same tokenizer and vocabulary")
    return FrozenModel(teacher)
