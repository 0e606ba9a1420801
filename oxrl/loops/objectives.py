"""Every offline objective by name: the token objectives (SFT, CPT) defined here, and the preference,
KTO, reward-model and distillation ones of preference_objectives.py, imported only by a run that names
one (an SFT run reads none of them). The interface, `Objective`, is the loop's (sl.py); new objectives
register here and the loop does not change.
"""

from __future__ import annotations

from typing import Callable

import torch

from oxrl.models.logprobs import token_logprobs
from oxrl.algorithms.sft import TOKEN_LOSSES, LossOutput, TokenLossInput
from oxrl.config.names import OFFLINE_ALGORITHMS, RL_ALGORITHMS, unknown_algorithm_message
from oxrl.config.schema import PreferenceConfig
from oxrl.data.types import PackedBatch
from oxrl.loops.sl import Objective


def _sequence_mask(batch: PackedBatch) -> torch.Tensor:
    # Every token but the first of each sequence has a prediction.
    return batch.position_ids[0] > 0


def _token_objective(name: str, units_mask: Callable[[PackedBatch], torch.Tensor]) -> Objective:
    loss_fn = TOKEN_LOSSES[name]

    def compute(model, batch: PackedBatch, normaliser: float, reference=None) -> LossOutput:
        logprobs = token_logprobs(model, batch, targets=units_mask(batch))
        return loss_fn(TokenLossInput(logprobs, batch.loss_mask[0], _sequence_mask(batch), normaliser))

    return Objective(name, lambda b: int(units_mask(b).sum()), compute)


OBJECTIVES: dict[str, Objective] = {
    "sft": _token_objective("sft", lambda b: b.loss_mask[0]),
    "cpt": _token_objective("cpt", _sequence_mask),
}


def all_objectives(preference: PreferenceConfig | None = None) -> dict[str, Objective]:
    """The token objectives above plus the preference / KTO / RM / KD ones, built with `preference`'s
    hyper-parameters (defaults when None)."""
    from oxrl.loops.preference_objectives import PREFERENCE_OBJECTIVES, preference_objective

    return {**OBJECTIVES, **{name: preference_objective(name, preference) for name in PREFERENCE_OBJECTIVES}}


def get_objective(name: str, preference: PreferenceConfig | None = None) -> Objective:
    """The offline objective `name`, built with the `preference` hyper-parameters it reads (defaults when None)."""
    key = name.strip().lower()  # the config stores names in lower case; library callers may not
    if key in OBJECTIVES:
        return OBJECTIVES[key]
    if key in OFFLINE_ALGORITHMS:
        from oxrl.loops.preference_objectives import preference_objective

        return preference_objective(key, preference)
    if key in RL_ALGORITHMS:
        raise ValueError(f"`{name}` is an RL algorithm, not an offline objective: oxrl.runner.run trains it "
                         "with the RL loop (oxrl.loops.rl.train_rl)")
    raise ValueError(unknown_algorithm_message(name, "offline objective", OFFLINE_ALGORITHMS))
