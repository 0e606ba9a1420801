"""What a reward function is, and how a user's reward is found.

A reward scores one completion:

    def my_reward(prompt: str, completion: str, **fields) -> float

`fields` are the prompt row's extra columns (`answer`, `tests`, ...). A reward only receives the
fields it names (plus all of them if it takes `**fields`), so `def exact(prompt, completion, answer)`
works on any dataset that has an `answer` column. A reward whose work is cheaper in bulk (one
sandbox pool for many programs, one model call for many completions) is marked `@batched` and is
called once per batch with lists:

    @batched
    def my_batched_reward(prompts: list[str], completions: list[str], **fields: list) -> list[float]

A reward may also credit single tokens (a per-token or process reward): it takes the `completion_ids`
keyword (the sampled token ids, which the RL loop passes like a row field) and returns one float per
id instead of one float. The loop adds those to the tokens' rewards (an outcome reward sits on the
last token); GAE credits each token by what follows it, and the group estimators (GRPO, RLOO, ...) use
the completion's summed reward:

    def step_penalty(prompt: str, completion: str, completion_ids: list[int]) -> list[float]
        return [-0.01 if token == NEWLINE else 0.0 for token in completion_ids]

A reward is named in a config by a built-in name (`math`), a dotted path
(`my_pkg.rewards:exact` or `my_pkg.rewards.exact`) or a file path (`rewards/exact.py:exact`).

Every reward, built-in or not, runs under a time limit (`rl.reward_timeout_s`, see `call_with_timeout`):
each call runs in a worker thread, so signal-based timeouts inside it (math-verify's defaults use
`signal.alarm`) do not work there; turn them off (math-verify: `parsing_timeout=None`,
`timeout_seconds=None`) and let the time limit bound the call. The one exception is a reward marked
`@signal_timed` (the built-in `math`) called from the main thread: it runs there, under its own alarms,
which cut a pathological expression after seconds and score it 0 instead of stopping the run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from oxrl.errors import UserError
from oxrl.user_code import load_function

RewardFn = Callable[..., Any]  # per sample -> float (or one float per token); @batched -> a list of those
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

BATCHED_ATTRIBUTE = "__oxrl_batched__"
SIGNAL_TIMED_ATTRIBUTE = "__oxrl_signal_timed__"


def batched(fn: F) -> F:
    """Mark a reward as taking lists (`prompts`, `completions`, each field a list) and returning a list of floats."""
    setattr(fn, BATCHED_ATTRIBUTE, True)
    return fn


def is_batched(fn: RewardFn) -> bool:
    return bool(getattr(fn, BATCHED_ATTRIBUTE, False))


def signal_timed(fn: F) -> F:
    """Mark a reward that bounds its own time with `signal.alarm`, which works only in the main thread: called
    from the main thread it runs there, not in a worker thread under the time limit (see `time_limit`)."""
    setattr(fn, SIGNAL_TIMED_ATTRIBUTE, True)
    return fn


def time_limit(fn: RewardFn, timeout_s: float | None) -> float | None:
    """The limit to call `fn` under now: None (in this thread) for a `@signal_timed` reward in the main thread,
    whose alarms bound it there; `timeout_s` otherwise."""
    if getattr(fn, SIGNAL_TIMED_ATTRIBUTE, False) and threading.current_thread() is threading.main_thread():
        return None
    return timeout_s


class RewardError(UserError, RuntimeError):
    """A reward failed on a sample; the message names the reward and shows the sample."""


class RewardLoadError(ValueError):
    """A reward named in the config cannot be found or is not a function."""


class RewardTimeoutError(RewardError):
    """A reward call ran past its time limit. It always stops the run (`rl.on_reward_error` does not apply): the
    call cannot be stopped, only abandoned, and it keeps its thread and CPU."""


def call_with_timeout(call: Callable[[], T], timeout_s: float | None, what: str) -> T:
    """`call()`, or `RewardTimeoutError` naming `what` if it has not returned within `timeout_s` seconds (None:
    no limit, called in this thread). `call` takes no arguments (bind them with `functools.partial`), so that no
    argument of a reward can ever collide with this function's own.

    A Python thread cannot be killed, so the call runs in a daemon thread that is abandoned when it
    overruns: the run can stop (the interpreter does not wait for daemon threads at exit) even while
    the call sleeps or loops forever. Whatever the call raises is raised here, in the caller's thread.
    """
    if timeout_s is None:
        return call()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread, raised there
            outcome["error"] = error

    worker = threading.Thread(target=run, name=f"oxrl-reward {what}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise RewardTimeoutError(
            f"{what} did not return within {timeout_s:g} s (rl.reward_timeout_s), so the run stops; the call is "
            "abandoned in a background thread. Make the reward faster (or find why it hangs), or raise rl.reward_timeout_s"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def load_reward_fn(reference: str) -> RewardFn:
    """The reward function that `reference` names (`oxrl.user_code.load_function`); errors are `RewardLoadError`s."""
    return load_function(reference, "reward", RewardLoadError)


