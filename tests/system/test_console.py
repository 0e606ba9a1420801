"""What `oxrl train` shows on the console: a two-line summary of the config (the whole one is in config.yaml),
no other library's notices or progress bars, no warning repeated step after step; and the learning rate each
step logs is the one its update used (RL and online loops as SFT)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from oxrl.cli import main
from oxrl.config.schema import OptimConfig
from oxrl.training.optim import lr_factor
from tests.conftest import save_tiny_model, write_chat_rows

ROOT = Path(__file__).resolve().parents[2]
NOISE = ("Setting accelerator to CPU", "Loading weights", "Generating train split", "Writing model shards",
         "past_key_values", "LOAD REPORT", "\x1b[",
         # oxRL's own choices for this machine: in train.log, not on the console
         "allocator: ", "attention: oxrl_packed_sdpa", "train.mixed_precision=auto")


def odd_length(prompt: str, completion: str) -> float:
    """A reward under which a random model's samples differ, so that Online DPO finds pairs."""
    return float(len(completion) % 2)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", smollm2_tokenizer)


def _configs(tmp_path: Path, model: Path) -> dict[str, dict]:
    optim = {"lr": 1e-3, "schedule": "cosine"}
    rl = {"task": "arithmetic", "task_size": 8, "validation_size": 2, "validation_every": 2, "prompts_per_step": 2,
          "rollout": {"n": 4, "max_new_tokens": 6}}
    write_chat_rows(tmp_path / "chat.jsonl", 8)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2)}) + "\n"
                             for i in range(8)))
    common = {"model": {"name_or_path": str(model)}, "logging": {"plot": False}}
    return {
        "sft": {**common, "run": {"name": "sft", "output_dir": str(tmp_path / "runs")}, "algorithm": {"name": "sft"},
                "data": {"train": [{"path": str(tmp_path / "chat.jsonl")}], "max_length": 64},
                "train": {"global_batch_size": 4, "micro_batch_size_per_device": 2, "max_steps": 3, "optim": optim}},
        "grpo": {**common, "run": {"name": "grpo", "output_dir": str(tmp_path / "runs")}, "algorithm": {"name": "grpo"},
                 "rl": rl, "train": {"max_steps": 3, "micro_batch_size_per_device": 8, "optim": optim}},
        # PPO loads a critic (transformers' "Loading weights" bar); rm a sequence classifier (its LOAD REPORT table)
        "ppo": {**common, "run": {"name": "ppo", "output_dir": str(tmp_path / "runs")}, "algorithm": {"name": "ppo"},
                "rl": rl, "train": {"max_steps": 1, "micro_batch_size_per_device": 8, "optim": optim}},
        "rm": {**common, "run": {"name": "rm", "output_dir": str(tmp_path / "runs")}, "algorithm": {"name": "rm"},
               "data": {"train": [{"path": str(pairs)}], "max_length": 64},
               "train": {"global_batch_size": 4, "micro_batch_size_per_device": 2, "max_steps": 1, "optim": optim}},
        "online_dpo": {**common, "run": {"name": "online", "output_dir": str(tmp_path / "runs")},
                       "algorithm": {"name": "online_dpo"},
                       "rl": {**rl, "rewards": [{"name": "tests.system.test_console:odd_length"}]},
                       "train": {"max_steps": 2, "micro_batch_size_per_device": 8, "optim": optim}},
    }


def _console(tmp_path: Path, config: dict) -> str:
    path = tmp_path / f"{config['run']['name']}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "oxrl", "train", str(path)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.mark.parametrize("algorithm", ["sft", "grpo", "ppo", "rm"])
def test_the_console_of_a_short_run_is_a_summary_without_noise(tmp_path, tiny_model_dir, algorithm):
    config = _configs(tmp_path, tiny_model_dir)[algorithm]
    console = _console(tmp_path, config)
    lines = [line.strip() for line in re.split(r"[\r\n]", console) if line.strip()]
    for noise in NOISE:
        assert noise not in console, noise
    run_dir = tmp_path / "runs" / config["run"]["name"]
    assert f"run directory {run_dir} (the whole config: {run_dir / 'config.yaml'})" in console
    steps = config["train"]["max_steps"]
    assert f"{algorithm} on tiny; changed from the defaults: " in console and f"train.max_steps={steps}" in console
    assert "sample_max_new_tokens" not in console and "sample_max_new_tokens" in (run_dir / "config.yaml").read_text()
    warnings = Counter(re.sub(r"^\d\d:\d\d:\d\d ", "", line) for line in lines if "warn" in line.lower())
    assert all(count == 1 for count in warnings.values()), warnings
    assert len([line for line in lines if not line.startswith("train:")]) < 25, console  # log lines, not bar frames
    assert "DEBUG" in (run_dir / "train.log").read_text()  # (the choices left off the console are in the file)


@pytest.mark.parametrize("algorithm", ["grpo", "online_dpo"])
def test_rl_and_online_steps_log_the_lr_their_update_used(tmp_path, tiny_model_dir, algorithm):
    config = _configs(tmp_path, tiny_model_dir)[algorithm]
    config["logging"]["progress_bar"] = False
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "runs" / config["run"]["name"] / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if row["step"] > 0]  # (step 0: the held-out accuracy before training)
    optim = OptimConfig(**config["train"]["optim"])
    steps = config["train"]["max_steps"]
    assert [row["lr"] for row in rows] == pytest.approx([1e-3 * lr_factor(s, steps, optim) for s in range(steps)])
    assert rows[0]["lr"] == pytest.approx(1e-3)  # a cosine schedule starts at the peak, and no step logs the next one
    if algorithm == "online_dpo":
        assert all(row["online/examples"] > 0 for row in rows)  # every step updated, so the schedule moved
