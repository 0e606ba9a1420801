"""A run keeps its log; a failed one keeps its traceback and says how to report it; `oxrl report` turns both,
with versions, hardware and the config, into a Markdown bug report."""

from __future__ import annotations

import logging

import pytest
import yaml

from oxrl.cli import main
from tests.conftest import save_tiny_model

FAILING_REWARD = '''
def broken(prompt, completion):
    raise KeyError("answer_field_missing")
'''


def grpo_yaml(tmp_path, smollm2_tokenizer, reward: str | None) -> tuple:
    model = save_tiny_model(tmp_path / "model", smollm2_tokenizer)
    (tmp_path / "reward.py").write_text(FAILING_REWARD)
    config = {
        "run": {"name": "run", "output_dir": str(tmp_path / "runs"), "device": "cpu"},
        "model": {"name_or_path": str(model)},
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "task_size": 8, "validation_size": 0, "prompts_per_step": 2,
               "rollout": {"n": 2, "max_new_tokens": 4}, **({"rewards": [{"name": reward}]} if reward else {})},
        "train": {"max_steps": 1, "micro_batch_size_per_device": 4},
        "checkpoint": {"save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    }
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "grpo.yaml", tmp_path / "runs" / "run"


def test_a_failed_run_keeps_its_traceback_and_the_report_holds_everything(tmp_path, smollm2_tokenizer, oxrl_log):
    config, run = grpo_yaml(tmp_path, smollm2_tokenizer, f"{tmp_path / 'reward.py'}:broken")
    oxrl_log.set_level(logging.INFO, logger="oxrl")
    with pytest.raises(Exception, match="answer_field_missing"):
        main(["train", str(config)])
    assert "KeyError: 'answer_field_missing'" in (run / "failure.txt").read_text()
    assert f"`oxrl report {run}` writes a bug report" in oxrl_log.text
    assert "RewardError" in (run / "train.log").read_text()
    assert ":broken x1" in (run / "train.log").read_text()  # the run's own log lines (the rewards line)

    assert main(["report", str(run)]) == 0
    report = (run / "bug_report.md").read_text()
    for section in ("## Versions", "## Hardware", "## Config (`config.yaml`)", "## Last 60 log lines (`train.log`)",
                    "## Traceback (`failure.txt`)"):
        assert section in report, section
    assert "- torch " in report and "- transformers " in report and "cores" in report
    assert "algorithm:\n  name: grpo" in report and "answer_field_missing" in report


def test_a_run_that_ends_well_keeps_its_log_and_no_failure(tmp_path, smollm2_tokenizer):
    config, run = grpo_yaml(tmp_path, smollm2_tokenizer, None)
    assert main(["train", str(config)]) == 0
    assert "step 1 " in (run / "train.log").read_text()  # the metrics line of the one step
    assert not (run / "failure.txt").exists()


def test_report_refuses_a_folder_without_a_run(tmp_path, oxrl_log):
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no oxRL run" in oxrl_log.text
