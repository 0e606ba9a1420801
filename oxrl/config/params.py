"""Config section -> the hyper-parameter dataclass of a loss, by field name.

Each field of a `*Params` dataclass (oxrl/algorithms) is filled from the same-named setting of its
config section, so a hyper-parameter is named once, in the dataclass and in the config, and not mapped
by hand. A setting the run does not read (a `ReadOnly` rule of it does not hold, so the config refuses it
when set) is not read here either: its field keeps the dataclass's default, which is the setting's. The
few fields that are not a setting of that name are listed in `NOT_BY_NAME`, the one place that says
where each comes from; a field in neither place is an error, and tests/unit/test_declared_once.py
checks every such field is exposed (with the dataclass's default) or listed. Each loop names its own
(`loss_params` in oxrl/loops/rl_update.py), so this module imports no algorithm.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, TypeVar

from pydantic import BaseModel

from oxrl.config.schema import ReadOnly, rules_of

P = TypeVar("P")

# Keeps the dataclass's default: an implementation constant, not a setting.
FIXED = None
# Given by the caller (`params_from(..., field=value)`): a value the run derives from settings outside the section.
GIVEN = "given by the caller"

# Params class name -> {field: how it is derived from the section, FIXED or GIVEN}, for the fields that are not a
# same-named setting of the section.
NOT_BY_NAME: dict[str, dict[str, Callable[[Any], Any] | str | None]] = {
    "PolicyLossParams": {
        "max_len": GIVEN,  # seq_mean_token_sum_norm's constant (Dr. GRPO): Config.completion_tokens
        "kl_coef": lambda rl: 0.0 if rl.kl_penalty_in_reward else rl.kl_coef,  # then a reward penalty
    },
    "AdvantageParams": {
        "eps": FIXED,  # added to the std before dividing
        "unbiased_std": FIXED,  # Bessel-corrected group std, as TRL and verl use
        "group_baseline": FIXED,  # reinforce_pp subtracts the group mean (REINFORCE++-baseline)
    },
    "KTOParams": {
        "desirable_weight": lambda preference: preference.kto_desirable_weight,
        "undesirable_weight": lambda preference: preference.kto_undesirable_weight,
    },
    "DistillParams": {"chunk_size": FIXED},  # memory only: the loss is the same for any chunking
}


def params_from(params_class: type[P], section: BaseModel, holds: Callable[[ReadOnly], bool] = lambda rule: True,
                **given: Any) -> P:
    """`params_class` with each field from `section`'s same-named setting, or as `NOT_BY_NAME` says. `holds`: whether
    one of the setting's `ReadOnly` rules holds for the run; a setting whose rules do not all hold is not read.
    `given`: the fields `NOT_BY_NAME` marks GIVEN."""
    special = NOT_BY_NAME.get(params_class.__name__, {})
    values = {}
    for field in dataclasses.fields(params_class):
        if special.get(field.name) is GIVEN:
            if field.name not in given:
                raise TypeError(f"{params_class.__name__}.{field.name} is given by the caller: pass {field.name}=")
            values[field.name] = given.pop(field.name)
        elif field.name in special:
            if special[field.name] is not FIXED:
                values[field.name] = special[field.name](section)
        elif field.name in type(section).model_fields:
            if all(holds(rule) for rule in rules_of(type(section), field.name)):
                values[field.name] = getattr(section, field.name)
        else:
            raise TypeError(f"{params_class.__name__}.{field.name} is neither a setting of {type(section).__name__} "
                            "nor listed in oxrl.config.params.NOT_BY_NAME: expose it in the config, or list it")
    if given:
        raise TypeError(f"{params_class.__name__}: {', '.join(given)} not marked GIVEN in oxrl.config.params.NOT_BY_NAME")
    return params_class(**values)

