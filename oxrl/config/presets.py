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
    # Open-R1's math recipe (DeepSeek-R1, arXiv:2501.12948), small: GRPO on problems in Open-R1's format
    # (`problem`, a `solution` ending in \boxed{}), shipped with oxRL (oxrl/data/bundled/make_reasoning_openr1.py)
    # or the user's via `data=`; reasoning in <think> tags, the answer in <answer> tags, which the math reward
    # reads first; + 0.2 x the format reward. examples/grpo_smollm2_reasoning.yaml is the same recipe as a file.
    "reasoning": {
        "algorithm": {"name": "grpo"},
        "data": {"train": [{"path": "bundled:reasoning_openr1.jsonl", "format": "openr1"}], "max_length": 1024},
        "rl": {"answer_format": "tags",
               "rewards": [{"name": "math", "kwargs": {"prefer": "tag"}}, {"name": "format", "weight": 0.2}],
               "prompts_per_step": 4, "rollout": {"n": 8, "max_new_tokens": 256}, "validation_every": 10},
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
