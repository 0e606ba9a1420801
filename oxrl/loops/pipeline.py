"""Pipelined RL (`rl.max_staleness` = k): step t trains on samples of the policy of step max(0, t - k).

    version    the weights after v updates (version 0: the initial weights); step t's update makes version t + 1
    schedule   step t is sampled by version max(0, t - k), fixed by the step number and k, never by timing:
               every sample's version lag, min(t, k), is known before the run starts
    pipeline   at the start of step t the live weights are version t: every step up to t + k not yet sampled
               is started now (the first step starts 0..k). A remote engine (Ray rollout workers) samples
               step t + k while the trainers update step t; the built-in engines sample it here, in turn,
               from the live weights, which are then exactly the scheduled version

k = 0 is the synchronous loop (`InTurn` in oxrl/loops/rl.py, which this schedule equals at k = 0 with the same
random draws); the runner plugs this one in as `RLHandles.ahead` when k >= 1.
The update's ratio starts from the trainer's own policy before the update (pi_old, the proximal policy); the
engine's log-probs are the behaviour policy's, which `rl.off_policy_correction` corrects for
(oxrl/algorithms/policy_loss.py `off_policy_weight`).

Resume: the steps sampled ahead of a checkpoint are part of it (`state_dict`: their completions, rewards and
metrics as JSON, one file per rank), so a resumed run trains on exactly the samples the uninterrupted one did,
and samples the later steps from the same weights with the same random state. Every value of that file is checked
against the resuming run before a step trains (oxrl/loops/pipeline_state.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from oxrl.data.types import RLPromptBatch
from oxrl.loops.pipeline_state import sampling_version
from oxrl.loops.rl import ResumeError, Rollout, Sampled, Sampling, finish_sample, start_sample
from oxrl.models.model_inputs import hf_config
from oxrl.training.checkpoint import rank_state_name


def fresher_tokens(rollout: Rollout, step: int) -> dict[str, float]:
    """Interruptible generation (`Completion.newer_by`, oxrl/cluster/interruptible.py): the share of the step's sampled
    tokens that a newer version than its scheduled one sampled, and the tokens' mean lag behind version `step`, which
    trains on them (the step's `off_policy/version_lag` is its scheduled version's)."""
    newer = [n for c in rollout.completions for n in c.newer_by or ()]
    if not newer:
        return {}
    return {"off_policy/fresher_tokens": sum(n > 0 for n in newer) / len(newer),
            "off_policy/token_version_lag": step - rollout.version - sum(newer) / len(newer)}


class RolloutPipeline:
    """The steps sampled ahead of the update, each by the version the schedule names.

    `begin(step)` starts the step's prompts (a function of the step: `prompts_of`), `finish` turns a started
    step into a `Rollout`; both are the sample stage's (oxrl/loops/rl.py)."""

    def __init__(self, max_staleness: int, total_steps: int, prompts_of: Callable[[int], RLPromptBatch],
                 begin: Callable[[RLPromptBatch, int], Sampling],
                 finish: Callable[[Sampling], tuple[Rollout, dict[str, float]]], vocab_size: int | None = None,
                 rank: int = 0):
        self.k, self.total_steps = max_staleness, total_steps
        # What a resume checks the samples it reads against (`load_state_dict`): the model's token ids, and the file.
        self.vocab_size, self.rank = vocab_size, rank
        self.prompts_of, self.begin, self.finish = prompts_of, begin, finish
        self.started: dict[int, tuple[int, Sampling]] = {}  # step -> (version, its sampling, not yet collected)
        self.sampled: dict[int, Sampled] = {}  # collected, not yet trained on
        self.next_step = 0  # the first step not yet started

    @classmethod
    def of(cls, h, total_steps: int, prompts_of: Callable[[int], RLPromptBatch]) -> RolloutPipeline:
        """The run's pipeline: the RL loop's sample stage, `h.cfg.rl.max_staleness` steps ahead."""
        return cls(h.cfg.rl.max_staleness, total_steps, prompts_of, lambda batch, step: start_sample(h, batch, step + 1),
                   lambda sampling: finish_sample(h, sampling), hf_config(h.model).get_text_config().vocab_size,
                   h.strategy.rank)

    def take(self, step: int) -> Sampled:
        """Step `step`'s samples, once every step up to `step + k` has been started from the live weights,
        which must be version `step` (the loop's `step` updates so far)."""
        for ahead in range(self.next_step, min(step + self.k, self.total_steps - 1) + 1):
            if sampling_version(ahead, self.k) != step:  # the loop takes its steps in order, from 0 or a resume
                raise RuntimeError(f"step {ahead + 1} would be sampled by version {step}, not by the scheduled "
                                   f"version {sampling_version(ahead, self.k)}")
            self.started[ahead] = (step, self.begin(self.prompts_of(ahead), ahead))
            self.next_step = ahead + 1
        self._collect(step)
        return self.sampled.pop(step)

    def settle(self) -> None:
        """Collect every started step (before a checkpoint: what is in flight becomes part of it)."""
        for step in sorted(self.started):
            self._collect(step)

    def _collect(self, step: int) -> None:
        if step in self.started:
            version, sampling = self.started.pop(step)
            rollout, metrics = self.finish(sampling)
            rollout.version = version
            self.sampled[step] = Sampled(step, version, rollout, {**metrics, **fresher_tokens(rollout, step)})

    # ---- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The steps sampled ahead, as plain values (JSON): call `settle` first."""
        from oxrl.loops.pipeline_state import sampled_to_json

        if self.started:
            raise RuntimeError("settle the pipeline before saving it: steps are still being sampled")
        return {"max_staleness": self.k, "next_step": self.next_step,
                "sampled": [sampled_to_json(s) for _, s in sorted(self.sampled.items())]}

    def load_state_dict(self, state: dict | None, resumed_step: int, source: str) -> None:
        """The steps a checkpoint of step `resumed_step` holds sampled ahead; `source` names it in errors."""
        self.next_step = resumed_step
        if self.k == 0 and not state:
            return
        if state is None:
            raise ResumeError(f"{source} holds no samples of the steps after step {resumed_step}: it was written "
                             f"with rl.max_staleness 0, so it cannot resume with rl.max_staleness = {self.k}")
        self._load(state, resumed_step, source)

    def _load(self, state: dict, resumed_step: int, source: str) -> None:
        """Every value checked against the run (oxrl/loops/pipeline_state.py) before any is used: a damaged file is
        a CheckpointError naming it and the field."""
        from oxrl.loops.pipeline_state import read_samples_ahead

        if isinstance(state, dict) and state.get("max_staleness") != self.k:
            raise ResumeError(f"{source} was written with rl.max_staleness = {state.get('max_staleness')}: resume with "
                              f"that value, not {self.k} (its steps sampled ahead follow that schedule)")
        path = Path(source) / "training_state" / rank_state_name(self.rank)
        self.next_step, self.sampled = read_samples_ahead(state, path, resumed_step, self.k, self.prompts_of,
                                                          self.vocab_size)
