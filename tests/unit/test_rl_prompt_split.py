"""Which prompt-file rows RL holds out for validation: never all of them unless asked, and then an error."""

import json

import pytest

from oxrl.config.load import load_config
from oxrl.config.rl_presets import resolve
from oxrl.data.rl_prompts import validation_split_size
from oxrl.loops.rl_setup import load_prompts


def rl2_file(path, rows: int):
    """RL2's README format: a chat prompt in `messages`, the gold answer in `extra_info`."""
    lines = [{"messages": [{"role": "user", "content": f"What is {i}+1?"}], "extra_info": {"answer": str(i + 1)}}
             for i in range(rows)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def prompts_for(*overrides):
    cfg = load_config(None, ["model.name_or_path=m", "algorithm.name=grpo", *overrides])
    return load_prompts(cfg, resolve(cfg.algorithm.name, cfg.rl))


def test_a_small_file_trains_on_every_row_by_default(tmp_path):
    path = rl2_file(tmp_path / "eight.jsonl", 8)
    train, validation = prompts_for(f"data.train=[{{path: {path}}}]")
    assert len(train) == 8 and validation == []
    assert train[0].fields == {"answer": "1"}


def test_the_default_split_is_a_tenth_of_the_rows_at_most_100():
    assert [validation_split_size(None, rows) for rows in (1, 9, 10, 25, 999, 1000, 5000)] == [0, 0, 1, 2, 99, 100, 100]


def test_a_requested_count_is_held_out_from_the_start(tmp_path):
    path = rl2_file(tmp_path / "eight.jsonl", 8)
    train, validation = prompts_for(f"data.train=[{{path: {path}}}]", "rl.validation_size=3")
    assert [p.row for p in validation] == [1, 2, 3] and [p.row for p in train] == [4, 5, 6, 7, 8]
    assert prompts_for(f"data.train=[{{path: {path}}}]", "rl.validation_size=0")[1] == []


@pytest.mark.parametrize("requested", [8, 100])
def test_a_requested_count_that_leaves_no_training_rows_names_the_setting(tmp_path, requested):
    path = rl2_file(tmp_path / "eight.jsonl", 8)
    with pytest.raises(ValueError, match=f"rl.validation_size is {requested} but data.train has 8 prompt rows: "
                                         f"holding out {requested} leaves none to train on"):
        prompts_for(f"data.train=[{{path: {path}}}]", f"rl.validation_size={requested}")


def test_validation_files_are_used_as_they_are(tmp_path):
    train_path, val_path = rl2_file(tmp_path / "train.jsonl", 8), rl2_file(tmp_path / "val.jsonl", 2)
    train, validation = prompts_for(f"data.train=[{{path: {train_path}}}]", f"data.validation=[{{path: {val_path}}}]")
    assert len(train) == 8 and len(validation) == 2


def test_generated_tasks_generate_100_validation_prompts_by_default():
    train, validation = prompts_for("rl.task=arithmetic", "rl.task_size=20")
    assert len(train) == 20 and len(validation) == 100
    assert len(prompts_for("rl.task=arithmetic", "rl.task_size=20", "rl.validation_size=5")[1]) == 5


def test_dataset_column_renames_apply_to_prompt_files(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"query": "What is 2+2?", "answer": "4"}) + "\n")
    (prompt,), _ = prompts_for(f"data.train=[{{path: {path}, columns: {{query: prompt}}}}]")
    assert prompt.prompt == "What is 2+2?" and prompt.fields == {"answer": "4"}
