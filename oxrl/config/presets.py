"""Task presets for the Python API: a task name -> a config tree that the user's arguments refine."""

from __future__ import annotations

import copy
import difflib

TASK_PRESETS: dict[str, dict] = {
    # RL with verifiable rewards on generated arithmetic (offline, seeded), Dr. GRPO.
    "math": {
        "algorithm": {"name": "dr_grpo"},
        "rl": {"task": "arithmetic", "task_config": {"max_operand": 20}, "task_size": 600, "validation_size": 50,
               "prompts_per_step": 4, "rollout": {"n": 8, "max_new_tokens": 48}, "validation_every": 10},
        "train": {"max_steps": 30, "micro_batch_size_per_device": 16, "optim": {"lr": 2.0e-6, "schedule": "constant"}},
    },
    # RL on reasoning-gym's countdown puzzles.
    "countdown": {
        "algorithm": {"name": "dr_grpo"},
        "rl": {"task": "countdown", "task_size": 1000, "validation_size": 50, "prompts_per_step": 4,
               "rollout": {"n": 8, "max_new_tokens": 128}, "validation_every": 10},
        "train": {"max_steps": 50, "micro_batch_size_per_device": 16, "optim": {"lr": 2.0e-6, "schedule": "constant"}},
    },
    # Supervised fine-tuning on the small chat set shipped with oxRL.
    "chat": {
        "algorithm": {"name": "sft"},
        "data": {"train": [{"path": "bundled:chat_sft.jsonl"}], "validation_fraction": 0.1, "max_length": 512},
        "train": {"global_batch_size": 8, "micro_batch_size_per_device": 4, "max_steps": 30, "eval_every": 10,
                  "optim": {"lr": 1.0e-4, "warmup_steps": 3}},
    },
}


def task_preset(task: str) -> dict:
    if task not in TASK_PRESETS:
        close = difflib.get_close_matches(task, list(TASK_PRESETS), n=1)
        raise ValueError(f"unknown task `{task}`.{f' Did you mean `{close[0]}`?' if close else ''} Valid: {', '.join(TASK_PRESETS)}")
    return copy.deepcopy(TASK_PRESETS[task])
