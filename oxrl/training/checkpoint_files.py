"""Reading a checkpoint's files, which may be damaged (a crash, a full disk, a bad copy) or hostile (a
checkpoint from someone else).

Every reader refuses in one line that names the file and says what to do (`CheckpointError`). Torch files
load with `weights_only=True`: tensors and plain values, nothing executed. torch's own error for a file
holding anything else advises `weights_only=False`, which would run whatever the file holds, so that advice
is never passed on. A file that is not a regular file (a FIFO would block the read forever, /dev/zero never
end) is refused by what it is.

A checkpoint's recorded step must be a step number and the one its folder's name says (`step_000010`): a
resume trusts it to drop the later checkpoints of a rewind, set the schedule's position and skip the data
already seen, so a step of -5 or of 3 in `step_000002` is refused, not trained on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from oxrl.files import InputFileError, check_regular, read_bounded

STEP_PREFIX = "step_"
STEP_FOLDER = re.compile(STEP_PREFIX + r"([0-9]+)")
TRAINER_STATE = Path("training_state") / "trainer_state.json"
# Counters a resume continues from, besides `step`: in trainer_state.json, and a companion's nonfinite.json.
COUNTS = ("tokens_seen", "nonfinite_steps", "nonfinite_consecutive")
# rng.json, the largest, is ~10 kB: a bound far above it keeps a huge file from being read whole.
JSON_LIMIT = 16 << 20
RANK_STATE_LIMIT = 2 << 30  # a pipelined RL run's samples ahead: k steps of completions and log-probs
WHAT_TO_DO = "resume from another checkpoint (run.resume=<its path>), or remove this one"


class CheckpointError(ValueError):
    """A checkpoint cannot be resumed from: a file of it is damaged, or its recorded state contradicts its folder."""


def folder_step(checkpoint: Path) -> int | None:
    """The step a checkpoint's folder name says (`step_000010` -> 10), None for another name."""
    match = STEP_FOLDER.fullmatch(Path(checkpoint).name)
    return int(match.group(1)) if match else None


def damaged(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"{path}: damaged checkpoint file ({why}); {WHAT_TO_DO}")


def cause(error: BaseException) -> str:
    """What went wrong, in a few words: the error's type and first sentence. For a file torch's weights-only loader
    refused, only what it found (its message goes on to advise `weights_only=False`)."""
    text = str(error)
    if "weights_only" in text:
        found = text.partition("WeightsUnpickler error:")[2].strip().split(". ")[0].splitlines()
        return "not a file of tensors and plain values only, and nothing else is ever loaded" + (
            f": {found[0][:160]}" if found and "weights_only" not in found[0] else "")
    first = text.strip().split(". ")[0].splitlines()
    return f"{type(error).__name__}: {first[0][:160]}" if first else type(error).__name__


def _nonempty(path: Path) -> None:
    """`path` is a regular file (symlinks followed) and not empty, else a CheckpointError saying what it is."""
    try:
        size = check_regular(path)
    except FileNotFoundError as error:
        raise CheckpointError(f"{path}: missing from its checkpoint; {WHAT_TO_DO}") from error
    except InputFileError as error:
        raise CheckpointError(f"{path}: {error}; {WHAT_TO_DO}") from error
    except OSError as error:
        raise CheckpointError(f"{path}: cannot be read ({error.strerror or error}); {WHAT_TO_DO}") from error
    if size == 0:
        raise damaged(path, "an empty file")


def load_torch_state(path: Path, **options):
    """A torch state file of a checkpoint (`weights_only=True`; `options` such as `mmap`, `map_location` passed
    on); a damaged or hostile file is a CheckpointError naming it."""
    _nonempty(path)
    try:
        return torch.load(path, weights_only=True, **options)
    # torch parses untrusted bytes here and raises whatever its code path hits (EOFError, UnpicklingError,
    # RuntimeError from the zip reader, IndexError, KeyError...): each means the file cannot be used.
    except Exception as error:  # noqa: BLE001 (re-raised, naming the file)
        raise damaged(path, cause(error)) from error


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file of a checkpoint; a damaged one is a CheckpointError naming it."""
    _nonempty(path)
    try:
        return load_file(path)
    except Exception as error:  # noqa: BLE001 (the Rust parser's SafetensorError, or an OSError; re-raised)
        raise damaged(path, cause(error)) from error


def load_json(path: Path, limit: int = JSON_LIMIT) -> dict:
    """A JSON object of a checkpoint, of at most `limit` bytes; anything else is a CheckpointError naming the file."""
    _nonempty(path)
    try:
        value = json.loads(read_bounded(path, limit, "checkpoint JSON file").decode("utf-8"))
    except InputFileError as error:
        raise CheckpointError(f"{path}: {error}; {WHAT_TO_DO}") from error
    except (ValueError, RecursionError, OSError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise damaged(path, cause(error)) from error
    if not isinstance(value, dict):
        raise damaged(path, f"a JSON {type(value).__name__}, not an object")
    return value


def load_counts(path: Path) -> dict:
    """A JSON object whose counters (COUNTS, and `step`), where present, are integers >= 0."""
    state = load_json(path)
    for key in ("step", *COUNTS):
        value = state.get(key, 0)
        if type(value) is not int or value < 0:  # (not bool, an int subclass)
            raise damaged(path, f"{key} {_quoted(value)} is not a count, an integer >= 0")
    return state


def read_trainer_state(checkpoint: Path) -> dict:
    """The checkpoint's step and counters, checked: the step is recorded, a count, and the folder name's."""
    path = Path(checkpoint) / TRAINER_STATE
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint} is not a complete oxRL checkpoint (no {TRAINER_STATE})")
    state = load_counts(path)
    if "step" not in state:
        raise damaged(path, "no step recorded")
    named = folder_step(checkpoint)
    if named is not None and named != state["step"]:
        raise CheckpointError(f"{path}: records step {state['step']} but its folder is {Path(checkpoint).name} "
                              f"(step {named}): the checkpoint was altered or mixed with another; {WHAT_TO_DO}")
    return state


def _quoted(value) -> str:
    shown = json.dumps(value)
    return shown if len(shown) <= 40 else shown[:40] + "..."
