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
    assert result.metrics == rows and result.losses == [step["loss"]]  # RL's per-step metrics and losses too
    saved = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    expected = str(data) if own_data else "bundled:reasoning_openr1.jsonl"
    assert [spec["path"] for spec in saved["data"]["train"]] == [expected]


def _chat_rows(count: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                          {"role": "assistant", "content": f"The answer is {2 * i}."}]} for i in range(count)]


SFT_SETTINGS = {"train.global_batch_size": 4, "train.micro_batch_size_per_device": 4, "data.max_length": 64,
                "logging.progress_bar": False, "logging.plot": False}


def test_a_tiny_sft_from_a_list_of_dicts_learns_and_calls_back_at_every_step(tmp_path, tiny_model_dir):
    calls = []
    trainer = Trainer(model=str(tiny_model_dir), algorithm="sft", callbacks=[lambda step, m: calls.append((step, m))])
    result = trainer.train(data=_chat_rows(8), **{**SFT_SETTINGS, "run.output_dir": str(tmp_path / "runs"),
                                                 "train.max_steps": 8, "train.optim.lr": 3e-3,
                                                 "checkpoint.save_final": False})
    assert result.losses[-1] < result.losses[0] - 0.5 and result.losses == sorted(result.losses, reverse=True)  # it learns
    saved = result.run_dir / "inputs" / "train.jsonl"
    assert [json.loads(line) for line in saved.read_text().splitlines()] == _chat_rows(8)
    assert yaml.safe_load((result.run_dir / "config.yaml").read_text())["data"]["train"][0]["path"] == str(saved)
    assert [step for step, _ in calls] == list(range(1, 9)) and [m["loss"] for _, m in calls] == result.losses
    assert [row["step"] for row in result.metrics] == list(range(1, 9)) and result.metrics[-1]["loss"] == result.losses[-1]


def test_model_and_tokenizer_objects_a_dataset_and_a_config_object(tmp_path, smollm2_tokenizer):
    from datasets import Dataset

    from tests.conftest import make_tiny_llama

    model = make_tiny_llama(vocab_size=len(smollm2_tokenizer))
    base = load_config(None, base={"model": {"name_or_path": "replaced"}, "algorithm": {"name": "sft"},
                                   "run": {"output_dir": str(tmp_path / "runs"), "name": "objects"},
                                   "train": {"max_steps": 1, "global_batch_size": 4, "micro_batch_size_per_device": 4},
                                   "data": {"max_length": 64}, "logging": {"progress_bar": False}})
    result = Trainer(model, config=base, tokenizer=smollm2_tokenizer).train(data=Dataset.from_list(_chat_rows(4)))
    inputs = result.run_dir / "inputs"
    assert result.run_dir == tmp_path / "runs" / "objects" and (inputs / "model" / "model.safetensors").is_file()
    assert (inputs / "model" / "tokenizer_config.json").is_file() and (inputs / "train.jsonl").is_file()
    saved = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert saved["model"]["name_or_path"] == str(inputs / "model") and saved["model"]["tokenizer"] is None
    assert (result.final_model_dir / "model.safetensors").is_file() and len(result.losses) == 1


def test_a_failing_callback_stops_the_run_naming_it(tmp_path, tiny_model_dir, smollm2_tokenizer):
    """(With a tokenizer object beside a model path: saved to the run's inputs/tokenizer.)"""
    from oxrl.trainer import CallbackError

    def stop_at_two(step, metrics):
        if step == 2:
            raise RuntimeError("enough")

    settings = {**SFT_SETTINGS, "run.output_dir": str(tmp_path / "runs"), "run.name": "cb", "train.max_steps": 4}
    with pytest.raises(CallbackError, match=r"callback .*stop_at_two raised RuntimeError at step 2: enough"):
        Trainer(model=str(tiny_model_dir), algorithm="sft", tokenizer=smollm2_tokenizer,
                callbacks=[stop_at_two]).train(data=_chat_rows(8), **settings)
    saved = yaml.safe_load((tmp_path / "runs" / "cb" / "config.yaml").read_text())
    assert saved["model"]["tokenizer"] == str(tmp_path / "runs" / "cb" / "inputs" / "tokenizer")
    rows = (tmp_path / "runs" / "cb" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in rows] == [1, 2] and not (tmp_path / "runs" / "cb" / "final").exists()


def test_bad_rows_and_changed_rows_on_resume_are_refused(tmp_path):
    from oxrl.trainer import write_rows

    with pytest.raises(TypeError, match="row 1: expected a dict of columns, got str"):
        write_rows([{"text": "a"}, "b"], tmp_path / "rows.jsonl")
    with pytest.raises(TypeError, match="row 0: not JSON"):
        write_rows([{"text": object()}], tmp_path / "rows.jsonl")
    path = write_rows([{"text": "a"}], tmp_path / "rows.jsonl")
    assert write_rows([{"text": "a"}], path, resuming=True) == path
    with pytest.raises(ValueError, match="differ from those the run started with"):
        write_rows([{"text": "b"}], path, resuming=True)
    with pytest.raises(TypeError, match="callbacks\\[0\\] is a int"):
        Trainer(model="m", callbacks=[1])


def test_a_config_object_is_refined_by_overrides_and_is_not_mixed_with_a_task():
    base = load_config(None, base={"model": {"name_or_path": "m"}, "algorithm": {"name": "sft"},
                                   "data": {"train": [{"path": "chat.jsonl"}]}, "lora": {"enabled": True, "rank": 8}})
    cfg = Trainer(config=base, **{"train.max_steps": 3}).config()
    assert cfg.train.max_steps == 3 and cfg.lora.rank == 8 and cfg.data.train[0].path == "chat.jsonl"
    assert Trainer("other", config=base).config().model.name_or_path == "other"
    with pytest.raises(ValueError, match="a task preset or a config, not both"):
        Trainer(config=base).config(task="math")
    with pytest.raises(ValueError, match="needs a model"):
        Trainer()
