"""Preference, KTO, reward-model and distillation objectives: packed micro-batch -> pure loss.

| objective                                   | examples                   | loss unit (`count_units`) | fixed model      |
|---------------------------------------------|----------------------------|---------------------------|------------------|
| `dpo` `rdpo` `hinge` `ipo` `simpo` `orpo`   | [chosen, rejected]         | pairs                     | reference (not simpo/orpo) |
| `kto`                                       | [completion] + `label`     | examples                  | reference        |
| `rm`                                        | [chosen, rejected]         | pairs                     | none (a sequence classifier is trained) |
| `kd_forward` `kd_reverse` `kd_jsd`          | [sequence]                 | trained tokens            | teacher          |

Chosen and rejected are packed in the same row, so one forward pass scores both. Sequence
log-probs come from `token_logprobs` + `sequence_sums` (response tokens only: the loss mask).
The pure losses (`oxrl.algorithms`) return SUMS over their pairs/examples/tokens; here the loss
and every metric are divided by `normaliser`, the loop's count of units in the whole optimizer
step, so the loop's summed metrics are step means (e.g. `rewards/accuracy` is the fraction of
the step's pairs ranked right). The `count/*` metric equal to the unit count is dropped; KTO's
`count/desirable` becomes the fraction of desirable examples, so the mean desirable reward is
`rewards/desirable / count/desirable`.

KTO's KL reference point z0 is estimated per micro-batch, from mismatched pairs built inside
it: the prompt of example i (its tokens before the first trained token) followed by the
completion of example i+1 (mod micro-batch size). A micro-batch of one example has no mismatched
pair and uses z0 = 0; the config requires micro-batches of at least two for training.
"""

from __future__ import annotations

import torch

from oxrl.algorithms.distill import DISTILL_LOSSES, DISTILL_OBJECTIVES, DistillInput, DistillParams
from oxrl.algorithms.kto import KTOInput, KTOParams, kto_loss
from oxrl.models.logprobs import forward_logits, sequence_sums, token_logprobs
from oxrl.algorithms.preference import PREFERENCE_LOSSES, LossOutput, PreferenceInput
from oxrl.algorithms.reward_model import RewardModelInput, bradley_terry_loss
from oxrl.config.params import params_from
from oxrl.config.schema import PreferenceConfig
from oxrl.data.types import Example, PackedBatch, Sequence, pack
from oxrl.loops.sl import Objective
from oxrl.models.reward_model import sequence_scores

REWARD_MODEL_OBJECTIVE = "rm"
# The count each loss reports that is the objective's own unit (dividing it by the normaliser gives 1).
_UNIT_COUNTS = ("count/pairs", "count/examples", "count/tokens")


def _normalised(out: LossOutput, normaliser: float) -> LossOutput:
    loss = out.loss / normaliser
    metrics = {key: value / normaliser for key, value in out.metrics.items() if key not in _UNIT_COUNTS}
    return LossOutput(loss, {"loss": loss.detach(), **metrics})


def _pair_indices(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence indices of the chosen [P] and rejected [P] responses; pair i is example i."""
    if batch.num_sequences != 2 * batch.num_examples or int(batch.seq_role.max()) != 1:
        raise ValueError("pairwise objectives need examples of two sequences, [chosen, rejected] "
                         "(data format `preference`); this micro-batch has "
                         f"{batch.num_sequences} sequences for {batch.num_examples} examples")
    return (batch.seq_role == 0).nonzero()[:, 0], (batch.seq_role == 1).nonzero()[:, 0]


def _trained_tokens(batch: PackedBatch) -> torch.Tensor:
    """[S] float count of each sequence's trained tokens."""
    return sequence_sums(torch.ones_like(batch.position_ids[0], dtype=torch.float32), batch)


def _require(reference, name: str, what: str = "reference model") -> None:
    if reference is None:
        raise ValueError(f"objective `{name}` needs a {what}, but none was passed")


def _count_pairs(batch: PackedBatch) -> int:
    return batch.num_examples


def _pairwise(name: str, params) -> Objective:
    """`name`'s pairwise loss with `params`, an instance of its own parameter class."""
    loss_fn, _, needs_reference = PREFERENCE_LOSSES[name]

    def compute(model, batch: PackedBatch, normaliser: float, reference=None) -> LossOutput:
        logps = sequence_sums(token_logprobs(model, batch), batch)  # [S], one forward for both sides
        chosen, rejected = _pair_indices(batch)
        tokens = _trained_tokens(batch)
        ref_chosen = ref_rejected = None
        if needs_reference:
            _require(reference, name)
            ref_logps = reference.sequence_logps(batch)  # [S]
            ref_chosen, ref_rejected = ref_logps[chosen], ref_logps[rejected]
        inp = PreferenceInput(logps[chosen], logps[rejected], tokens[chosen], tokens[rejected], ref_chosen, ref_rejected)
        return _normalised(loss_fn(inp, params), normaliser)

    return Objective(name, _count_pairs, compute, needs_reference=needs_reference, shares_prefixes=True)


def mismatched_pairs(batch: PackedBatch) -> PackedBatch | None:
    """KTO's KL pairs: prompt of sequence i + completion of sequence i+1, packed; None for < 2 sequences."""
    if batch.num_sequences < 2:
        return None
    lengths = torch.bincount(batch.seq_index.cpu(), minlength=batch.num_sequences).tolist()
    ids = torch.split(batch.input_ids[0].cpu(), lengths)
    masks = torch.split(batch.loss_mask[0].cpu(), lengths)
    # The prompt is everything before the first trained token (argmax finds the first True).
    first_trained = [int(m.long().argmax()) if bool(m.any()) else len(m) for m in masks]
    examples = []
    for i in range(len(ids)):
        j = (i + 1) % len(ids)
        prompt = ids[i][: first_trained[i]].tolist()
        completion, completion_mask = ids[j][first_trained[j] :].tolist(), masks[j][first_trained[j] :].tolist()
        examples.append(Example([Sequence(prompt + completion, [False] * len(prompt) + completion_mask)]))
    return pack(examples).to(batch.input_ids.device)


def _kto(params: KTOParams) -> Objective:
    def compute(model, batch: PackedBatch, normaliser: float, reference=None) -> LossOutput:
        _require(reference, "kto")
        if batch.num_sequences != batch.num_examples or "label" not in batch.fields:
            raise ValueError("`kto` needs examples of one sequence with a `label` field (data format `kto`)")
        logps = sequence_sums(token_logprobs(model, batch), batch)  # [E]
        kl_batch = mismatched_pairs(batch)
        if kl_batch is None:
            kl_logps = ref_kl_logps = logps.new_zeros(0)  # z0 = 0
        else:
            with torch.no_grad():  # z0 is detached in the paper: no graph for these pairs
                kl_logps = sequence_sums(token_logprobs(model, kl_batch), kl_batch)
            ref_kl_logps = reference.sequence_logps(kl_batch)
        inp = KTOInput(logps, reference.sequence_logps(batch), batch.fields["label"] > 0.5, kl_logps, ref_kl_logps)
        return _normalised(kto_loss(inp, params), normaliser)

    return Objective("kto", lambda batch: batch.num_examples, compute, needs_reference=True)


def _reward_model(margin_field: str | None) -> Objective:
    def compute(model, batch: PackedBatch, normaliser: float, reference=None) -> LossOutput:
        scores = sequence_scores(model, batch)  # [S], one forward for both sides
        chosen, rejected = _pair_indices(batch)
        margin = None
        if margin_field is not None:
            if margin_field not in batch.fields:
                raise ValueError(f"preference.rm_margin_field is `{margin_field}` but the examples have fields {sorted(batch.fields)}")
            margin = batch.fields[margin_field].to(scores.dtype)  # [E]: pair i is example i
        return _normalised(bradley_terry_loss(RewardModelInput(scores[chosen], scores[rejected], margin)), normaliser)

    return Objective(REWARD_MODEL_OBJECTIVE, _count_pairs, compute)


def _distill(name: str, params: DistillParams) -> Objective:
    loss_fn = DISTILL_LOSSES[DISTILL_OBJECTIVES[name]]

    def compute(model, batch: PackedBatch, normaliser: float, reference=None) -> LossOutput:
        _require(reference, name, "teacher")
        # Row t of the logits predicts token t + 1 (the alignment of token_logprobs_from_logits), so
        # token t is trained from row t - 1; a sequence's first token is never trained, so no row
        # predicting across a packed boundary is ever used.
        student = forward_logits(model, batch)[:-1]  # [T-1, V]
        teacher = reference.logits(batch)[:-1]
        mask = batch.loss_mask[0, 1:]
        return _normalised(loss_fn(DistillInput(student, teacher, mask), params), normaliser)

    return Objective(name, lambda batch: batch.num_loss_tokens, compute, needs_reference=True)


PREFERENCE_OBJECTIVES = (*PREFERENCE_LOSSES, "kto", REWARD_MODEL_OBJECTIVE, *DISTILL_OBJECTIVES)


def preference_objective(name: str, cfg: PreferenceConfig | None = None) -> Objective:
    """The objective `name` of this module (one of `PREFERENCE_OBJECTIVES`), with the hyper-parameters of `cfg`
    (default: the defaults) that its loss reads bound, and only those read."""
    cfg = cfg or PreferenceConfig()
    if name in PREFERENCE_LOSSES:
        return _pairwise(name, params_from(PREFERENCE_LOSSES[name].params, cfg))
    if name == "kto":
        return _kto(params_from(KTOParams, cfg))
    if name == REWARD_MODEL_OBJECTIVE:
        return _reward_model(cfg.rm_margin_field)
    return _distill(name, params_from(DistillParams, cfg, lambda rule: name in rule.by))  # jsd_beta: kd_jsd's only
