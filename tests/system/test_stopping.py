"""Stopping a run: SIGTERM (a scheduler's preemption) or Ctrl-C finishes the step, writes a checkpoint
(`checkpoint.on_signal`), says in one line how to continue and exits 143 or 130; the command it prints resumes
the run, which then repeats the uninterrupted one. A user's own mistake is not presented as a possible bug."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import save_tiny_model, write_chat_rows
from tests.system.test_rl_resume import REWARD_FILE, rows_by_step  # a slow user reward; the metrics rows by step

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
COMPARED = ("reward/mean", "loss", "grad_norm", "lr")


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # runs that agree to float rounding


@pytest.fixture
def grpo_config(tmp_path, smollm2_tokenizer) -> Path:
    """GRPO with no periodic checkpoints: the one a signal leaves is `checkpoint.on_signal`'s."""
    save_tiny_model(tmp_path / "model", smollm2_tokenizer)
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    config = {
        "run": {"output_dir": str(tmp_path / "runs"), "seed": 3, "device": "cpu"},
        "model": {"name_or_path": str(tmp_path / "model")},
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "task_size": 32, "validation_size": 0, "prompts_per_step": 2,
               "rollout": {"n": 4, "max_new_tokens": 8}, "rewards": [{"name": f"{tmp_path / 'reward.py'}:slow_varied"}]},
        "train": {"max_steps": STEPS, "micro_batch_size_per_device": 4,
                  "optim": {"lr": 1e-2, "schedule": "cosine", "warmup_steps": 2, "weight_decay": 0.1}},
        "checkpoint": {"save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    }
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def signal_after_step(command: list[str], metrics: Path, signum: int, step: int = 2) -> subprocess.CompletedProcess:
    """Start `command`, send it `signum` once `metrics` holds `step` rows, and wait for it to end."""
    process = subprocess.Popen(command, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= step):
        assert process.poll() is None, f"the run ended before step {step}:\n{process.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no step {step} after 300 s"
        time.sleep(0.02)
    process.send_signal(signum)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def test_sigterm_checkpoints_says_how_to_continue_and_the_resume_repeats_the_run(grpo_config):
    runs = grpo_config.parent / "runs"
    oxrl = [sys.executable, "-m", "oxrl", "train"]
    full = subprocess.run([*oxrl, str(grpo_config), "run.name=full"], env=environment(), capture_output=True,
                          text=True, timeout=600)
    assert full.returncode == 0, full.stderr[-3000:]

    stopped = signal_after_step([*oxrl, str(grpo_config), "run.name=preempted"], runs / "preempted" / "metrics.jsonl",
                                signal.SIGTERM)
    console = stopped.stdout + stopped.stderr
    assert stopped.returncode == 143, console[-3000:]
    match = re.search(r"stopped by SIGTERM after step (\d+), checkpoint (\S+); continue with: (.+)", console)
    assert match, console[-3000:]
    step, checkpoint, command = int(match[1]), Path(match[2]), match[3]
    assert 2 <= step < STEPS and checkpoint == runs / "preempted" / "checkpoints" / f"step_{step:06d}"
    assert (checkpoint / "training_state" / "trainer_state.json").is_file()
    assert command == f"oxrl train {grpo_config} run.name=preempted run.resume=true"
    assert "Traceback" not in console and "bug report" not in console
    assert f"stopped by SIGTERM after step {step}" in (runs / "preempted" / "failure.txt").read_text()

    resumed = subprocess.run([sys.executable, "-m", "oxrl", *shlex.split(command)[1:]], env=environment(),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {checkpoint}" in resumed.stderr
    assert not (runs / "preempted" / "failure.txt").exists()
    want, got = rows_by_step(runs / "full"), rows_by_step(runs / "preempted")
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for n in want:
        for key in COMPARED:
            assert got[n][key] == pytest.approx(want[n][key], rel=1e-6, abs=1e-6), (n, key)
    assert len({want[n]["loss"] for n in want}) > 1  # the numbers compared move from step to step


def test_ctrl_c_without_on_signal_stops_after_the_step_with_exit_130(tmp_path, smollm2_tokenizer):
    save_tiny_model(tmp_path / "model", smollm2_tokenizer)
    write_chat_rows(tmp_path / "chat.jsonl", 64)
    config = {"run": {"name": "sft", "output_dir": str(tmp_path / "runs")}, "algorithm": {"name": "sft"},
              "model": {"name_or_path": str(tmp_path / "model")}, "logging": {"progress_bar": False},
              "data": {"train": [{"path": str(tmp_path / "chat.jsonl")}], "max_length": 64},
              "train": {"global_batch_size": 2, "micro_batch_size_per_device": 1, "max_steps": 400},
              "checkpoint": {"on_signal": False}}
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    stopped = signal_after_step([sys.executable, "-m", "oxrl", "train", str(path), "train.optim.lr=1e-4"],
                                tmp_path / "runs" / "sft" / "metrics.jsonl", signal.SIGINT)
    console = stopped.stdout + stopped.stderr
    assert stopped.returncode == 130, console[-3000:]
    assert "KeyboardInterrupt" not in console and "Traceback" not in console
    assert re.search(r"stopped by SIGINT after step \d+; continue with: oxrl train \S+ train.optim.lr=1e-4 "
                     r"run.name=sft run.resume=true", console), console[-3000:]
    assert not (tmp_path / "runs" / "sft" / "checkpoints").exists()  # on_signal: false saves nothing
    assert len(rows_by_step(tmp_path / "runs" / "sft")) < 400


def test_a_users_mistake_is_not_presented_as_a_possible_bug(tmp_path, smollm2_tokenizer):
    save_tiny_model(tmp_path / "model", smollm2_tokenizer)
    (tmp_path / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"not": "a row"}\n')
    config = {"run": {"name": "bad", "output_dir": str(tmp_path / "runs")}, "algorithm": {"name": "sft"},
              "model": {"name_or_path": str(tmp_path / "model")},
              "data": {"train": [{"path": str(tmp_path / "chat.jsonl")}]}, "train": {"max_steps": 1}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, "-m", "oxrl", "train", str(path)], env=environment(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "chat.jsonl" in result.stderr and "bug report" not in result.stderr and "Traceback" not in result.stderr
