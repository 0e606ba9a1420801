"""User rewards by path, weighted combinations, and failures that are loud (raise) or counted (zero)."""

from __future__ import annotations

import logging
import math

import pytest

from oxrl.rewards import RewardError, RewardLoadError, RewardSpec, batched, build_reward_fn, load_reward_fn


def exact(prompt: str, completion: str, answer: str) -> float:
    """Names only `answer`: other row fields must not be passed to it."""
    return float(completion.strip() == answer)


def length_bonus(prompt: str, completion: str, **fields) -> float:
    return min(len(completion), 10) / 10


def divide(prompt: str, completion: str, answer: str) -> float:
    return 1 / int(answer)  # ZeroDivisionError when answer is "0"


@batched
def batched_divide(prompts: list[str], completions: list[str], answer: list[str]) -> list[float]:
    return [1 / int(a) for a in answer]


def returns_none(prompt: str, completion: str) -> float:
    return None  # type: ignore[return-value]


def returns_nan(prompt: str, completion: str) -> float:
    return math.nan


def scaled(prompt: str, completion: str, *, scale: float = 1.0) -> float:
    return scale


NOT_CALLABLE = 3


def test_weighted_sum_components_and_metrics():
    reward_fn = build_reward_fn([
        RewardSpec("tests.unit.test_rewards_combine:exact"),
        {"name": "tests.unit.test_rewards_combine.length_bonus", "weight": 0.5, "label": "length"},
    ])
    out = reward_fn(["p", "p"], ["19", "a long wrong answer"], [{"answer": "19", "id": 1}, {"answer": "19", "id": 2}])
    assert out.components == {"exact": [1.0, 0.0], "length": [0.2, 1.0]}
    assert out.totals == pytest.approx([1.1, 0.5])
    metrics = out.metrics()
    assert metrics["reward/total"] == pytest.approx(0.8)
    assert metrics["reward/exact"] == 0.5 and metrics["reward/exact/failures"] == 0.0


def test_spec_kwargs_are_passed_and_checked():
    out = build_reward_fn([RewardSpec("tests.unit.test_rewards_combine:scaled", kwargs={"scale": 2.0})])(["p"], ["c"])
    assert out.totals == [2.0]
    with pytest.raises(RewardLoadError, match="takes no argument"):
        build_reward_fn([RewardSpec("tests.unit.test_rewards_combine:scaled", kwargs={"scael": 2.0})])
    with pytest.raises(RewardLoadError, match="both row fields and kwargs"):
        build_reward_fn([RewardSpec("tests.unit.test_rewards_combine:scaled", kwargs={"scale": 2.0})])(["p"], ["c"], [{"scale": 1}])


def test_load_from_file(tmp_path):
    file = tmp_path / "my_rewards.py"
    file.write_text("def shout(prompt, completion, **fields):\n    return float(completion.isupper())\n")
    assert load_reward_fn(f"{file}:shout")("p", "HEY") == 1.0
    out = build_reward_fn([f"{file}:shout"])(["p"], ["quiet"])
    assert out.components == {"shout": [0.0]}


@pytest.mark.parametrize(
    "reference, message",
    [
        ("missing/rewards.py:fn", "not found"),
        ("tests.unit.test_rewards_combine:nope", "has no attribute 'nope'"),
        ("tests.unit.test_rewards_combine:NOT_CALLABLE", "not a function"),
        ("no_such_package_xyz.rewards:fn", "no module named"),
        ("rewards.py", "name the function"),
    ],
)
def test_load_errors_are_clear(reference, message):
    with pytest.raises(RewardLoadError, match=message):
        load_reward_fn(reference)


def test_unknown_builtin_lists_the_valid_names():
    with pytest.raises(RewardLoadError, match="built-ins are .*'math'"):
        build_reward_fn(["maht"])
    with pytest.raises(ValueError, match="distinct `label`"):
        build_reward_fn(["math", "math"])


def test_a_raising_reward_stops_the_run_and_shows_the_sample():
    reward_fn = build_reward_fn(["tests.unit.test_rewards_combine:divide"])
    with pytest.raises(RewardError) as caught:
        reward_fn(["What is 1/0?", "ok"], ["infinity", "1"], [{"answer": "0"}, {"answer": "1"}], ["data/x.jsonl row 12", "row 13"])
    message = str(caught.value)
    assert "reward 'divide'" in message and "ZeroDivisionError" in message
    assert "sample 1 of 2 (data/x.jsonl row 12)" in message
    assert "What is 1/0?" in message and "infinity" in message and "answer='0'" in message


def test_a_raising_rewards_advice_names_the_setting_a_config_can_set():
    import re

    from oxrl.config.load import load_config

    with pytest.raises(RewardError) as caught:
        build_reward_fn(["tests.unit.test_rewards_combine:divide"])(["p"], ["c"], [{"answer": "0"}])
    [(section, key, value)] = re.findall(r"with `(\w+)\.(\w+): (\w+)` such samples score 0", str(caught.value))
    # The advice is followed as written: the key it names loads, and with that value.
    tree = {"model": {"name_or_path": "m"}, "algorithm": {"name": "grpo"}, section: {key: value}}
    assert getattr(getattr(load_config(None, base=tree), section), key) == value == "zero"


def test_on_error_zero_scores_zero_counts_and_logs(caplog):
    reward_fn = build_reward_fn([RewardSpec("tests.unit.test_rewards_combine:divide", on_error="zero")])
    with caplog.at_level(logging.WARNING):
        out = reward_fn(["p"] * 3, ["c"] * 3, [{"answer": "0"}, {"answer": "2"}, {"answer": "0"}])
    assert out.components["divide"] == [0.0, 0.5, 0.0]
    assert out.failures == {"divide": 2} and out.metrics()["reward/divide/failures"] == 2.0
    assert "2 of 3 samples scored 0" in caplog.text and "ZeroDivisionError" in caplog.text


@pytest.mark.parametrize("name", ["divide", "batched_divide"])
def test_a_reward_failing_on_every_sample_stops_the_run_even_under_on_error_zero(name, caplog):
    from oxrl.rewards.failures import EveryCallFailedError

    reward_fn = build_reward_fn([RewardSpec(f"tests.unit.test_rewards_combine:{name}", on_error="zero")])
    with pytest.raises(EveryCallFailedError) as caught:
        reward_fn(["p"] * 3, ["c"] * 3, [{"answer": "0"}] * 3)
    message = str(caught.value)
    assert message.startswith(f"reward '{name}' failed on every sample of this batch (3 of 3 calls failed)")
    assert "the checkpoints written so far are intact" in message
    assert f"The first failure: reward '{name}' failed on sample 1 of 3: ZeroDivisionError" in message
    assert "scored 0" not in caplog.text  # stopped, not counted
    # One sample that scores is enough to go on, counted as before.
    assert reward_fn(["p"] * 3, ["c"] * 3, [{"answer": "0"}, {"answer": "0"}, {"answer": "4"}]).failures == {name: 2}


def test_batched_reward_failures_are_located_per_sample():
    rows = [{"answer": "1"}, {"answer": "0"}, {"answer": "4"}]
    out = build_reward_fn([RewardSpec("tests.unit.test_rewards_combine:batched_divide", on_error="zero")])(["p"] * 3, ["c"] * 3, rows)
    assert out.components["batched_divide"] == [1.0, 0.0, 0.25] and out.failures["batched_divide"] == 1
    with pytest.raises(RewardError, match="sample 2 of 3"):
        build_reward_fn(["tests.unit.test_rewards_combine:batched_divide"])(["p"] * 3, ["c"] * 3, rows)


@pytest.mark.parametrize("name", ["returns_none", "returns_nan"])
def test_invalid_return_values_are_errors(name):
    with pytest.raises(RewardError, match="must return a"):
        build_reward_fn([f"tests.unit.test_rewards_combine:{name}"])(["p"], ["c"])


def test_missing_field_names_the_field():
    with pytest.raises(RewardError, match="answer"):
        build_reward_fn(["math"])(["p"], ["\\boxed{1}"], [{"solution": "1"}])
