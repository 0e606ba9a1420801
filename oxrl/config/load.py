"""YAML + dotted overrides -> validated `Config`, with errors that name the key and suggest fixes."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from oxrl.config.schema import Config


# Names users bring from other libraries, mapped to ours (difflib cannot guess these).
SYNONYMS = {
    "learning_rate": "lr",
    "batch_size": "global_batch_size",
    "per_device_train_batch_size": "micro_batch_size_per_device",
    "num_train_epochs": "epochs",
    "model_name_or_path": "name_or_path",
    "lora_r": "rank",
    "r": "rank",
    "lora_alpha": "alpha",
    "warmup": "warmup_steps",
}


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the config."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """`train.optim.lr=1e-6` -> (['train', 'optim', 'lr'], 1e-6). Values are parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like `section.key=value`")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key part")
    if raw == "":
        return key.split("."), ""
    try:
        return key.split("."), yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise ConfigError(_describe_yaml_error(error, raw, f"the value of override {text!r}")) from error


def _describe_yaml_error(error: yaml.YAMLError, text: str, where: str) -> str:
    """`where` (a file, an override), the 1-based line and column, what PyYAML found wrong, the line marked.

    PyYAML's own message names the source `"<unicode string>"` and counts lines from 0.
    """
    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return f"{where}: not valid YAML: {error}"
    mark = error.problem_mark
    message = f"{where}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {error.problem}"
    if error.context and error.context_mark is not None:
        start = error.context_mark
        message += f" ({error.context} that starts at line {start.line + 1}, column {start.column + 1})"
    lines = text.splitlines()
    if mark.line < len(lines):
        message += f"\n    {lines[mark.line]}\n    {' ' * mark.column}^"
    return message


def _read_yaml(file: Path) -> Any:
    """The YAML document in `file`; a ConfigError naming the file, line and column if it is not valid YAML."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{file}: not UTF-8 text (byte {error.start}): is it a YAML config?") from error
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(_describe_yaml_error(error, text, str(file))) from error


def apply_override(tree: dict, keys: list[str], value: Any) -> None:
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set `{'.'.join(keys)}`: `{key}` is not a section")
        node = child
    node[keys[-1]] = value


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"train": {"optim": {"lr": 1e-6}}} -> {"train.optim.lr": 1e-6}; an empty section stays a leaf."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _fields_at(location: tuple, model: type[BaseModel] = Config) -> list[str]:
    """The valid field names of the section at `location` (for suggestions)."""
    current: Any = model
    for part in location:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return []
        annotation = current.model_fields[part].annotation
        current = _model_in(annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside `Section`, `list[Section]` or `Section | None`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def describe_errors(error: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for item in error.errors():
        location = tuple(item["loc"])
        dotted = ".".join(str(p) for p in location)
        kind = item["type"]
        if kind == "extra_forbidden":
            name = str(location[-1])
            valid = _fields_at(location[:-1])
            close = [SYNONYMS[name]] if SYNONYMS.get(name) in valid else difflib.get_close_matches(name, valid, n=1)
            hint = f" Did you mean `{'.'.join(str(p) for p in location[:-1] + (close[0],))}`?" if close else ""
            lines.append(f"  - unknown key `{dotted}`.{hint} Valid keys here: {', '.join(valid)}")
        elif kind == "missing":
            lines.append(f"  - missing required key `{dotted}`")
        elif isinstance(item.get("input"), dict):  # a check across a section's keys: the message names them
            where = f"in `{dotted}`: " if dotted else ""
            lines.append(f"  - {where}{item['msg'].removeprefix('Value error, ')}")
        else:
            value = item.get("input")
            # A field validator's own message (e.g. an unknown algorithm.name) arrives prefixed "Value error, ".
            lines.append(f"  - `{dotted}` = {value!r}: {item['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = (), base: dict | None = None) -> Config:
    """Read a YAML file (or start from `base`), apply `a.b=c` overrides, validate."""
    tree: dict = dict(base or {})
    source = "overrides"
    if path is not None:
        source = str(path)
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file not found: {file}")
        loaded = _read_yaml(file)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{file}: the top level must be a mapping of sections, got {type(loaded).__name__}")
        tree.update(loaded)
    for override in overrides:
        keys, value = parse_override(override)
        apply_override(tree, keys, value)
    try:
        return Config.model_validate(tree)
    except ValidationError as error:
        raise ConfigError(describe_errors(error, source)) from None


def saved_form(config: Config) -> dict[str, Any]:
    """The config as `config.yaml` holds it: every key, except that an `rl` value equal to what the algorithm's
    preset fills is left unset (null), as the user left it. Loading it resolves the same values again, and the
    file run with another `algorithm.name` gets that algorithm's preset, not the first one's."""
    from oxrl.config.rl_presets import preset_values

    data = config.model_dump(mode="json")
    for key, value in preset_values(config.algorithm.name).items():
        if data["rl"][key] == value:
            data["rl"][key] = None
    return data


def save_config(config: Config, path: str | os.PathLike) -> None:
    """Write the config as YAML (`saved_form`); a failed write (e.g. a full disk) leaves the previous file intact."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(yaml.safe_dump(saved_form(config), sort_keys=False))
        partial.replace(path)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
