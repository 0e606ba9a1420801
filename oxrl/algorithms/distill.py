"""Knowledge-distillation token losses between a student and a fixed teacher.

Every loss has the signature `(DistillInput, DistillParams) -> LossOutput`, looked up by name
in `DISTILL_LOSSES`. With p_S = softmax(student_logits / T), p_T = softmax(teacher_logits / T)
over the vocabulary at each masked position:

  forward_kl  KL(p_T || p_S) = sum_v p_T (log p_T - log p_S)   mass-covering (Hinton et al. 2015,
              arXiv:1503.02531; sequence-level: Kim & Rush 2016, arXiv:1606.07947)
  reverse_kl  KL(p_S || p_T) = sum_v p_S (log p_S - log p_T)   mode-seeking (MiniLLM, Gu et al.
              2023, arXiv:2306.08543)
  jsd         generalised JSD of GKD (Agarwal et al. 2023, arXiv:2306.13649, eq. 1):
              JSD(beta) = beta KL(p_T || M) + (1 - beta) KL(p_S || M),  M = beta p_T + (1 - beta) p_S

JSD(beta) tends to 0 at beta = 0 and 1 (M becomes p_S or p_T); JSD(beta)/beta tends to the
forward KL and JSD(beta)/(1 - beta) to the reverse KL, which is what the paper means by "behaves
like forward/reverse KL" there. TRL's `generalized_jsd_loss` uses the same formula inside (0, 1)
but returns the UNSCALED forward KL at beta = 0 and reverse KL at beta = 1, so its loss jumps at
both ends. We accept only 0 < beta < 1 and let the caller name `forward_kl` / `reverse_kl`.

Temperature: logits are divided by T before the softmax and the loss is NOT multiplied by T^2.
Hinton et al. multiply by T^2 to keep soft-target gradients on the scale of a hard-label loss
mixed in; LLM distillation (GKD, TRL) uses T = 1 and no factor. A caller that wants it multiplies.

The teacher is a constant: its logits are detached. Logits must be finite (a -inf logit makes
0 * log 0 terms NaN). Reduction: `loss` is the SUM over masked tokens of the per-token
divergence; the caller divides by the number of trained tokens in the whole optimizer step
(`count/tokens` is this call's share). Memory: one log_softmax per model, in (at least) float32, per chunk;
with `chunk_size` set and gradients on, each chunk is recomputed in backward
(torch.utils.checkpoint), so no [N, V] float32 intermediates outlive their chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from oxrl.algorithms.output import LossOutput


@dataclass(frozen=True)
class DistillInput:
    student_logits: Tensor  # [N, V] with grad
    teacher_logits: Tensor  # [N, V] (detached here)
    mask: Tensor  # [N] bool: positions whose next-token distribution is distilled

    def __post_init__(self) -> None:
        if self.student_logits.dim() != 2 or self.teacher_logits.shape != self.student_logits.shape:
            raise ValueError(
                f"student and teacher logits must share one shape [N, V], got "
                f"{tuple(self.student_logits.shape)} and {tuple(self.teacher_logits.shape)}"
            )
        if self.mask.shape != self.student_logits.shape[:1] or self.mask.dtype != torch.bool:
            raise ValueError(f"mask must be bool of shape [{self.student_logits.shape[0]}], got {self.mask.dtype} {tuple(self.mask.shape)}")


@dataclass(frozen=True)
class DistillParams:
    temperature: float = 1.0
    jsd_beta: float = 0.5  # GKD's beta: weight of the teacher in the mixture M, in (0, 1)
    chunk_size: int | None = None  # masked positions per chunk; None = all at once

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0.0 < self.jsd_beta < 1.0:
            raise ValueError(
                f"jsd_beta must be in (0, 1), got {self.jsd_beta}: JSD(beta) is 0 at the ends; "
                "use the 'forward_kl' (beta -> 0) or 'reverse_kl' (beta -> 1) loss instead"
            )
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 or None, got {self.chunk_size}")


def _kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) per row: sum_v p (log p - log q). [n, V], [n, V] -> [n]."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def _forward_kl_rows(log_student: Tensor, log_teacher: Tensor, params: DistillParams) -> Tensor:
    return _kl(log_teacher, log_student)


def _reverse_kl_rows(log_student: Tensor, log_teacher: Tensor, params: DistillParams) -> Tensor:
    return _kl(log_student, log_teacher)


def _jsd_rows(log_student: Tensor, log_teacher: Tensor, params: DistillParams) -> Tensor:
    beta = params.jsd_beta
    # log M = log(beta p_T + (1 - beta) p_S), stably and without stacking a [2, n, V] copy.
    log_mixture = torch.logaddexp(log_teacher + math.log(beta), log_student + math.log(1.0 - beta))
    return beta * _kl(log_teacher, log_mixture) + (1.0 - beta) * _kl(log_student, log_mixture)


def _compute_dtype(logits: Tensor) -> torch.dtype:
    """At least float32 (bf16 log-probs are too coarse for a KL); float64 stays float64."""
    return torch.promote_types(logits.dtype, torch.float32)


RowDivergence = Callable[[Tensor, Tensor, DistillParams], Tensor]


def _chunk_divergence(
    student_logits: Tensor, teacher_logits: Tensor, rows: Tensor, params: DistillParams, divergence: RowDivergence
) -> Tensor:
    """Per-token divergence of the selected rows [n]. The rows are gathered here, inside the
    (possibly checkpointed) function, so that no chunk copy is saved for backward."""
    dtype = _compute_dtype(student_logits)
    student, teacher = student_logits[rows].to(dtype), teacher_logits[rows].to(dtype)  # [n, V]
    if params.temperature != 1.0:  # skip a needless [n, V] copy at T = 1
        student, teacher = student / params.temperature, teacher / params.temperature
    return divergence(torch.log_softmax(student, dim=-1), torch.log_softmax(teacher, dim=-1), params)


def _masked_divergence_sum(batch: DistillInput, params: DistillParams, divergence: RowDivergence) -> LossOutput:
    rows = batch.mask.nonzero().squeeze(-1)  # [n] indices of masked positions
    teacher_logits = batch.teacher_logits.detach()
    n = rows.numel()
    chunk = params.chunk_size or max(n, 1)
    recompute = params.chunk_size is not None and torch.is_grad_enabled() and batch.student_logits.requires_grad
    # Empty mask: a zero that is still attached to the graph, so backward() works.
    total = batch.student_logits[:0].to(_compute_dtype(batch.student_logits)).sum()
    for start in range(0, n, chunk):
        chunk_rows = rows[start : start + chunk]
        if recompute:
            per_token = checkpoint(
                _chunk_divergence, batch.student_logits, teacher_logits, chunk_rows, params, divergence, use_reentrant=False
            )
        else:
            per_token = _chunk_divergence(batch.student_logits, teacher_logits, chunk_rows, params, divergence)
        total = total + per_token.sum()
    metrics = {
        "distill/divergence": total.detach(),
        "count/tokens": torch.tensor(float(n), dtype=total.dtype, device=total.device),
    }
    return LossOutput(total, metrics)


def forward_kl_loss(batch: DistillInput, params: DistillParams) -> LossOutput:
    """Sum over masked tokens of KL(p_T || p_S) (Hinton et al. 2015, arXiv:1503.02531)."""
    return _masked_divergence_sum(batch, params, _forward_kl_rows)


def reverse_kl_loss(batch: DistillInput, params: DistillParams) -> LossOutput:
    """Sum over masked tokens of KL(p_S || p_T) (MiniLLM, arXiv:2306.08543, token level)."""
    return _masked_divergence_sum(batch, params, _reverse_kl_rows)


def jsd_loss(batch: DistillInput, params: DistillParams) -> LossOutput:
    """Sum over masked tokens of GKD's JSD(beta) (arXiv:2306.13649); see the module docstring."""
    return _masked_divergence_sum(batch, params, _jsd_rows)


DistillLoss = Callable[[DistillInput, DistillParams], LossOutput]

DISTILL_LOSSES: dict[str, DistillLoss] = {
    "forward_kl": forward_kl_loss,
    "reverse_kl": reverse_kl_loss,
    "jsd": jsd_loss,
}
# Algorithm name (`algorithm.name`) -> the loss above it trains.
DISTILL_OBJECTIVES = {"kd_forward": "forward_kl", "kd_reverse": "reverse_kl", "kd_jsd": "jsd"}


def distill_loss(name: str, batch: DistillInput, params: DistillParams) -> LossOutput:
    """Look up `name` in DISTILL_LOSSES and apply it; an unknown name lists the valid ones."""
    if name not in DISTILL_LOSSES:
        raise ValueError(f"unknown distillation loss {name!r}; valid: {sorted(DISTILL_LOSSES)}")
    return DISTILL_LOSSES[name](batch, params)
