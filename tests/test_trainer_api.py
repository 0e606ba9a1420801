"""The Python API builds the same validated config as the YAML route."""

import pytest

from oxrl import Trainer
from oxrl.config.load import ConfigError


def test_task_preset_plus_overrides():
    cfg = Trainer(model="smollm2-135m-instruct").config(task="math", **{"rl.rollout.n": 4, "train.max_steps": 3})
    assert cfg.algorithm.name == "dr_grpo" and cfg.rl.task == "arithmetic"
    assert cfg.rl.rollout.n == 4 and cfg.train.max_steps == 3 and cfg.model.name_or_path == "smollm2-135m-instruct"


def test_data_files_replace_the_generated_task():
    cfg = Trainer(model="m", algorithm="dr_grpo").config(task="math", data="gsm8k.jsonl")
    assert cfg.rl.task is None and cfg.data.train[0].path == "gsm8k.jsonl"


def test_bad_task_and_bad_override_are_clear():
    with pytest.raises(ValueError, match="unknown task `mathh`. Did you mean `math`"):
        Trainer(model="m").config(task="mathh")
    with pytest.raises(ConfigError, match="Did you mean `train.optim.lr`"):
        Trainer(model="m", algorithm="sft").config(task="chat", **{"train.optim.lrr": 1.0})
