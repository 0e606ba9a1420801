"""The Python API builds the same validated config as the YAML route."""

import re

import pytest

from oxrl import Trainer
from oxrl.config.load import ConfigError
from tests.test_runner import _write_config, tiny_model_dir  # noqa: F401 (a fixture)


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


def test_unnamed_trainer_runs_never_share_a_directory(tmp_path, tiny_model_dir):
    data = _write_config(tmp_path, tiny_model_dir).parent / "chat.jsonl"
    trainer = Trainer(model=str(tiny_model_dir), algorithm="sft")
    settings = {"run.output_dir": str(tmp_path / "runs"), "train.max_steps": 1, "train.global_batch_size": 2,
                "data.max_length": 64, "logging.progress_bar": False, "logging.plot": False, "checkpoint.save_final": False}
    first, second = trainer.train(data=str(data), **settings), trainer.train(data=str(data), **settings)
    assert first.run_dir != second.run_dir
    assert all(re.fullmatch(r"sft-\d{8}-\d{6}-[0-9a-f]{4}", r.run_dir.name) for r in (first, second))
    assert all((r.run_dir / "metrics.jsonl").is_file() for r in (first, second))
