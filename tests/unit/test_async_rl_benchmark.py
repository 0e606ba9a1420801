"""benchmarks/async_rl.py's wall-clock model of a trainer and a rollout worker on a device each, against values
worked out by hand."""

import json
import sys

import pytest

from benchmarks.async_rl import Curve, curve_of, finished, main, pipelined_minutes


def halves(generate: list[float], train: list[float]) -> list[dict]:
    return [{"time/generate": g, "time/train": u} for g, u in zip(generate, train)]


def seconds(rows: list[dict], k: int) -> list[float]:
    return [round(60 * minutes, 9) for minutes in pipelined_minutes(rows, k)]


def test_the_synchronous_loop_takes_both_halves_in_turn():
    assert seconds(halves([2, 2, 2], [3, 3, 3]), k=0) == [5, 10, 15]


def test_one_step_ahead_the_slower_half_sets_the_pace():
    # update-bound: step 2 is sampled (from version 0) during update 1, step 3 (version 1) during update 2
    assert seconds(halves([2, 2, 2], [3, 3, 3]), k=1) == [5, 8, 11]
    # sampling-bound: the trainer waits for each step's samples; the worker never waits for weights
    assert seconds(halves([4, 4, 4], [1, 1, 1]), k=1) == [5, 9, 13]


def test_two_steps_ahead_one_worker_hides_no_more_than_one_step_ahead_when_sampling_is_faster():
    rows = halves([2, 2, 2, 2], [3, 3, 3, 3])
    assert seconds(rows, k=2) == seconds(rows, k=1) == [5, 8, 11, 14]


def test_a_long_sampling_step_delays_only_what_depends_on_it():
    # step 2's sampling takes 10 s: at k = 1 it starts once step 1's sampling ends (t = 2) and ends at 12
    assert seconds(halves([2, 10, 2], [3, 3, 3]), k=1) == [5, 15, 18]


def test_a_curve_is_read_at_the_last_validation_by_then():
    curve = Curve("k = 1, decoupled", 0, [0, 4, 8], [0.0, 1.0, 2.0], [0.25, 0.5, 0.75])
    assert curve.at_minutes(1.9) == (4, 0.5)
    assert curve.at_minutes(2.0) == (8, 0.75)


def test_each_trained_step_is_credited_to_the_version_that_sampled_it(tmp_path):
    # k = 1: steps 1 and 2 are sampled by version 0, step 3 by version 1 (lags 0, 1, 1)
    rows = [{"step": 0, "val/accuracy": 0.25}]
    rows += [{"step": s, "reward/mean": r, "time/generate": 2, "time/train": 3, "off_policy/version_lag": lag}
             for s, r, lag in ((1, 0.2, 0.0), (2, 0.4, 1.0), (3, 0.9, 1.0))]
    rows[1]["entropy"], rows[3]["entropy"] = 0.8, 0.3  # (step 2 logged none)
    rows[-1]["val/accuracy"] = 0.5
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    curve = curve_of(tmp_path, "k = 1, decoupled", 0, k=1)
    assert curve.sampled_by == [0, 0, 1] and curve.reward == [0.2, 0.4, 0.9] and curve.entropy == [0.8, None, 0.3]
    assert curve.steps == [0, 3] and curve.accuracy == [0.25, 0.5] and curve.minutes == [0.0, 11 / 60]
    assert round(curve.reward_by_version(0, 0), 9) == 0.3 and curve.reward_by_version(1, 3) == 0.9
    assert curve.reward_by_version(2, 3) is None
    assert curve.entropy_over(1, 2) == [0.8] and curve.entropy_over(2, 3) == [0.3] and curve.entropy_over(4, 9) == []


def test_an_interruptible_run_is_timed_by_its_own_steps_and_keeps_its_fresher_tokens(tmp_path):
    # under Ray on the layout the other runs' minutes are modelled for: its own steps' minutes, validation not counted
    rows = [{"step": 0, "val/accuracy": 0.25}]
    rows += [{"step": s, "reward/mean": 0.5, "time/generate": 9, "time/train": 9, "time/step": t,
              "off_policy/version_lag": 1.0, "off_policy/fresher_tokens": f, "off_policy/token_version_lag": 1 - f}
             for s, t, f in ((1, 30, 0.0), (2, 6, 0.75), (3, 24, 0.5))]
    rows[-1]["val/accuracy"] = 0.5
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    curve = curve_of(tmp_path, "k = 1, decoupled, interruptible", 0, k=1, measured=True)
    assert curve.minutes == [0.0, 1.0]  # (30 + 6 + 24) s, not the halves' model
    assert curve.fresher == [0.0, 0.75, 0.5] and curve.token_lag == [1.0, 0.25, 0.5]
    # modelled from its halves instead: 9 s of sampling, then each 9 s update with the next step's sampling hidden
    assert curve_of(tmp_path, "k = 1, decoupled", 0, k=1).minutes == pytest.approx([0.0, 36 / 60])


def test_a_finished_run_of_the_same_config_is_read_again_and_one_of_another_is_refused(tmp_path):
    assert not finished(tmp_path, "seed0_k1_tis", "a: 1\n")  # never run
    (tmp_path / "seed0_k1_tis.yaml").write_text("a: 1\n")
    (tmp_path / "seed0_k1_tis").mkdir()
    assert not finished(tmp_path, "seed0_k1_tis", "a: 1\n")  # started, never finished (killed): run again
    (tmp_path / "seed0_k1_tis" / "summary.json").write_text("{}")
    assert finished(tmp_path, "seed0_k1_tis", "a: 1\n")
    with pytest.raises(SystemExit, match="seed0_k1_tis holds a finished run of another config"):
        finished(tmp_path, "seed0_k1_tis", "a: 2\n")


def test_the_time_to_an_accuracy_is_that_of_the_first_validation_reaching_it():
    curve = Curve("k = 0", 0, [0, 8, 16, 24], [0.0, 3.0, 6.5, 9.0], [0.25, 0.6, 0.55, 0.7])
    assert curve.minutes_to(0.6) == 3.0  # reached at step 8; the dip at 16 does not undo it
    assert curve.minutes_to(0.65) == 9.0
    assert curve.minutes_to(0.71) is None


def test_curves_refuses_a_launch_that_runs_no_setting(monkeypatch, capsys):
    """`--launch interruptible` skips k = 0 (nothing is in flight at its syncs): with only k = 0 nothing would run,
    and the tables would fail on no runs; refused before anything starts."""
    monkeypatch.setattr(sys, "argv", ["async_rl.py", "curves", "--k", "0", "--launch", "interruptible"])
    with pytest.raises(SystemExit):
        main()
    assert "--launch interruptible runs only k >= 1 settings" in capsys.readouterr().err
