"""An RL run killed with SIGKILL mid-run and resumed (`run.resume=true`) repeats the uninterrupted run:
same rewards, losses and gradient norms at every step. That needs the weights, optimizer, schedule,
data position and the sampling RNG (the `hf` engine samples from torch's global RNG) all restored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import make_tiny_critic, make_tiny_llama, rl_handles, save_tiny_model

STEPS = 6
COMPARED = ("reward/mean", "reward/std", "loss", "grad_norm", "response_length/mean", "lr")

# A user reward that takes a moment, so that the run is still going when the test kills it.
REWARD_FILE = '''
import time


def slow_varied(prompt, completion):
    time.sleep(0.05)
    return (len(completion) % 5) / 4  # rewards that differ inside a group, so every update moves the weights
'''


def oxrl_train(config: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "oxrl", "train", str(config), *overrides]


def environment() -> dict[str, str]:
    # The same thread count in every run: the runs must agree to float rounding.
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def rows_by_step(run_dir: Path) -> dict[int, dict]:
    """The metrics rows, the last one of each step winning (a resumed run logs its steps again)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row for row in rows}


def checkpointed_every_2_steps(cfg, resume: str | bool):
    """4 steps, checkpoints every 2; cosine schedule with warmup and weight decay, so that any training state a
    resume does not restore changes the numbers."""
    cfg.train.max_steps = 4
    cfg.train.optim.schedule, cfg.train.optim.warmup_steps, cfg.train.optim.weight_decay = "cosine", 1, 0.1
    cfg.checkpoint.every, cfg.checkpoint.keep_last = 2, 5
    cfg.run.resume = resume
    return cfg


def train_tiny_grpo(tmp_path: Path, run_name: str, resume: str | bool = False, algorithm: str = "grpo"):
    """GRPO (or PPO, whose critic is checkpointed too) on the tiny model and the `share_of_sevens` reward of
    tests/integration/test_rl_loop.py, in this process."""
    import torch

    from oxrl.training.strategy import SingleDevice
    from oxrl.data.types import RLPromptBatch
    from oxrl.loops.rl import train_rl
    from oxrl.rewards.combine import build_reward_fn
    from oxrl.rollout.hf import HFEngine
    from tests.integration.test_rl_loop import prompts, rl_config
    from tests.integration.test_rollout_hf import TinyTokenizer

    cfg = checkpointed_every_2_steps(rl_config(tmp_path, algorithm), resume)
    model = make_tiny_llama(seed=7 if resume else 0)  # a resumed run must take every weight from the checkpoint
    reward = build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}])
    critic = make_tiny_critic(seed=9 if resume else 3) if algorithm == "ppo" else None  # resumed: from the checkpoint
    h = rl_handles(cfg, model, HFEngine(model, TinyTokenizer()), reward, SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0),
                   critic_model=critic)
    result = train_rl(h, prompts(), RLPromptBatch([], [], [], []), tmp_path / run_name)
    return result, rows_by_step(tmp_path / run_name)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_rl_resumed_from_a_checkpoint_repeats_the_uninterrupted_steps(tmp_path, algorithm):
    full, full_rows = train_tiny_grpo(tmp_path, "full", algorithm=algorithm)
    resumed, resumed_rows = train_tiny_grpo(tmp_path, "resumed", str(tmp_path / "full" / "checkpoints" / "step_000002"),
                                            algorithm)
    assert resumed.rewards == pytest.approx(full.rewards[2:], abs=1e-6)
    assert sorted(resumed_rows) == [3, 4]
    critic = ("critic/loss", "critic/grad_norm", "critic/abs_error", "advantage/abs_max") if algorithm == "ppo" else ()
    for step in (3, 4):
        for key in COMPARED + critic:
            assert resumed_rows[step][key] == pytest.approx(full_rows[step][key], rel=1e-6, abs=1e-6), (step, key)


@pytest.fixture
def grpo_config(tmp_path, smollm2_tokenizer) -> Path:
    save_tiny_model(tmp_path / "model", smollm2_tokenizer)
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    config = {
        "run": {"name": "full", "output_dir": str(tmp_path / "runs"), "seed": 3, "device": "cpu"},
        "model": {"name_or_path": str(tmp_path / "model")},
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "task_size": 32, "validation_size": 0, "prompts_per_step": 2,
               "rollout": {"n": 4, "max_new_tokens": 8, "temperature": 1.0},
               "rewards": [{"name": f"{tmp_path / 'reward.py'}:slow_varied"}]},
        # Cosine schedule with warmup and weight decay: any training state not restored changes the numbers.
        "train": {"max_steps": STEPS, "micro_batch_size_per_device": 4,
                  "optim": {"lr": 1e-2, "schedule": "cosine", "warmup_steps": 2, "weight_decay": 0.1}},
        "checkpoint": {"every": 1, "keep_last": 2, "save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    }
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def kill_once_checkpointed(command: list[str], checkpoint: Path, timeout_s: float = 300.0, meanwhile=None) -> None:
    """Start `command` and SIGKILL it as soon as `checkpoint` exists (it must still be running then); `meanwhile()`,
    if given, is called while waiting."""
    process = subprocess.Popen(command, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    try:
        while not checkpoint.is_dir():
            if meanwhile is not None:
                meanwhile()
            if process.poll() is not None:
                pytest.fail(f"the run ended ({process.returncode}) before {checkpoint.name}:\n{process.stderr.read()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {checkpoint.name} after {timeout_s} s")
            time.sleep(0.02)
        assert process.poll() is None, "the run finished before it could be killed mid-run"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.parametrize("pipelined", [(), ("rl.max_staleness=2", "rl.off_policy_correction=decoupled")],
                         ids=["synchronous", "max_staleness_2"])
def test_grpo_killed_mid_run_resumes_exactly_like_the_uninterrupted_run(grpo_config, pipelined):
    """Pipelined (oxrl/loops/pipeline.py): the kill leaves 2 steps sampled ahead, which the checkpoint holds."""
    runs = grpo_config.parent / "runs"
    subprocess.run(oxrl_train(grpo_config, *pipelined), env=environment(), check=True, capture_output=True, timeout=600)
    kill_once_checkpointed(oxrl_train(grpo_config, "run.name=killed", *pipelined),
                           runs / "killed" / "checkpoints" / "step_000002")
    assert len(rows_by_step(runs / "killed")) < STEPS
    done = subprocess.run(oxrl_train(grpo_config, "run.name=killed", "run.resume=true", *pipelined), env=environment(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stderr

    full, resumed = rows_by_step(runs / "full"), rows_by_step(runs / "killed")
    assert sorted(full) == sorted(resumed) == list(range(1, STEPS + 1))
    for step in full:
        for key in COMPARED:
            assert resumed[step][key] == pytest.approx(full[step][key], rel=1e-6, abs=1e-6), (step, key)
    assert len({full[step]["reward/mean"] for step in full}) > 1  # the numbers compared do move from step to step
