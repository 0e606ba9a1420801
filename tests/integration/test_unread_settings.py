"""A setting that a run never reads is refused when a user sets it: no setting is accepted and ignored.

A one-step SFT and a one-step GRPO run (tiny model, `oxrl train`'s runner) record every read of a config field made
outside the config's own validation. Then each scalar setting the run never read is set, one at a time, to a valid
value other than its default: the config must be refused, naming who reads the setting, before anything loads.
The check follows the code, not a list: a new setting read only in some runs fails here until its `ReadOnly` rule
(oxrl/config/schema.py) says when it is read.
"""

import sys
import typing
from pathlib import Path

import pytest
import yaml

from oxrl.config.load import ConfigError, load_config
from oxrl.config.schema import Section
from tests.conftest import make_tiny_llama, write_chat_rows

# The config's own reading (validation, presets, rules, the reference) is not a run reading a setting; the loss
# parameters' mapping (params.py) is, on behalf of the losses.
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "oxrl" / "config")
NOT_A_RUN = (f"{CONFIG_DIR}/schema.py", f"{CONFIG_DIR}/load.py", f"{CONFIG_DIR}/rl_presets.py",
             f"{CONFIG_DIR}/explain.py", f"{CONFIG_DIR}/reference.py", "/pydantic/")


@pytest.fixture
def reads(monkeypatch) -> set[tuple[str, str]]:
    """(section class, field) of every config field read, while the test runs, from outside the config's own code."""
    seen: set[tuple[str, str]] = set()
    original = Section.__getattribute__

    def recording(self, name):
        cls = type(self)
        if name in cls.model_fields:
            caller = sys._getframe(1).f_code.co_filename
            if not any(part in caller for part in NOT_A_RUN):
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


def test_an_sft_run_refuses_every_setting_it_does_not_read(tmp_path, smollm2_tokenizer, reads):
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"name": "sft", "output_dir": str(tmp_path / "runs"), "device": "cpu"},
        "model": {"name_or_path": str(_tiny_model(tmp_path / "model", smollm2_tokenizer))},
        "algorithm": {"name": "sft"},
        "data": {"train": [{"path": str(write_chat_rows(tmp_path / "chat.jsonl", 8))}], "max_length": 64},
        "train": {"max_steps": 1, "global_batch_size": 4, "micro_batch_size_per_device": 2},
        "logging": {"progress_bar": False},
    }))
    # 101 settings unread in this run, each refused: the whole `rl`, `preference`, `online` and `ray` sections, LoRA's
    # settings, checkpoint.keep_last, ...
    assert _run_and_check(config, reads) >= 90


def test_a_grpo_run_refuses_every_setting_it_does_not_read(tmp_path, smollm2_tokenizer, reads):
    config = tmp_path / "grpo.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"name": "grpo", "output_dir": str(tmp_path / "runs"), "device": "cpu"},
        "model": {"name_or_path": str(_tiny_model(tmp_path / "model", smollm2_tokenizer))},
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "task_size": 4, "validation_size": 0, "prompts_per_step": 2,
               "rollout": {"n": 2, "max_new_tokens": 4}},
        "train": {"max_steps": 1, "micro_batch_size_per_device": 4},
        "logging": {"progress_bar": False},
    }))
    # 68 settings unread in this run, each refused: the critic's and vLLM's settings, the preference losses', the offline
    # data and batch settings, checkpoint.keep_last, ...
    assert _run_and_check(config, reads) >= 60
