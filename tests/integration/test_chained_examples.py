"""Examples that train on another example's output (KD's teacher, RLHF's reward model, the calculator agent's SFT
model), run before it: one error naming the setting and the example that makes the missing folder, before anything
loads (oxrl/preflight.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oxrl.config.load import ConfigError, load_config
from oxrl.config.run_outputs import missing_run_output
from oxrl.preflight import check_run_outputs
from oxrl.rewards.reward_model_reward import check_reward_model_reward

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(("example", "setting", "maker"), [
    ("kd_forward_smollm2_chat.yaml", "preference.teacher", "sft_smollm2_chat.yaml"),
    ("grpo_smollm2_calculator_agent.yaml", "model.name_or_path", "sft_smollm2_calculator_traces.yaml"),
])
def test_a_chained_example_run_first_names_the_setting_and_the_example_that_makes_it(tmp_path, monkeypatch, example,
                                                                                   setting, maker):
    monkeypatch.chdir(tmp_path)  # no runs/ here
    cfg = load_config(str(EXAMPLES / example), [])
    with pytest.raises(ConfigError) as error:
        check_run_outputs(cfg)
    assert str(error.value).startswith(f"{setting}: runs/")
    assert f"`oxrl train {EXAMPLES / maker}` makes it" in str(error.value)


def test_the_rlhf_reward_model_path_names_the_rm_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(str(EXAMPLES / "rlhf_smollm2_arithmetic.yaml"), [])
    path = next(spec.kwargs["path"] for spec in cfg.rl.rewards if spec.name == "reward_model")
    with pytest.raises(ValueError) as error:
        check_reward_model_reward(path=path)
    assert "rl.rewards: reward_model's kwargs.path" in str(error.value)
    assert f"`oxrl train {EXAMPLES / 'rm_smollm2_arithmetic.yaml'}` makes it" in str(error.value)


def test_only_a_missing_run_output_is_refused_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert missing_run_output("model.name_or_path", "HuggingFaceTB/final") is None  # a hub id
    (tmp_path / "runs" / "mine" / "final").mkdir(parents=True)
    assert missing_run_output("model.name_or_path", "runs/mine/final") is None  # there
    message = missing_run_output("preference.teacher", "runs/unknown-run/checkpoints/step_000004")
    assert message == ("preference.teacher: runs/unknown-run/checkpoints/step_000004 does not exist: it is what the run "
                       "`unknown-run` writes, which has not run here (train run `unknown-run` first, or set "
                       "preference.teacher)")
