"""Whole `run.launcher: ray` runs of `oxrl train`, attached to a cluster that `ray start --head` runs (as a user
would on a node), with 2 trainer ranks (FSDP2), 2 rollout workers and a reward worker, on the tiny model:
the reward of a learnable task rises, a rerun of the same seed and layout repeats every metric, and a driver
killed with SIGKILL mid-run then resumed repeats the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")

from oxrl.cluster.weight_channel import free_port, node_address  # noqa: E402
from tests.conftest import save_tiny_model  # noqa: E402
from tests.ray_workers import LOWER_HALF_REWARD  # noqa: E402
from tests.system.test_rl_resume import kill_once_checkpointed, rows_by_step  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STEPS = 12
COMPARED = ("reward/mean", "reward/std", "loss", "grad_norm", "response_length/mean", "lr", "weight_sync/probe_gap")


def _env() -> dict[str, str]:
    # Ray >= 2.5x's `ray start` turns on token authentication; a driver naming the address must use it too.
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "token"}


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A Ray cluster started by `ray start --head`; its address."""
    ray_cli = Path(sys.executable).parent / "ray"
    port = free_port()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in _env().items():  # also for the drivers tests/system/test_rl_resume.py starts
            patch.setenv(key, value)
        subprocess.run([str(ray_cli), "start", "--head", f"--port={port}", "--num-cpus=4", "--include-dashboard=false",
                        "--disable-usage-stats"], check=True, capture_output=True, timeout=120)
        yield f"{node_address()}:{port}"  # where the head listens (this node's address, not the loopback)
        subprocess.run([str(ray_cli), "stop", "--force"], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def config(tmp_path_factory, smollm2_tokenizer, head) -> Path:
    tmp = tmp_path_factory.mktemp("ray_runs")
    save_tiny_model(tmp / "model", smollm2_tokenizer)
    (tmp / "reward.py").write_text(LOWER_HALF_REWARD)
    cfg = {
        "run": {"name": "full", "output_dir": str(tmp / "runs"), "seed": 5, "device": "cpu", "launcher": "ray"},
        "model": {"name_or_path": str(tmp / "model")},
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "task_size": 64, "validation_size": 0, "prompts_per_step": 4,
               "rollout": {"n": 4, "max_new_tokens": 8, "temperature": 1.0},
               "rewards": [{"name": f"{tmp / 'reward.py'}:lower_half"}]},
        # fp32: the trainers' and workers' probes then agree to 1e-4 (bf16 compute rounds them differently).
        "train": {"max_steps": STEPS, "micro_batch_size_per_device": 8, "mixed_precision": "no",
                  "optim": {"lr": 2e-1, "schedule": "cosine", "warmup_steps": 1, "weight_decay": 0.1}},
        "ray": {"address": head, "trainers": {"count": 2, "cpus": 1}, "rollout": {"count": 2, "cpus": 0.5},
                "reward": {"count": 1, "cpus": 0.5}},
        "checkpoint": {"every": 2, "keep_last": 5, "save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    }
    path = tmp / "grpo_ray.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(config: Path, *overrides: str) -> Path:
    done = subprocess.run([sys.executable, "-m", "oxrl", "train", str(config), *overrides], env=_env(),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    runs = Path(yaml.safe_load(config.read_text())["run"]["output_dir"])
    name = next((o.split("=", 1)[1] for o in overrides if o.startswith("run.name=")), "full")
    return runs / name


@pytest.fixture(scope="module")
def uninterrupted(config) -> dict[int, dict]:
    return rows_by_step(_train(config))


@pytest.mark.slow
@pytest.mark.distributed
def test_the_reward_of_a_learnable_task_rises_under_ray(uninterrupted):
    rewards = [uninterrupted[step]["reward/mean"] for step in range(1, STEPS + 1)]
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.1, rewards
    assert all(uninterrupted[step]["weight_sync/probe_gap"] < 1e-4 for step in uninterrupted)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_driver_killed_mid_run_then_resumed_repeats_the_uninterrupted_run(config, uninterrupted):
    runs = Path(yaml.safe_load(config.read_text())["run"]["output_dir"])
    kill_once_checkpointed([sys.executable, "-m", "oxrl", "train", str(config), "run.name=killed"],
                           runs / "killed" / "checkpoints" / "step_000004", timeout_s=600)
    before_kill = rows_by_step(runs / "killed")
    # The same seed and layout sample and train alike: the steps before the kill are the uninterrupted run's.
    for step in range(1, 5):
        for key in COMPARED:
            assert before_kill[step][key] == pytest.approx(uninterrupted[step][key], rel=1e-5, abs=1e-6), (step, key)
    resumed = rows_by_step(_train(config, "run.name=killed", "run.resume=true"))
    for step in range(5, STEPS + 1):
        for key in COMPARED:
            assert resumed[step][key] == pytest.approx(uninterrupted[step][key], rel=1e-5, abs=1e-6), (step, key)


# Each step whole to one of the 2 rollout workers (ray.rollout_split: steps), so 2 steps are sampled at once.
PIPELINED = ("rl.max_staleness=1", "rl.off_policy_correction=decoupled", "rl.off_policy_cap=4.0", "ray.rollout_split=steps")


@pytest.fixture(scope="module")
def pipelined(config) -> dict[int, dict]:
    return rows_by_step(_train(config, "run.name=pipelined", *PIPELINED))


def _kill_a_rollout_worker_once_logged(run_dir: Path, step: int):
    """A check for `kill_once_checkpointed`: once `step` is logged, SIGKILL one rollout worker's process (Ray restarts
    it; the step it had in flight is sampled again from that step's version), once."""
    killed = []

    def check() -> None:
        if killed or step not in _logged_steps(run_dir):
            return
        pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()
                and _cmdline(entry).startswith("ray::RolloutWorker")]
        assert pids, "no rollout worker process to kill"
        os.kill(min(pids), signal.SIGKILL)
        killed.append(min(pids))

    check.killed = killed
    return check


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # the process ended meanwhile
        return ""


def _logged_steps(run_dir: Path) -> set[int]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []  # whole lines only: the last may be in writing
    return {json.loads(line)["step"] for line in lines if line.strip()}


@pytest.mark.slow
@pytest.mark.distributed
def test_a_pipelined_ray_run_trains_on_samples_one_version_old_and_resumes_exactly(config, pipelined):
    """rl.max_staleness 1 under Ray, each step whole to one of 2 rollout workers (ray.rollout_split: steps): they
    sample steps t + 1 and t while the trainers update step t; every step after the first lags one version. A
    rollout worker killed mid-run is restarted and the run goes on, then the driver is killed and resumed: the run
    still repeats the uninterrupted one. (Learning
    from stale samples: tests/integration/test_pipelined_rl.py; at this test's learning rate of 0.2 a step moves the
    policy far, mean |log-prob gap| up to 1.4 a token, and k = 1 learns far slower than k = 0.)"""
    assert [pipelined[step]["off_policy/version_lag"] for step in range(1, STEPS + 1)] == [0.0] + [1.0] * (STEPS - 1)
    assert pipelined[1]["logprob_mismatch/mean_abs"] < 1e-4  # step 1 is sampled by the live weights
    assert all(pipelined[step]["logprob_mismatch/mean_abs"] > 1e-3 for step in range(2, STEPS + 1))  # off-policy
    runs = Path(yaml.safe_load(config.read_text())["run"]["output_dir"])
    kill_worker = _kill_a_rollout_worker_once_logged(runs / "pipelined_killed", step=2)
    kill_once_checkpointed([sys.executable, "-m", "oxrl", "train", str(config), "run.name=pipelined_killed", *PIPELINED],
                           runs / "pipelined_killed" / "checkpoints" / "step_000004", timeout_s=600, meanwhile=kill_worker)
    assert kill_worker.killed, "the driver reached step 4's checkpoint before a rollout worker could be killed"
    resumed = rows_by_step(_train(config, "run.name=pipelined_killed", "run.resume=true", *PIPELINED))
    # Every step but the last pushed the weights of the step it started to that step's worker, verified by the probe
    # (the last starts none: its row has no gap).
    assert all(pipelined[step]["weight_sync/probe_gap"] < 1e-4 for step in range(1, STEPS))
    assert "weight_sync/probe_gap" not in pipelined[STEPS]
    for step in range(1, STEPS + 1):
        for key in COMPARED + ("off_policy/version_lag", "logprob_mismatch/mean_abs"):
            if key not in pipelined[step]:
                assert key not in resumed[step], (step, key)
                continue
            assert resumed[step][key] == pytest.approx(pipelined[step][key], rel=1e-5, abs=1e-6), (step, key)


@pytest.mark.slow
@pytest.mark.distributed
def test_trainers_split_by_tensor_parallel_sync_whole_weights_to_the_rollout_workers(config, uninterrupted):
    """The 2 trainer ranks split one model (strategy.mesh.tp=2) instead of sharing the rows: the weights reach the
    rollout workers gathered whole (their probe log-probs equal the trainers'), and the first step, sampled from
    the same weights with the same seed, is the 2-rank FSDP2 run's."""
    rows = rows_by_step(_train(config, "run.name=tp2", "strategy.name=fsdp2", "strategy.mesh.tp=2",
                               "train.max_steps=3"))
    assert sorted(rows) == [1, 2, 3]
    assert all(row["weight_sync/probe_gap"] < 1e-4 for row in rows.values())
    assert rows[1]["reward/mean"] == uninterrupted[1]["reward/mean"]
    assert abs(rows[1]["loss"] - uninterrupted[1]["loss"]) < 1e-5

