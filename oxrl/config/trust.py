"""Who wrote a config decides what it may make a run import: a config the user did not name is data.

The user's own: a config file named on the command line (`oxrl train CFG`, `oxrl eval --config CFG`), the dotted
overrides and `--set` values, the flags, and a config built in Python. Data: a config read from a run directory
(`oxrl eval RUN_DIR` reads its saved config.yaml). A run folder is what people share ("evaluate my checkpoint"), and
anyone may have written its config.yaml, so a setting of it that names code (an extension, a reward or environment
file, a `module:factory`, `model.trust_remote_code`, ...) is refused before anything is imported, in one line
naming the setting, its value and the opt-in, --trust-config-code (as transformers' `trust_remote_code`). Built-in
names (`math`, `reach`, `pusht`) name no code; a setting the user sets (`--set`, `--reward`) replaces the file's.

`oxrl train` with `run.resume` always runs the config the user named: the resumed run's saved config.yaml is only
compared with it, key by key (oxrl/training/run_dir.py), and nothing it names is imported.

Which settings name code is declared beside each in the schema (`NamesCode`): `code_fields` walks the schema,
`code_settings` a config tree as read from YAML, before validation (validating imports the extensions);
`load_config(file, screen=as_data(given))` reads a file that is data.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, get_origin

from pydantic import BaseModel

from oxrl.config.explain import bounded
from oxrl.config.load import ConfigError, apply_override
from oxrl.config.schema import Config, NamesCode, section_in

TRUST_FLAG = "--trust-config-code"


def _fields(model: type[BaseModel]) -> Iterator[tuple[str, NamesCode | None, type[BaseModel] | None, bool]]:
    """(name, its NamesCode or None, the section inside it or None, whether that is a list of sections) per field."""
    for name, info in model.model_fields.items():
        marker = next((rule for rule in info.metadata if isinstance(rule, NamesCode)), None)
        inner = section_in(info.annotation)
        many = get_origin(info.annotation) is list or any(get_origin(arg) is list
                                                         for arg in getattr(info.annotation, "__args__", ()) or ())
        yield name, marker, inner, many


def code_fields(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, NamesCode]:
    """Dotted key -> NamesCode of every setting the schema marks; an entry of a list of sections is `key[]`
    (`rl.rewards[].name`)."""
    found = {}
    for name, marker, inner, many in _fields(model):
        key = f"{prefix}{name}"
        if marker is not None:
            found[key] = marker
        if inner is not None:
            found.update(code_fields(inner, f"{key}[]." if many else f"{key}."))
    return found


def code_settings(tree: Any, model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, Any, NamesCode]]:
    """(dotted key, value, NamesCode) of each value in `tree`, a config as read from YAML (not validated), that names
    code: `extensions`, `rl.rewards[0].name`, ... A malformed section is passed over: validation names it."""
    found: list[tuple[str, Any, NamesCode]] = []
    if not isinstance(tree, dict):
        return found
    for name, marker, inner, many in _fields(model):
        if name not in tree:
            continue
        key, value = f"{prefix}{name}", tree[name]
        if marker is not None and marker.names(value):
            found.append((key, value, marker))
        if inner is None:
            continue
        if many and isinstance(value, list):
            for index, item in enumerate(value):
                found += code_settings(item, inner, f"{key}[{index}].")
        elif not many:
            found += code_settings(value, inner, f"{key}.")
    return found


def as_data(given: Mapping[str, Any]) -> Callable[[dict, str], dict]:
    """A `load_config` screen for a config file that is data: `without_untrusted_code` with what the user set."""
    return lambda tree, origin: without_untrusted_code(tree, origin, given)


def without_untrusted_code(tree: dict, origin: str, given: Mapping[str, Any]) -> dict:
    """`tree`, a config that is data (read from `origin`), with each setting of it that names code replaced by what
    the user set for it or a section above it in `given` (dotted key -> value: `--set`, `--reward`); a ConfigError
    in one line naming the settings nothing the user set replaces."""
    tree = copy.deepcopy(tree)
    refused = []
    for key, value, marker in code_settings(tree):
        mine = set_by_user(key, given)
        if mine is None:
            refused.append((key, value, marker))
        else:
            apply_override(tree, mine.split("."), copy.deepcopy(given[mine]))
    if refused:
        raise ConfigError(refusal(origin, refused))
    return tree


def set_by_user(key: str, given: Mapping[str, Any]) -> str | None:
    """The dotted key in `given` (what the user set: `--set` keys, flags) that sets `key` or a section above it."""
    for mine in given:
        if key == mine or key.startswith((f"{mine}.", f"{mine}[")):
            return mine
    return None


def refusal(origin: str, refused: list[tuple[str, Any, NamesCode]]) -> str:
    """The one line that refuses the code settings of a config that is data."""
    named = "; ".join(f"{key} = {bounded(json.dumps(value, default=str))} names {marker.what}"
                      for key, value, marker in refused)
    return (f"{origin} is data, not a config you named on the command line (a run directory's saved config, which "
            f"anyone may have written), so the code it names is not run: {named}. Pass {TRUST_FLAG} "
            "(EvalRequest(trust_config_code=True) in Python) if you trust whoever wrote it, or set the setting yourself "
            "(--set KEY=VALUE)")
