"""Who wrote a config decides what it may make a run import, or send where: a config the user did not name is data.

The user's own: a config file named on the command line (`oxrl train CFG`, `oxrl eval --config CFG`), the dotted
overrides and `--set` values, the flags, and a config built in Python. Data: a config read from a run directory
(`oxrl eval RUN_DIR` reads its saved config.yaml). A run folder is what people share ("evaluate my checkpoint"), and
anyone may have written its config.yaml, so a setting of it that names code (an extension, a reward or environment
file, a `module:factory`, `model.trust_remote_code`, ...) or a host to send data to (a judge's `url`, whose request
carries the API key read from the user's environment variable `api_key_env`; a remote MLflow server; a Ray
cluster) is refused before anything is imported or sent, in one line naming the setting, its value (a variable's
name, never a secret: none is read) and the opt-in, --trust-config-code (as transformers' `trust_remote_code`).
Built-in names (`math`, `reach`, `pusht`) name no code; a setting the user sets (`--set`, `--reward`) replaces the
file's.

`oxrl train` with `run.resume` always runs the config the user named: the resumed run's saved config.yaml is only
compared with it, key by key (oxrl/training/run_dir.py), and nothing it names is imported.

Which settings need trust is declared beside each in the schema (`NeedsTrust`: `NamesCode` or `SendsOut`):
`trust_fields` walks the schema, `trust_settings` a config tree as read from YAML, before validation (validating
imports the extensions and checks a judge's key); `load_config(file, screen=as_data(given))` reads a file that is
data.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, get_origin

from pydantic import BaseModel

from oxrl.config.explain import bounded
from oxrl.config.load import ConfigError, apply_override
from oxrl.config.schema import Config, NeedsTrust, section_in

TRUST_FLAG = "--trust-config-code"


def _fields(model: type[BaseModel]) -> Iterator[tuple[str, list[NeedsTrust], type[BaseModel] | None, bool]]:
    """(name, its NeedsTrust markers, the section inside it or None, whether that is a list of sections) per field."""
    for name, info in model.model_fields.items():
        markers = [rule for rule in info.metadata if isinstance(rule, NeedsTrust)]
        inner = section_in(info.annotation)
        many = get_origin(info.annotation) is list or any(get_origin(arg) is list
                                                         for arg in getattr(info.annotation, "__args__", ()) or ())
        yield name, markers, inner, many


def trust_fields(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, list[NeedsTrust]]:
    """Dotted key -> the NeedsTrust markers of every setting the schema marks; an entry of a list of sections is
    `key[]` (`rl.rewards[].name`)."""
    found = {}
    for name, markers, inner, many in _fields(model):
        key = f"{prefix}{name}"
        if markers:
            found[key] = markers
        if inner is not None:
            found.update(trust_fields(inner, f"{key}[]." if many else f"{key}."))
    return found


def trust_settings(tree: Any, model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, Any, NeedsTrust]]:
    """(dotted key, value, marker) of each value in `tree`, a config as read from YAML (not validated), that names
    code or a host to send to: `extensions`, `rl.rewards[0].name`, `rl.rewards[0].kwargs` (a judge's `url`), ... A
    malformed section is passed over: validation names it."""
    found: list[tuple[str, Any, NeedsTrust]] = []
    if not isinstance(tree, dict):
        return found
    for name, markers, inner, many in _fields(model):
        if name not in tree:
            continue
        key, value = f"{prefix}{name}", tree[name]
        found += [(key, value, marker) for marker in markers if marker.names(value)]
        if inner is None:
            continue
        if many and isinstance(value, list):
            for index, item in enumerate(value):
                found += trust_settings(item, inner, f"{key}[{index}].")
        elif not many:
            found += trust_settings(value, inner, f"{key}.")
    return found


def as_data(given: Mapping[str, Any]) -> Callable[[dict, str], dict]:
    """A `load_config` screen for a config file that is data: `without_untrusted` with what the user set."""
    return lambda tree, origin: without_untrusted(tree, origin, given)


def without_untrusted(tree: dict, origin: str, given: Mapping[str, Any]) -> dict:
    """`tree`, a config that is data (read from `origin`), with each setting of it that names code or a host replaced
    by what the user set for it or a section above it in `given` (dotted key -> value: `--set`, `--reward`); a
    ConfigError in one line naming the settings nothing the user set replaces."""
    tree = copy.deepcopy(tree)
    refused = []
    for key, value, marker in trust_settings(tree):
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


def refusal(origin: str, refused: list[tuple[str, Any, NeedsTrust]]) -> str:
    """The one line that refuses the settings of a config that is data that name code or a host. The values are the
    file's: a judge's `api_key_env` is a variable's name, and nothing reads its value before this refusal."""
    by_key: dict[str, tuple[Any, list[str]]] = {}  # a setting that names both code and a host is quoted once
    for key, value, marker in refused:
        by_key.setdefault(key, (value, []))[1].append(marker.what)
    named = "; ".join(f"{key} = {bounded(json.dumps(value, default=str))} names {' and '.join(whats)}"
                      for key, (value, whats) in by_key.items())
    kept = " and ".join(dict.fromkeys(marker.refused for _, _, marker in refused))  # each once, in order
    return (f"{origin} is data, not a config you named on the command line (a run directory's saved config, which "
            f"anyone may have written), so {kept}: {named}. Pass {TRUST_FLAG} "
            "(EvalRequest(trust_config_code=True) in Python) if you trust whoever wrote it, or set the setting yourself "
            "(--set KEY=VALUE)")
