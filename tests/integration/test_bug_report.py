"""A run keeps its log; a failed one keeps its traceback and says how to report it; `oxrl report` turns both,
with versions, hardware and the config, into a Markdown bug report. None of them, nor the console, holds a
secret (the judge's key end to end: tests/integration/test_judge_hostile.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from oxrl.cli import main
from oxrl.logging.bug_report import write_bug_report
from oxrl.logging.redaction import register_secret
from oxrl.logging.run_log import run_logged
from tests.conftest import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
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
    assert main(["train", str(config)]) == 2  # a reward that raises: one line on the console, exit code 2
    assert "KeyError: 'answer_field_missing'" in oxrl_log.text
    assert "KeyError: 'answer_field_missing'" in (run / "failure.txt").read_text()
    # The user's own reward failed (a RewardError, a UserError): not presented as a possible bug of oxRL's.
    assert "writes a bug report" not in oxrl_log.text
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


# --- secrets: redacted before anything is written ------------------------------------------------------


def test_a_run_log_and_failure_file_redact_any_registered_secret(tmp_path):
    register_secret("sk-registered-0123456789")
    with pytest.raises(KeyError), run_logged(tmp_path, is_main=True):
        logging.getLogger("oxrl.test").warning("careless: %s", "Bearer sk-registered-0123456789")
        raise KeyError("sk-registered-0123456789")
    log, failure = (tmp_path / "train.log").read_text(), (tmp_path / "failure.txt").read_text()
    assert "careless: Bearer ***" in log and "KeyError: '***'" in failure
    assert "sk-registered" not in log + failure


def test_the_bug_report_redacts_secret_variables_and_keys_older_files_hold(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    monkeypatch.setenv("MY_JUDGE", "judge-key-0123456789")  # a name that does not look secret, named by the config
    (tmp_path / "config.yaml").write_text("rl:\n  rewards:\n  - kwargs:\n      api_key_env: MY_JUDGE\n    name: judge\n")
    (tmp_path / "train.log").write_text("token hf_abcdefghijklmnop\nsent 'Bearer judge-key-0123456789'\n"
                                        "quoted \"judge-key-0123456789\" url judge%2Dkey-0123456789\n")
    report = write_bug_report(tmp_path).read_text()
    assert "hf_abcdefghijklmnop" not in report and "judge-key-0123456789" not in report
    assert "token ***" in report and "Bearer ***" in report
    assert "api_key_env: MY_JUDGE" in report  # the variable's name is no secret


def test_the_console_redacts_a_registered_secret():
    code = ("import logging; from oxrl.logging.setup import setup_logging; from oxrl.logging.redaction import "
            "register_secret; setup_logging(); register_secret('sk-console-secret-1'); log = logging.getLogger('oxrl.x')\n"
            "try:\n    raise RuntimeError('refused: sk-console-secret-1')\n"
            "except RuntimeError:\n    log.exception('key %s', 'sk-console-secret-1')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "key ***" in done.stderr and "RuntimeError: refused: ***" in done.stderr
    assert "sk-console-secret-1" not in done.stderr



def test_the_oxrl_command_prints_a_traceback_nothing_catches_redacted():
    # An error quoting a token from the environment that no handler catches (another library's, say) ends in
    # Python's own traceback print, which passes no log filter: the `oxrl` command's excepthook redacts it.
    code = ("import os, sys; from oxrl.cli import main\n"
            "sys.argv = ['oxrl', 'config-reference']\n"
            "main()\n"
            "raise RuntimeError('refused with ' + os.environ['LEAKY_API_KEY'])\n")
    env = {**os.environ, "LEAKY_API_KEY": "tok-uncaught-0123456789"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert done.returncode == 1
    assert "RuntimeError: refused with ***" in done.stderr, done.stderr[-2000:]
    assert "tok-uncaught-0123456789" not in done.stderr
