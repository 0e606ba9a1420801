"""A setting that a run never reads is refused when a user sets it: no setting is accepted and ignored.

A one-step run of each kind (tiny model, `oxrl train`'s runner: SFT, DPO, ORPO, KTO, distillation, SFT and GRPO with
LoRA, GRPO with and without a KL term, PPO with either critic, Online DPO, RFT) records every read of a config field
made by the run's code, not by the config's own validation. Then each scalar setting the run never read is set, one
at a time, to a valid value other than its default: the config must be refused, naming who reads the setting,
before anything loads. The check follows the code, not a list: a new setting read only in some runs fails here
until its `ReadOnly` rule (oxrl/config/schema.py) says when it is read.
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
}


def _merge(tree: dict, more: dict, model: str) -> dict:
    for key, value in more.items():
        tree[key] = _merge(tree.get(key, {}), value, model) if isinstance(value, dict) else (model if value == MODEL else value)
    return tree


@pytest.mark.parametrize("run_kind", RUNS)
def test_a_run_refuses_every_setting_it_does_not_read(run_kind, tmp_path, smollm2_tokenizer, reads):
    algorithm, data, own = RUNS[run_kind]
    model = str(_tiny_model(tmp_path / "model", smollm2_tokenizer))
    tree = {
        "run": {"name": "run", "output_dir": str(tmp_path / "runs"), "device": "cpu"},
        "model": {"name_or_path": model},
        "algorithm": {"name": algorithm},
        "train": {"max_steps": 1, "micro_batch_size_per_device": 4},
        "logging": {"progress_bar": False},
    }
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(_merge(_merge(tree, _data(data, tmp_path), model), own, model)))
    # Between 60 and 100 settings are unread in each run, and each is refused: the sections of the other kinds of
    # algorithm, the other losses' settings, the critic's but in PPO, vLLM's, LoRA's without it, checkpoint.keep_last.
    assert _run_and_check(config, reads) >= 50
