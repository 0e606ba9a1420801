"""The steps a pipelined RL run sampled ahead of a checkpoint (oxrl/loops/pipeline.py), as the plain JSON of its
`training_state/rank_state*.json`, and the checks a resume makes of every value of it before training on them.

A resume trains on these samples as they are, so a damaged or altered file would otherwise fail deep in the step
or, worse, train: a token id outside the model's vocabulary is an IndexError in the forward pass, a `token_rewards`
row of the wrong length a shape error in the loss, a reward beyond float32's range an inf in the metrics, a NaN
log-prob poisons the off-policy weights, and prompt ids other than those the step's schedule gives would train the
completions on another prompt. Each is refused in one line that names the file and the field, e.g.
`pipeline.sampled[0].completions[3].logprobs[2]`: all but the prompts when the checkpoint is checked, before the
model loads (`check_samples_ahead`, the token ids against the vocabulary of the checkpoint's config.json), and
everything again, the prompts included, once the run has loaded its model and data, before the first step and before
a rewind deletes the later checkpoints (`read_samples_ahead`; oxrl/training/run_dir.py `drop_abandoned_checkpoints`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn, get_args, get_type_hints

import torch

from oxrl.data.types import RLPromptBatch
from oxrl.loops.rl import Rollout, Sampled
from oxrl.rollout.base import Completion
from oxrl.training.checkpoint_files import RANK_STATE_LIMIT, damaged, load_json

FINISH_REASONS = get_args(get_type_hints(Completion)["finish_reason"])
FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # rewards and log-probs are trained as float32


def sampling_version(step: int, max_staleness: int) -> int:
    """The policy version that samples step `step` (0-based) when steps may lag by `max_staleness` (the schedule of
    oxrl/loops/pipeline.py, which a resume checks the samples ahead against)."""
    return max(0, step - max_staleness)


def sampled_to_json(sampled: Sampled) -> dict:
    rollout = sampled.rollout
    completions = []
    for completion in rollout.completions:
        record = asdict(completion)
        record.pop("vision")  # the prompt's images: taken from the prompts again on load
        completions.append(record)
    return {"step": sampled.step, "version": sampled.version, "metrics": sampled.metrics,
            "rows": rollout.batch.rows, "completions": completions, "rewards": rollout.rewards.tolist(),
            "token_rewards": [row.tolist() for row in rollout.token_rewards]}


class _Reader:
    """Checks of the values of one file; each failure a CheckpointError naming the file and the field."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, field: str, problem: str) -> NoReturn:
        raise damaged(self.path, f"{field} {problem}")

    def get(self, record: Any, key: str, field: str) -> Any:
        if not isinstance(record, dict):
            self.fail(field, f"is {_shown(record)}, not a JSON object")
        if key not in record:
            self.fail(field, f"has no {key!r}")
        return record[key]

    def integer(self, value: Any, field: str, low: int = 0, high: int | None = None) -> int:
        if type(value) is not int or value < low or (high is not None and value >= high):  # (not bool)
            bound = f"{low}..{high - 1}" if high is not None else f">= {low}"
            self.fail(field, f"is {_shown(value)}, not an integer {bound}")
        return value

    def integers(self, values: Any, field: str, low: int = 0, high: int | None = None) -> list[int]:
        return [self.integer(value, f"{field}[{i}]", low, high) for i, value in enumerate(self.list(values, field))]

    def floats(self, values: Any, field: str) -> list[float]:
        """Finite numbers within float32's range (1e308 is finite in JSON but inf once trained)."""
        numbers = self.list(values, field)
        for i, value in enumerate(numbers):
            if type(value) not in (int, float) or not math.isfinite(value) or abs(value) > FLOAT32_MAX:
                self.fail(f"{field}[{i}]", f"is {_shown(value)}, not a finite float32 number")
        return numbers

    def list(self, value: Any, field: str, length: int | None = None) -> list:
        if not isinstance(value, list):
            self.fail(field, f"is {_shown(value)}, not a list")
        if length is not None and len(value) != length:
            self.fail(field, f"holds {len(value)} values, not {length}")
        return value


def check_samples_ahead(path: Path, resumed_step: int) -> None:
    """The checks of a rank_state file that need no run (all but the prompts; the token ids against the vocabulary of
    the checkpoint's saved config.json): made of a checkpoint of step `resumed_step` before a resume loads anything
    (oxrl/training/checkpoint.py `check_intact`), so that a damaged file is refused before the model loads."""
    state = load_json(path, RANK_STATE_LIMIT).get("pipeline")
    if state is None:  # not a pipelined run's (a run with rl.max_staleness >= 1 says so when it resumes)
        return
    staleness = state.get("max_staleness") if isinstance(state, dict) else None
    if type(staleness) is not int or staleness < 1:
        raise damaged(path, f"pipeline.max_staleness is {_shown(staleness)}, not an integer >= 1")
    read_samples_ahead(state, path, resumed_step, staleness, vocab_size=saved_vocab_size(path.parent.parent))


def saved_vocab_size(checkpoint: Path) -> int | None:
    """The vocabulary size in `checkpoint`'s config.json (its `text_config`'s, a vision-language model's), read as
    JSON: no model, nor transformers, loads. None where it holds none (an adapter-only checkpoint): the run checks the
    ids against the loaded model then (`RolloutPipeline.load_state_dict`), before a rewind deletes anything."""
    path = checkpoint / "config.json"
    if not path.is_file():
        return None
    config = load_json(path)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    size = text.get("vocab_size")
    return size if type(size) is int and size > 0 else None


def read_samples_ahead(state: Any, path: Path, resumed_step: int, max_staleness: int,
                       prompts_of: Callable[[int], RLPromptBatch] | None = None,
                       vocab_size: int | None = None) -> tuple[int, dict[int, Sampled]]:
    """The first step not yet sampled, and the steps sampled ahead of step `resumed_step`, from `state` (the
    `pipeline` of the rank_state file `path`), every value checked: with `prompts_of` and `vocab_size`, against the
    run's prompts and the model's token ids too."""
    read = _Reader(path)
    if not isinstance(state, dict) or not {"next_step", "sampled"} <= state.keys():
        read.fail("pipeline", f"is {_shown(state)}, not an object of max_staleness, next_step and sampled")
    next_step = state["next_step"]
    if type(next_step) is not int or not resumed_step <= next_step <= resumed_step + max_staleness:
        read.fail("pipeline.next_step", f"is {_shown(next_step)}, not a step from {resumed_step} to "
                  f"{resumed_step + max_staleness} (the checkpoint's step + rl.max_staleness)")
    steps = range(resumed_step, next_step)  # the steps sampled ahead: started, not yet trained on
    records = read.list(state["sampled"], "pipeline.sampled")
    if len(records) != len(steps):
        read.fail("pipeline.sampled", f"holds {len(records)} steps, not the {len(steps)} sampled ahead of step "
                  f"{resumed_step}")
    loaded = [_sampled(read, record, i, steps, max_staleness, prompts_of, vocab_size)
              for i, record in enumerate(records)]
    if sorted(s.step for s in loaded) != list(steps):
        read.fail("pipeline.sampled", f"holds steps {sorted(s.step + 1 for s in loaded)}, not "
                  f"{[step + 1 for step in steps]}")
    return next_step, {s.step: s for s in loaded}


def _sampled(read: _Reader, record: Any, index: int, steps: range, max_staleness: int,
             prompts_of: Callable[[int], RLPromptBatch] | None, vocab_size: int | None) -> Sampled:
    """`sampled[index]`: its step one of `steps` and sampled by the version the schedule names, its prompts the
    step's (`prompts_of`), every token id below `vocab_size`, every number finite, every row as long as its
    completion."""
    at = f"pipeline.sampled[{index}]"
    step = read.integer(read.get(record, "step", at), f"{at}.step")
    if step not in steps:
        read.fail(f"{at}.step", f"is {step + 1} (1-based), not one of the steps sampled ahead of this checkpoint, "
                  f"{steps.start + 1}..{steps.stop}")
    version, scheduled = read.get(record, "version", at), sampling_version(step, max_staleness)
    if version != scheduled:
        read.fail(f"{at}.version", f"is {_shown(version)}, not {scheduled}, the version the schedule samples "
                  f"step {step + 1} with")
    metrics = read.get(record, "metrics", at)
    if not isinstance(metrics, dict) or not all(type(v) in (int, float) for v in metrics.values()):
        read.fail(f"{at}.metrics", f"is {_shown(metrics)}, not an object of numbers")
    batch = _prompts(read, record, at, None if prompts_of is None else prompts_of(step))
    completions = [_completion(read, fields, f"{at}.completions[{j}]", batch, vocab_size)
                   for j, fields in enumerate(read.list(read.get(record, "completions", at), f"{at}.completions"))]
    for j, c in enumerate(completions):  # interruptible generation: fresher than the schedule, never past the step
        if c.newer_by and not all(0 <= newer <= step - version for newer in c.newer_by):
            read.fail(f"{at}.completions[{j}].newer_by", f"are {_shown(c.newer_by)}, not numbers of updates from 0 to "
                      f"{step - version} (from the step's scheduled version {version} to {step}, which trains on it)")
    rewards = read.floats(read.list(read.get(record, "rewards", at), f"{at}.rewards", len(completions)), f"{at}.rewards")
    rows = read.list(read.get(record, "token_rewards", at), f"{at}.token_rewards", len(completions))
    token_rewards = [torch.tensor(read.floats(read.list(row, f"{at}.token_rewards[{j}]", c.num_sampled),
                                              f"{at}.token_rewards[{j}]"), dtype=torch.float32)
                     for j, (row, c) in enumerate(zip(rows, completions))]
    rollout = Rollout(completions, torch.tensor(rewards, dtype=torch.float32), token_rewards,
                      torch.tensor([c.prompt_index for c in completions], dtype=torch.long), batch=batch, version=version)
    return Sampled(step, version, rollout, {key: float(value) for key, value in metrics.items()})


def _prompts(read: _Reader, record: dict, at: str, batch: RLPromptBatch | None) -> RLPromptBatch | None:
    """The step's prompts this rank's samples answer: all of them, or (a shared rollout's share) those `rows` names.
    Without the step's prompts (`batch` None), only that `rows` are distinct row numbers."""
    rows = read.get(record, "rows", at)
    if batch is not None and rows == batch.rows:
        return batch
    position = {row: i for i, row in enumerate(batch.rows)} if batch is not None else None
    seen = set()
    for i, row in enumerate(read.list(rows, f"{at}.rows")):
        if type(row) is not int or row < 0 or row in seen or (position is not None and row not in position):
            prompts = f" {batch.rows}" if batch is not None else ""
            read.fail(f"{at}.rows[{i}]", f"is {_shown(row)}, not one of the step's prompts{prompts} (each once)")
        seen.add(row)
    return batch.subset([position[row] for row in rows]) if batch is not None else None


def _completion(read: _Reader, fields: Any, at: str, batch: RLPromptBatch | None, vocab_size: int | None) -> Completion:
    prompts = len(batch.prompt_ids) if batch is not None else None
    prompt = read.integer(read.get(fields, "prompt_index", at), f"{at}.prompt_index", 0, prompts)
    read.integers(read.get(fields, "prompt_ids", at), f"{at}.prompt_ids", 0, vocab_size)
    if batch is not None and fields["prompt_ids"] != batch.prompt_ids[prompt]:
        read.fail(f"{at}.prompt_ids", f"are not the ids of prompt {prompt} of the step's prompts (the schedule gives "
                  "each step its prompts: a resume never trains completions on other prompts)")
    read.integers(read.get(fields, "completion_ids", at), f"{at}.completion_ids", 0, vocab_size)
    read.floats(read.get(fields, "logprobs", at), f"{at}.logprobs")
    if read.get(fields, "finish_reason", at) not in FINISH_REASONS:
        read.fail(f"{at}.finish_reason", f"is {_shown(fields['finish_reason'])}, not one of {list(FINISH_REASONS)}")
    if not isinstance(read.get(fields, "text", at), str):
        read.fail(f"{at}.text", f"is {_shown(fields['text'])}, not a string")
    mask = fields.get("loss_mask")
    if mask is not None and not (isinstance(mask, list) and all(type(m) is bool for m in mask)):
        read.fail(f"{at}.loss_mask", f"is {_shown(mask)}, not a list of true/false")
    read.integers(fields.get("context_starts", []), f"{at}.context_starts", 1)
    if fields.get("newer_by") is not None:  # (`ray.interruptible`; their range is checked by `_sampled`)
        read.integers(fields["newer_by"], f"{at}.newer_by")
    if fields.get("context_vision"):  # images are never written to this file (they are the prompts')
        read.fail(f"{at}.context_vision", "holds values; oxRL writes none here")
    if set(fields) - {"prompt_index", "prompt_ids", "completion_ids", "logprobs", "finish_reason", "text", "loss_mask",
                      "context_starts", "context_vision", "newer_by"}:
        read.fail(at, f"has fields oxRL does not write: {sorted(set(fields))}")
    try:
        completion = Completion(**{key: value for key, value in fields.items() if key != "context_vision"})
    except ValueError as error:  # its own checks: log-probs per sampled token, mask length, context starts
        read.fail(at, f"is inconsistent: {error}")
    completion.vision = None if batch is None or batch.vision is None else batch.vision[prompt]
    return completion


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."
