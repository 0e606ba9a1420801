"""A setting that a run never reads is refused when a user sets it: no setting is accepted and ignored.

A one-step run of each kind (tiny model, `oxrl train`'s runner: SFT, DPO, distillation; GRPO, PPO with either critic,
Online DPO, RFT) records every read of a config field made by the run's code, not by the config's own validation. Then each scalar setting the run never read is set, one at a time, to a valid
value other than its default: the config must be refused, naming who reads the setting, before anything loads.
The check follows the code, not a list: a new setting read only in some runs fails here until its `ReadOnly` rule
(oxrl/config/schema.py) says when it is read.
"""

import json
import sys
import typing
from pathlib import Path

import pytest
import yaml

from oxrl.config.load import ConfigError, load_config
from oxrl.config.schema import Section
from tests.conftest import make_tiny_llama, write_chat_rows

# The config's own code (validation, presets, rules, the reference) reads settings for every run; a read counts when
# the first caller outside it is the run's code. So a property such as `Config.trained_objective` (online.loss),
# called by the run, is the run reading the setting; the loss parameters' mapping (params.py) reads on behalf of
# the losses.
PACKAGE = str(Path(__file__).resolve().parents[2] / "oxrl") + "/"
CONFIG_OWN = tuple(f"{PACKAGE}config/{name}.py" for name in ("schema", "load", "rl_presets", "explain", "reference", "names"))


def _read_by_the_run(recorder) -> bool:
    """Whether the attribute read that `recorder` (the recording `__getattribute__`'s code) is handling was made by
    the run's code. A property (`trained_objective`) runs under the recorder's own frame, which is skipped too."""
    frame = sys._getframe(2)  # the caller of the attribute read
    while frame is not None and (frame.f_code.co_filename.startswith(CONFIG_OWN) or frame.f_code is recorder
                                 or "/pydantic/" in frame.f_code.co_filename):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(PACKAGE)


@pytest.fixture
def reads(monkeypatch) -> set[tuple[str, str]]:
    """(section class, field) of every config field the run's code reads while the test runs."""
    seen: set[tuple[str, str]] = set()
    original = Section.__getattribute__

    def recording(self, name):
        cls = type(self)
        if name in cls.model_fields and _read_by_the_run(recording.__code__):
            seen.add((cls.__name__, name))
        return original(self, name)

    monkeypatch.setattr(Section, "__getattribute__", recording)
    return seen


def _leaves(section: Section, prefix: str = ""):
    """(dotted key, section class, field, default, annotation) of every setting that is not itself a section."""
    for name, info in type(section).model_fields.items():
        value = section.__dict__[name]
        if isinstance(value, Section):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", type(section).__name__, name, info.get_default(call_default_factory=True), info.annotation


def _holds_a_section(annotation) -> bool:
    return any(isinstance(arg, type) and issubclass(arg, Section) or _holds_a_section(arg)
               for arg in typing.get_args(annotation))


def _other_values(value, annotation) -> list[str]:
    """Overrides that differ from the default `value` (the first that validates is tried; lists are left out)."""
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is typing.Literal:
            return [str(choice).lower() if isinstance(choice, bool) else str(choice)
                    for choice in typing.get_args(arg) if choice != value]
    if isinstance(value, bool):
        return [str(not value).lower()]
    if isinstance(value, int):
        return [str(value + 1)]
    if isinstance(value, float):
        return [str(value / 2 + 0.01), str(value + 1.0)]
    if isinstance(value, str):
        return ["other"]
    if isinstance(value, dict):
        return ["{probe: 1}"]
    if value is None:
        return ["1", "0.5", "other", "true"]
    return []


def _refused(config_path: Path, key: str, value: str) -> bool | None:
    """True: refused as not read, before anything loads (the config, then the strategy, which knows the processes);
    False: accepted; None: not a valid value of `key`."""
    from oxrl.training.build import build_strategy

    try:
        cfg = load_config(str(config_path), [f"{key}={value}"])
    except ConfigError as error:
        return True if "is not read by" in str(error) else None
    try:
        build_strategy(cfg)
    except ValueError as error:
        if "not read" in str(error):
            return True
        raise
    return False


def _run_and_check(config_path: Path, reads: set[tuple[str, str]]) -> int:
    from oxrl.runner import run

    cfg = load_config(str(config_path))
    run(cfg)
    assert ("RunConfig", "seed") in reads and ("OptimConfig", "lr") in reads  # the recording sees the run's reads
    tested, accepted = 0, []
    for key, section, field, default, annotation in _leaves(cfg):
        if (section, field) in reads or isinstance(default, list) or _holds_a_section(annotation):
            continue
        for other in _other_values(default, annotation):
            refused = _refused(config_path, key, other)
            if refused is None:
                continue  # not a valid value of this setting: try the next
            tested += refused
            if not refused:
                accepted.append(f"{key}={other}")
            break
    assert not accepted, f"set, never read by the run, and not refused: {accepted}"
    return tested


def _tiny_model(folder: Path, tokenizer) -> Path:
    model = make_tiny_llama(vocab_size=len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _pairs(path: Path, count: int) -> Path:
    rows = [{"messages": [{"role": "user", "content": f"What is {i}+{i}?"}],
             "chosen": [{"role": "assistant", "content": f"{2 * i}"}],
             "rejected": [{"role": "assistant", "content": f"{2 * i + 1}"}]} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# (algorithm, its own settings): an objective of each kind, offline on a file.
OFFLINE = {
    "sft": {},
    "dpo": {"data": "pairs"},
    "kd_forward": {"preference": "teacher"},  # the teacher is the tiny model itself
}


@pytest.mark.parametrize("algorithm", OFFLINE)
def test_an_offline_run_refuses_every_setting_it_does_not_read(algorithm, tmp_path, smollm2_tokenizer, reads):
    model = _tiny_model(tmp_path / "model", smollm2_tokenizer)
    data = (_pairs(tmp_path / "pairs.jsonl", 8) if OFFLINE[algorithm].get("data") == "pairs"
            else write_chat_rows(tmp_path / "chat.jsonl", 8))
    tree = {
        "run": {"name": algorithm, "output_dir": str(tmp_path / "runs"), "device": "cpu"},
        "model": {"name_or_path": str(model)},
        "algorithm": {"name": algorithm},
        "data": {"train": [{"path": str(data)}], "max_length": 64},
        "train": {"max_steps": 1, "global_batch_size": 4, "micro_batch_size_per_device": 2},
        "logging": {"progress_bar": False},
    }
    if "preference" in OFFLINE[algorithm]:
        tree["preference"] = {"teacher": str(model)}
    config = tmp_path / f"{algorithm}.yaml"
    config.write_text(yaml.safe_dump(tree))
    # 87 to 99 settings unread in each, each refused: the whole `rl`, `online` and `ray` sections, the other
    # objectives' `preference` settings, LoRA's, checkpoint.keep_last, ...
    assert _run_and_check(config, reads) >= 80


# Runs that sample: the GRPO preset, PPO with each kind of critic, an online algorithm of each kind.
SAMPLING = {"grpo": [], "ppo": [], "ppo-shared": ["rl.critic_backbone=shared"], "online_dpo": [], "rft": []}


@pytest.mark.parametrize("run_kind", SAMPLING)
def test_a_sampling_run_refuses_every_setting_it_does_not_read(run_kind, tmp_path, smollm2_tokenizer, reads):
    config = tmp_path / "rl.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"name": "rl", "output_dir": str(tmp_path / "runs"), "device": "cpu"},
        "model": {"name_or_path": str(_tiny_model(tmp_path / "model", smollm2_tokenizer))},
        "algorithm": {"name": run_kind.split("-")[0]},
        "rl": {"task": "arithmetic", "task_size": 4, "validation_size": 0, "prompts_per_step": 2,
               "rollout": {"n": 2, "max_new_tokens": 4}},
        "train": {"max_steps": 1, "micro_batch_size_per_device": 4},
        "logging": {"progress_bar": False},
    }))
    if SAMPLING[run_kind]:
        config.write_text(yaml.safe_dump(load_config(str(config), SAMPLING[run_kind]).model_dump(
            mode="json", exclude_defaults=True)))
    # 62 to 81 settings unread in each, each refused: the critic's (but PPO's) and vLLM's settings, the offline
    # objectives' `preference` settings, the offline data and batch settings, checkpoint.keep_last, ...
    assert _run_and_check(config, reads) >= 55
