"""Samples a reward failed on under `rl.on_reward_error: zero`: logged, and a batch on which every call
failed stops the run.

`zero` is for a reward that fails now and then: a judge server's hiccup, a sample it cannot read. A reward that
failed on every sample of a batch (a training step's rewards are one batch) is broken instead: a judge server that
refuses every request, a wrong key, a file it cannot find. Scoring it 0 would train on nothing while the run ends
"done", so `EveryCallFailedError` stops the run, naming the reward, the number of failures and the first. The
rewards are scored before the step's update, so the checkpoints written so far are intact.

Imported only when a reward failed: a run whose rewards never fail does not read this file.
"""

from __future__ import annotations

import logging

from oxrl.rewards.base import RewardError

logger = logging.getLogger(__name__)


class EveryCallFailedError(RewardError):
    """A reward failed on every sample of a batch under `rl.on_reward_error: zero`: it is broken, not failing now
    and then."""


def report_failures(label: str, failed: list[str], scored: int) -> None:
    """Log the samples reward `label` scored 0 (`failed`: one description each, of `scored` samples), or stop the
    run when that was every one."""
    if len(failed) < scored:
        logger.warning("%d of %d samples scored 0 because reward %r failed; the first:\n%s",
                       len(failed), scored, label, failed[0])
        return
    raise EveryCallFailedError(
        f"reward {label!r} failed on every sample of this batch ({len(failed)} of {scored} calls failed): under "
        "`rl.on_reward_error: zero` each would score 0 and the run would train on nothing, so it stops here, before "
        "this step's update; the checkpoints written so far are intact (resume from the last, run.resume, once the "
        f"reward works). The first failure: {failed[0]}")
