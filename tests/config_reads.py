"""What a run reads of its config, checked against the `ReadOnly` rules both ways.

`recording_reads` records every read of a config field made by the run's code, and where (the `config_reads` fixture
of tests/conftest.py). `check_reads_against_rules` then checks, after the run:

- every setting the run read is one its rules say it reads (`schema.settings`): none of the settings the config
  refuses, which hold their defaults, is looked at by the run's code either;
- each scalar setting the run never read, set one at a time to a valid value other than its default, is refused,
  naming who reads the setting, before anything loads.

So the rules are exactly the code's reads, for the runs tested. Used by tests/integration/test_unread_settings.py (a
run of each kind) and test_examples.py (every example).
"""

from __future__ import annotations

import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path

from oxrl.config.load import ConfigError
from oxrl.config.schema import Config, Section, settings

# The config's own code (validation, the Ray and vla layout checks, presets, rules, the reference) reads settings for
# every run; a read counts when the first caller outside it is the run's code. So a property such as
# `Config.trained_objective` (online.loss), called by the run, is the run reading the setting; the loss parameters'
# mapping (params.py) reads on behalf of the losses.
PACKAGE = str(Path(__file__).resolve().parents[1] / "oxrl") + "/"
CONFIG_OWN = tuple(f"{PACKAGE}config/{name}.py" for name in (
    "schema", "ray_layout", "vla_layout", "load", "rl_presets", "explain", "reference", "names"))


def _reader(recorder) -> str | None:
    """`file:line` of the run's code making the attribute read that `recorder` (the recording `__getattribute__`'s
    code) is handling; None when the config's own code makes it. A property (`trained_objective`) runs under the
    recorder's own frame, which is skipped too; a read under pydantic is a section being validated or dumped (a
    validator in schema.py reads it, or `model_dump` builds a default section to compare with)."""
    frame = sys._getframe(2)  # the caller of the attribute read
    while frame is not None and (frame.f_code.co_filename.startswith(CONFIG_OWN) or frame.f_code is recorder):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(PACKAGE):
        return None
    return f"{frame.f_code.co_filename.removeprefix(PACKAGE)}:{frame.f_lineno}"


def recording_reads(monkeypatch) -> dict[tuple[str, str], set[str]]:
    """(section class, field) -> where, of every config field the run's code reads from now until the test ends."""
    seen: dict[tuple[str, str], set[str]] = {}
    original = Section.__getattribute__

    def recording(self, name):
        cls = type(self)
        if name in cls.model_fields and (where := _reader(recording.__code__)) is not None:
            seen.setdefault((cls.__name__, name), set()).add(where)
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


def _names(message: str, key: str) -> bool:
    """Whether a refusal `message` names `key`, or the section holding it, as the setting not read."""
    parts = key.split(".")
    return any(re.search(rf"(?:^|[-;] ){re.escape('.'.join(parts[:n]))} = ", message, re.MULTILINE)
               for n in range(1, len(parts) + 1))


def _refused(load: Callable[[list[str]], Config], key: str, value: str) -> bool | None:
    """True: `key` refused as not read, before anything loads (by the config, then by the strategy, which knows the
    processes); False: accepted; None: not a valid value of `key`."""
    from oxrl.training.build import build_strategy

    try:
        cfg = load([f"{key}={value}"])
    except ConfigError as error:
        return True if "not read by" in str(error) and _names(str(error), key) else None
    try:
        build_strategy(cfg)
    except ValueError as error:
        if "not read" in str(error) and _names(str(error), key):
            return True
        raise
    return False


def _refused_settings(cfg: Config) -> set[str]:
    """The dotted keys of every setting `cfg`'s rules refuse when set: a refused section's settings, save those it
    keeps (`lora.enabled`)."""
    refused, kept = set(), set()
    for setting in settings(cfg):
        if setting.unread is None:
            kept.add(setting.key)
            continue
        refused.add(setting.key)
        if isinstance(setting.value, Section):
            refused |= {f"{setting.key}.{key}" for key, *_ in _leaves(setting.value)}
    return refused - kept


def check_reads_against_rules(cfg: Config, reads: dict[tuple[str, str], set[str]],
                              load: Callable[[list[str]], Config]) -> int:
    """After `cfg`'s run: no setting it read is one its rules refuse; each scalar setting it never read, set by
    `load(overrides)` (the run's config with the overrides) to a value other than its default, is refused. Returns
    how many were."""
    assert ("RunConfig", "seed") in reads and ("OptimConfig", "lr") in reads  # the recording sees the run's reads
    refused = _refused_settings(cfg)
    read_anyway = {key: sorted(reads[section, field]) for key, section, field, *_ in _leaves(cfg)
                   if key in refused and (section, field) in reads}
    assert not read_anyway, f"read by the run although the config refuses them when set (key: where): {read_anyway}"
    tested, accepted = 0, []
    for key, section, field, default, annotation in _leaves(cfg):
        if (section, field) in reads or isinstance(default, list) or _holds_a_section(annotation):
            continue
        for other in _other_values(default, annotation):
            refused = _refused(load, key, other)
            if refused is None:
                continue  # not a valid value of this setting: try the next
            tested += refused
            if not refused:
                accepted.append(f"{key}={other}")
            break
    assert not accepted, f"set, never read by the run, and not refused: {accepted}"
    return tested
