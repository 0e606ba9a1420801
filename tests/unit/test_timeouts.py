"""A user reward that hangs is cut off by `rl.reward_timeout_s` with an error naming it; the run stops.
(Collective timeouts across ranks: tests/system/test_distributed.py, `test_a_lost_rank_...`.)"""

from __future__ import annotations

import threading
import time

import pytest

from oxrl.config.schema import Config
from oxrl.rewards import RewardSpec, batched, build_reward_fn
from oxrl.rewards.base import RewardTimeoutError, time_limit
from oxrl.rewards.math_reward import math_reward

TIMEOUT_S = 0.5


def sleeps_forever(prompt: str, completion: str) -> float:
    threading.Event().wait()  # never set
    return 1.0


@batched
def batch_sleeps_forever(prompts: list[str], completions: list[str]) -> list[float]:
    threading.Event().wait()
    return [1.0] * len(prompts)


def quick(prompt: str, completion: str) -> float:
    return float(len(completion))


def fails(prompt: str, completion: str) -> float:
    if completion == "abc":  # not every sample: a reward failing on all of a batch stops the run
        raise KeyError("no such key")
    return 1.0


def timed_call(reward_fn, n: int = 3):
    started = time.monotonic()
    with pytest.raises(RewardTimeoutError) as caught:
        reward_fn(["p"] * n, ["c"] * n, origins=[f"prompts.jsonl row {i + 1}" for i in range(n)])
    return str(caught.value), time.monotonic() - started


@pytest.mark.parametrize("on_error", ["raise", "zero"])
def test_a_hanging_reward_stops_with_an_error_naming_it_and_the_timeout(on_error):
    reward_fn = build_reward_fn([RewardSpec("tests.unit.test_timeouts:sleeps_forever", timeout_s=TIMEOUT_S, on_error=on_error)])
    message, seconds = timed_call(reward_fn)
    # on_error=zero does not apply: the first hung sample stops the call, it is not scored 0 three times.
    assert seconds < TIMEOUT_S + 1.0
    assert "reward 'sleeps_forever' on sample 1 of 3 (prompts.jsonl row 1)" in message
    assert "0.5 s" in message and "rl.reward_timeout_s" in message


def test_a_hanging_batched_reward_is_not_retried_sample_by_sample():
    reward_fn = build_reward_fn([RewardSpec("tests.unit.test_timeouts:batch_sleeps_forever", timeout_s=TIMEOUT_S)])
    message, seconds = timed_call(reward_fn, n=4)
    assert seconds < TIMEOUT_S + 1.0
    assert "reward 'batch_sleeps_forever' on a batch of 4" in message


def test_rewards_within_the_timeout_score_and_fail_as_before():
    reward_fn = build_reward_fn([
        RewardSpec("tests.unit.test_timeouts:quick", timeout_s=TIMEOUT_S),
        RewardSpec("tests.unit.test_timeouts:fails", timeout_s=TIMEOUT_S, on_error="zero"),
    ])
    out = reward_fn(["p", "p"], ["ab", "abc"])
    assert out.components == {"quick": [2.0, 3.0], "fails": [1.0, 0.0]}
    assert out.failures["fails"] == 1  # the worker thread's KeyError reached on_error, as without a timeout


def test_math_keeps_running_in_the_main_thread_under_its_own_alarms():
    # math-verify's own time limits use signal.alarm, which works only in the main thread: there it cuts a
    # pathological expression after seconds and scores it 0, where a worker thread would hang until the limit.
    reward_fn = build_reward_fn([RewardSpec("math", timeout_s=TIMEOUT_S)])
    assert reward_fn.rewards[0].timeout_s == TIMEOUT_S
    assert time_limit(math_reward, TIMEOUT_S) is None
    assert reward_fn(["What is 12+7?"], ["\\boxed{19}"], [{"answer": "19"}]).totals == [1.0]
    limits = []  # called from any other thread, it is bounded like every reward
    worker = threading.Thread(target=lambda: limits.append(time_limit(math_reward, TIMEOUT_S)))
    worker.start()
    worker.join()
    assert limits == [TIMEOUT_S]


def test_built_in_rewards_are_bounded_by_the_timeout_too():
    reward_fn = build_reward_fn([RewardSpec("format", timeout_s=TIMEOUT_S)])
    assert reward_fn.rewards[0].timeout_s == TIMEOUT_S
    assert time_limit(reward_fn.rewards[0].fn, TIMEOUT_S) == TIMEOUT_S


def test_rl_reward_timeout_s_reaches_the_reward_function():
    from oxrl.loops.rl_setup import reward_function

    cfg = Config.model_validate({
        "model": {"name_or_path": "unused"},
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "reward_timeout_s": TIMEOUT_S, "rewards": [{"name": "tests.unit.test_timeouts:sleeps_forever"}]},
    })
    message, seconds = timed_call(reward_function(cfg, cfg.rl), n=1)
    assert seconds < TIMEOUT_S + 1.0 and "sleeps_forever" in message
