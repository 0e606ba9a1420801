"""What a resume checks before anything loads: the checkpoint is complete and intact, and the config is the one it was
trained with (or `run.accept_config_changes` takes the differences), IGNORED_ON_RESUME aside. A new run never reads
this (oxrl/training/run_dir.py calls it when `run.resume` names a checkpoint).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from oxrl.config.load import flatten, read_yaml_file, saved_form
from oxrl.config.schema import Config, section_in
from oxrl.training.folders import RunDirError

logger = logging.getLogger(__name__)

# Keys that say where a run lives or how its progress is shown: a resume may change them freely.
IGNORED_ON_RESUME = frozenset({
    "run.name", "run.output_dir", "run.resume", "run.overwrite", "run.accept_config_changes",
    "logging.progress_bar", "logging.plot", "logging.report_to", "logging.project", "logging.mlflow_tracking_uri",
    "checkpoint.keep_last",
    "checkpoint.on_signal",  # how a run stops, not what it computes
    "logging.mlflow",  # replaced by logging.report_to; still in the config.yaml of runs saved before
    "rl.data_format",  # replaced by data.train[].format; likewise
})


def check_resumable(checkpoint: Path, cfg: Config, check_rank_state: Callable[[Path, int], None] | None) -> None:
    """The checkpoint is complete, and the config matches the one it was trained with (or changes are accepted)."""
    from oxrl.training.checkpoint import check_intact, step_of

    if not (checkpoint / "training_state" / "trainer_state.json").is_file():
        raise RunDirError(f"run.resume: {checkpoint} is not a complete oxRL checkpoint (no training_state/trainer_state.json)")
    check_intact(checkpoint, check_rank_state)  # before anything loads
    saved_path = checkpoint.parent.parent / "config.yaml"
    if not saved_path.is_file():
        logger.warning("resuming from %s: no config.yaml beside it (%s), so config changes cannot be checked",
                       checkpoint, saved_path)
        return
    changes = config_changes(read_yaml_file(saved_path) or {}, saved_form(cfg))
    if not changes:
        return
    listing = "\n  ".join(changes)
    if not cfg.run.accept_config_changes:
        raise RunDirError(f"run.resume: the config differs from the one {checkpoint} was trained with ({saved_path}):\n  "
                          f"{listing}\nset run.accept_config_changes=true to resume with the new values (they apply "
                          "from the resumed step, the learning rate and schedule included), or restore the saved ones")
    logger.warning("resuming with config changes (run.accept_config_changes); the new values apply from step %d, "
                   "the learning rate and schedule included:\n  %s", step_of(checkpoint), listing)


def config_changes(saved: dict, new: dict) -> list[str]:
    """`key: saved -> new` for every dotted key whose value differs (IGNORED_ON_RESUME aside). A setting absent from
    the saved config.yaml and at its declared default now is no change: it was added to oxRL after that run was saved,
    and a new setting's default does what the code did before it."""
    old_flat, new_flat = flatten(saved), flatten(new)
    lines = []
    for key in sorted(old_flat.keys() | new_flat.keys()):
        if key in IGNORED_ON_RESUME or old_flat.get(key, _ABSENT) == new_flat.get(key, _ABSENT):
            continue
        if key not in old_flat and new_flat[key] == _declared_default(key):
            continue
        lines.append(f"{key}: {_shown(old_flat.get(key, _ABSENT))} -> {_shown(new_flat.get(key, _ABSENT))}")
    return lines


_ABSENT = object()


def _declared_default(key: str):
    """The schema's default of dotted `key` (`run.push_to_hub`) as a saved config.yaml writes it, or _ABSENT where the
    key is no field of a section (an entry of a list: `data.train.0.path`) or the field has no default."""
    from pydantic_core import to_jsonable_python

    *sections, name = key.split(".")
    section = Config
    for part in sections:
        field = section.model_fields.get(part)
        section = section_in(field.annotation) if field is not None else None
        if section is None:
            return _ABSENT
    field = section.model_fields.get(name)
    if field is None or field.is_required():
        return _ABSENT
    return to_jsonable_python(field.get_default(call_default_factory=True))


def _shown(value) -> str:
    return "(not set)" if value is _ABSENT else json.dumps(value)
