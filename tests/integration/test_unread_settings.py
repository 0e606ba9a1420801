"""A run reads exactly the settings its config does not refuse: no setting is accepted and ignored, and none that
is refused is looked at.

A one-step run of each kind (tiny model, `oxrl train`'s runner: SFT, DPO, ORPO, KTO, distillation, SFT and GRPO with
LoRA, GRPO with and without a KL term, PPO with either critic, Online DPO, RFT) records every read of a config field
made by the run's code, not by the config's own validation. Then no setting the run read may be one its rules refuse,
and each scalar setting the run never read is set, one at a time, to a valid value other than its default: the config
must be refused, naming who reads the setting, before anything loads. The check follows the code, not a list: a new
setting read only in some runs fails here until its `ReadOnly` rule (oxrl/config/schema.py) says when it is read, and
a rule that refuses a setting some code still reads fails here until that read is made only where the rule holds.
"""

import json
from pathlib import Path

import pytest
import yaml

from oxrl.config.load import load_config
from oxrl.runner import run
from tests.config_reads import check_reads_against_rules
from tests.conftest import save_tiny_model, write_chat_rows


def _data(kind: str, folder: Path) -> dict:
    """A run's data settings: a small file of `kind` (chat rows, preference pairs, KTO's labelled completions), or
    the built-in arithmetic task."""
    if kind == "task":
        return {"rl": {"task": "arithmetic", "task_size": 4, "validation_size": 0, "prompts_per_step": 2,
                       "rollout": {"n": 2, "max_new_tokens": 4}}}
    if kind == "chat":
        path = write_chat_rows(folder / "chat.jsonl", 8)
    else:
        question = [{"role": "user", "content": "What is 2+2?"}]
        answer, wrong = [{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}]
        rows = ([{"messages": question, "chosen": answer, "rejected": wrong}] * 8 if kind == "pairs" else
                [{"messages": question, "completion": answer, "label": True},
                 {"messages": question, "completion": wrong, "label": False}] * 4)
        path = folder / f"{kind}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"data": {"train": [{"path": str(path)}], "max_length": 64},
            "train": {"global_batch_size": 4, "micro_batch_size_per_device": 2}}


MODEL = "<the tiny model>"
# A run of each kind: (algorithm, data, settings of its own). Each sets some switches that make other settings read.
RUNS = {
    "sft": ("sft", "chat", {}),
    "sft-lora": ("sft", "chat", {"lora": {"enabled": True}}),
    "dpo": ("dpo", "pairs", {}),
    "orpo": ("orpo", "pairs", {}),  # reference-free
    "kto": ("kto", "kto", {}),
    "kd_forward": ("kd_forward", "chat", {"preference": {"teacher": MODEL}}),  # the tiny model teaches itself
    "grpo": ("grpo", "task", {}),
    "sgrpo": ("sgrpo", "task", {}),  # a KL term: a reference model, rl.kl_estimator
    "grpo-lora": ("grpo", "task", {"lora": {"enabled": True}}),
    "ppo": ("ppo", "task", {}),
    "ppo-shared": ("ppo", "task", {"rl": {"critic_backbone": "shared"}}),
    "online_dpo": ("online_dpo", "task", {}),
    "rft": ("rft", "task", {}),
    # Switches that make other settings read: a KL reward penalty, pipelined RL with its correction, the on-policy
    # check, held-out prompts; a LoRA run that checkpoints its adapter every step on a constant schedule.
    "grpo-kl-reward": ("grpo", "task", {"rl": {"kl_coef": 0.1, "kl_in_reward": True}}),
    "grpo-pipelined": ("grpo", "task", {"rl": {"max_staleness": 1, "off_policy_correction": "tis"}}),
    "grpo-strict": ("grpo", "task", {"rl": {"strict_on_policy": True}}),
    "grpo-held-out": ("grpo", "task", {"rl": {"validation_size": 2, "validation_every": 1}}),
    "sft-lora-checkpoints": ("sft", "chat", {"lora": {"enabled": True, "save": "adapter"}, "checkpoint": {"every": 1},
                                             "train": {"optim": {"schedule": "constant"}}}),
}


def _merge(tree: dict, more: dict) -> dict:
    for key, value in more.items():
        tree[key] = _merge(tree.get(key, {}), value) if isinstance(value, dict) else value
    return tree


@pytest.mark.parametrize("run_kind", RUNS)
def test_a_run_reads_exactly_the_settings_it_does_not_refuse(run_kind, tmp_path, smollm2_tokenizer, config_reads):
    algorithm, data, own = RUNS[run_kind]
    model = str(save_tiny_model(tmp_path / "model", smollm2_tokenizer))
    tree = {
        "run": {"name": "run", "output_dir": str(tmp_path / "runs"), "device": "cpu"},
        "model": {"name_or_path": model},
        "algorithm": {"name": algorithm},
        "train": {"max_steps": 1, "micro_batch_size_per_device": 4},
        "logging": {"progress_bar": False},
    }
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(_merge(_merge(tree, _data(data, tmp_path)), own)).replace(MODEL, model))
    cfg = load_config(str(config))
    run(cfg)
    # Between 60 and 100 settings are unread in each run, and each is refused: the sections of the other kinds of
    # algorithm, the other losses' settings, the critic's but in PPO, vLLM's, LoRA's without it, checkpoint.keep_last.
    assert check_reads_against_rules(cfg, config_reads, lambda overrides: load_config(str(config), overrides)) >= 50
