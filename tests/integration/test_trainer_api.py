"""The Python API builds the same validated config as the YAML route."""

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from oxrl import Trainer
from oxrl.config.load import ConfigError, load_config
from tests.integration.test_runner import _write_config, tiny_model_dir  # noqa: F401 (a fixture)


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


def _reasoning_rows(count: int) -> list[dict]:
    return [{"problem": f"What is {i} + {i} + {i}?", "solution": f"{i} + {i} = {2 * i}, and {2 * i} + {i} = {3 * i}. "
             f"The answer is $\\boxed{{{3 * i}}}$."} for i in range(count)]


# `lora.enabled` given: the config is built without probing the model's memory needs (oxrl.trainer.lora_first).
NO_PROBE = {"lora.enabled": False}


def test_reasoning_preset_is_grpo_on_openr1_rows_with_math_and_format_rewards():
    cfg = Trainer(model="smollm2-135m-instruct").config(task="reasoning", **NO_PROBE)
    assert cfg.algorithm.name == "grpo" and cfg.rl.task is None and cfg.rl.answer_format == "tags"
    assert [(spec.path, spec.format) for spec in cfg.data.train] == [("bundled:reasoning_openr1.jsonl", "openr1")]
    rewards = {spec.name: spec for spec in cfg.rl.rewards}
    assert set(rewards) == {"math", "format"} and rewards["math"].kwargs == {"prefer": "tag"}
    assert rewards["math"].weight == 1.0 and 0.1 <= rewards["format"].weight <= 0.2


def test_the_reasoning_example_is_the_reasoning_preset():
    """examples/grpo_smollm2_reasoning.yaml is the same recipe as a file (its sizes may differ)."""
    example = load_config(Path(__file__).resolve().parents[2] / "examples" / "grpo_smollm2_reasoning.yaml")
    preset = Trainer(model="smollm2-135m-instruct").config(task="reasoning", **NO_PROBE)
    for get in (lambda c: c.algorithm, lambda c: c.data.train, lambda c: c.rl.rewards, lambda c: c.rl.answer_format):
        assert get(example) == get(preset)


def test_every_bundled_reasoning_row_is_scored_right_when_answered_right():
    """The bundled file reads as Open-R1 rows, and the preset's rewards give its own answers full marks."""
    from oxrl.data.rl_prompts import read_rl_prompts
    from oxrl.data.rl_tasks import prompt_template
    from oxrl.loops.rl_setup import reward_function

    cfg = Trainer(model="smollm2-135m-instruct").config(task="reasoning", **NO_PROBE)
    prompts = read_rl_prompts("bundled:reasoning_openr1.jsonl", "openr1", template=prompt_template(cfg.rl))
    assert len(prompts) >= 300 and len({p.messages[-1]["content"] for p in prompts}) == len(prompts)
    assert "<think>" in prompts[0].messages[-1]["content"]  # the tags instruction
    answered = [f"<think>worked out</think> <answer>{p.fields['answer']}</answer>" for p in prompts]
    scores = reward_function(cfg, cfg.rl)(["" for _ in prompts], answered, [p.fields for p in prompts])
    assert scores.totals == [1.2] * len(prompts)
    boxed_only = reward_function(cfg, cfg.rl)([""], [f"\\boxed{{{prompts[0].fields['answer']}}}"], [prompts[0].fields])
    assert boxed_only.components == {"math": [1.0], "format": [0.0]}  # right, but not in the asked format


def test_data_replaces_the_bundled_reasoning_file():
    cfg = Trainer(model="m").config(task="reasoning", data="my_openr1.jsonl", **NO_PROBE)
    assert [spec.path for spec in cfg.data.train] == ["my_openr1.jsonl"]
    assert [spec.name for spec in cfg.rl.rewards] == ["math", "format"] and cfg.rl.answer_format == "tags"


TINY_RL = {"train.max_steps": 1, "rl.prompts_per_step": 2, "rl.rollout.n": 2, "rl.rollout.max_new_tokens": 8,
           "train.micro_batch_size_per_device": 4, "rl.validation_size": 2, "logging.plot": False,
           "logging.progress_bar": False, "checkpoint.save_final": False}


@pytest.mark.parametrize("own_data", [False, True], ids=["bundled", "data="])
def test_reasoning_runs_one_step_on_a_tiny_model(tmp_path, tiny_model_dir, own_data):
    data = None
    if own_data:
        data = tmp_path / "my_openr1.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in _reasoning_rows(12)))
    result = Trainer(model=str(tiny_model_dir)).train(task="reasoning", data=None if data is None else str(data),
                                                      **{"run.output_dir": str(tmp_path / "runs"), **TINY_RL})
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    step = next(row for row in rows if row["step"] == 1)
    assert math.isfinite(step["loss"]) and math.isfinite(step["reward/mean"]) and "reward/format" in step
    saved = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    expected = str(data) if own_data else "bundled:reasoning_openr1.jsonl"
    assert [spec["path"] for spec in saved["data"]["train"]] == [expected]
