"""YAML + dotted overrides -> validated `Config`, with errors that name the key and suggest fixes."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from oxrl.config.rl_presets import preset_values
from oxrl.config.schema import Config, section_in



MAX_CONFIG_BYTES = 1 << 20  # a config is a page of settings; a larger file is not one
# Nodes in the document once every alias is expanded: a config has hundreds. Aliases are shared, not copied,
# when PyYAML builds the tree, but everything that walks it (validation, error messages) walks every expansion,
# so a few hundred bytes of nested aliases ("billion laughs") would hold the CLI for minutes and gigabytes.
MAX_EXPANDED_NODES = 100_000


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the config."""


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing what it would accept silently: a key given twice in one mapping (the last
    would win: `lr: 1.0e-5` then `lr: 1.0e+3` trains at 1000) and aliases that expand past MAX_EXPANDED_NODES."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_line: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` then an explicit key is how YAML overrides a merged value
            key = (key_node.tag, key_node.value)
            line = key_node.start_mark.line + 1
            if key in first_line:
                from oxrl.config.explain import bounded

                raise yaml.constructor.ConstructorError(
                    None, None, f"key `{bounded(key_node.value)}` appears twice, on line {first_line[key]} and line "
                    f"{line}; YAML would keep the last silently: keep one", key_node.start_mark)
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None and _expanded_size(node, {}) > MAX_EXPANDED_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"the document expands to more than {MAX_EXPANDED_NODES:,} values once its aliases are "
                "expanded (nested `*alias` references); a config needs no such thing", node.start_mark)
        return node


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many nodes `node` stands for with every alias expanded (each shared node counted once per use)."""
    if id(node) not in sizes:
        sizes[id(node)] = MAX_EXPANDED_NODES + 1  # a node reached again while counting itself: a cycle
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(_expanded_size(child, sizes) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(_expanded_size(key, sizes) + _expanded_size(value, sizes) for key, value in node.value)
        else:
            total = 1
        sizes[id(node)] = total
    return sizes[id(node)]


def load_yaml(text: str) -> Any:
    """`text` parsed as YAML by ConfigLoader (yaml.YAMLError on duplicate keys or an alias bomb)."""
    return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 - a SafeLoader subclass


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
        return key.split("."), load_yaml(raw)
    except (yaml.YAMLError, RecursionError) as error:
        from oxrl.config.explain import yaml_error

        raise ConfigError(yaml_error(error, raw, f"the value of override {text!r}")) from error


def read_yaml_file(file: Path) -> Any:
    """The YAML document in `file` (a config, a saved run's config.yaml, a registry file), read as ConfigLoader
    reads it; a ConfigError naming the file, line and column if it is not valid YAML, and naming the file if it is
    not a regular file of at most MAX_CONFIG_BYTES (a FIFO would wait forever, a device never end)."""
    from oxrl.files import InputFileError, read_bounded

    try:
        text = read_bounded(file, MAX_CONFIG_BYTES, "a config file").decode("utf-8")
    except InputFileError as error:
        raise ConfigError(f"{file}: {error}: is it a YAML config?") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{file}: not UTF-8 text (byte {error.start}): is it a YAML config?") from error
    try:
        return load_yaml(text)
    except (yaml.YAMLError, RecursionError) as error:
        from oxrl.config.explain import yaml_error

        raise ConfigError(yaml_error(error, text, str(file))) from error


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


def model_name(cfg: Config) -> str:
    """The model as given, a local folder or file by its own name (not its whole path); `+ LoRA` when adapted."""
    name = cfg.model.name_or_path
    if Path(name).exists():
        name = Path(name).name
    return f"{name} + LoRA" if cfg.lora.enabled else name


REQUIRED, NOT_SET = "(required)", "(not set)"


def non_default_settings(cfg: Config) -> list[tuple[str, Any, Any]]:
    """(dotted key, value, default) for every key whose value differs from its default, sorted by key. Required
    keys (no default) are always listed, their default shown as REQUIRED. An RL algorithm's preset values (the
    `rl` keys it fills, e.g. ppo's `advantage: gae`) are its defaults: only a value the user changed is listed."""
    changed = flatten(cfg.model_dump(mode="json", exclude_defaults=True))
    preset = preset_settings(cfg.algorithm.name)
    listed = [(key, value, preset[key] if key in preset else schema_default(key))
              for key, value in sorted(changed.items())]
    return [(key, value, default) for key, value, default in listed if value != default]


def preset_settings(algorithm: str) -> dict[str, Any]:
    """The `rl` keys an RL algorithm's preset fills, with their values (empty for other algorithms)."""
    return {f"rl.{key}": value for key, value in preset_values(algorithm).items()}


def schema_default(key: str) -> Any:
    """The schema's default for a dotted key: REQUIRED when it has none. Below a field that is not a section
    (a dict such as `rl.task_config`, or a section whose default is None), the default's own entry: NOT_SET
    when it has none, the None of an absent section."""
    model, parts = Config, key.split(".")
    for depth, part in enumerate(parts):
        field = model.model_fields[part]
        default = REQUIRED if field.is_required() else to_jsonable_python(field.get_default(call_default_factory=True))
        inner = section_in(field.annotation)
        if inner is None or default is None or isinstance(default, list):
            for rest in parts[depth + 1 :]:
                if not isinstance(default, dict):
                    break
                default = default.get(rest, NOT_SET)
            return default
        model = inner
    return default


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = (), base: dict | None = None,
                screen: Callable[[dict, str], dict] | None = None) -> Config:
    """Read a YAML file (or start from `base`, which is left as it was), apply `a.b=c` overrides, validate.
    `screen(tree, file)`: what the file's tree becomes first, before validation imports anything (a config that is
    data, not the user's: oxrl/config/trust.py)."""
    tree: dict = copy.deepcopy(base) if base else {}  # an override sets a key inside a section: not in the caller's
    source = "overrides"
    if path is not None:
        source = str(path)
        file = Path(path)
        if not file.exists():
            raise ConfigError(f"config file not found: {file}")
        loaded = read_yaml_file(file)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{file}: the top level must be a mapping of sections, got {type(loaded).__name__}")
        loaded = find_beside(loaded, file.parent)
        tree.update(screen(loaded, source) if screen is not None else loaded)
    for override in overrides:
        keys, value = parse_override(override)
        apply_override(tree, keys, value)
    try:
        return Config.model_validate(tree)
    except ValidationError as error:
        from oxrl.config.explain import describe_errors

        raise ConfigError(describe_errors(error, source)) from None


def find_beside(tree: dict, folder: Path) -> dict:
    """The file's tree with each relative path it names (data files, `rl.env.path`, a reward's `file.py:function`,
    `vla.stats`, a `vla.env` `file.py:factory`, an extension file)
    that is not found from the working directory but is found beside the config file replaced by that one, made
    absolute: a config and its data travel together (the examples run from any directory, outside a checkout too),
    and a path that exists from the working directory means what it always meant."""

    def beside(text: Any) -> Any:
        if not isinstance(text, str) or not text or text.startswith("bundled:") or Path(text).is_absolute():
            return text
        if Path(text).exists() or not (folder / text).exists():
            return text
        return str((folder / text).resolve())

    tree = copy.deepcopy(tree)  # (a malformed section is left as it is, for validation to name)
    data = tree.get("data") if isinstance(tree.get("data"), dict) else {}
    rl = tree.get("rl") if isinstance(tree.get("rl"), dict) else {}
    specs = [spec for split in ("train", "validation") if isinstance(data.get(split), list) for spec in data[split]]
    for spec in specs:
        if isinstance(spec, dict) and "path" in spec:
            spec["path"] = beside(spec["path"])
    if isinstance(rl.get("env"), dict) and "path" in rl["env"]:
        rl["env"]["path"] = beside(rl["env"]["path"])
    for reward in rl.get("rewards") if isinstance(rl.get("rewards"), list) else []:
        if isinstance(reward, dict) and isinstance(reward.get("name"), str) and ".py:" in reward["name"]:
            file, function = reward["name"].rsplit(":", 1)
            reward["name"] = f"{beside(file)}:{function}"
    vla = tree.get("vla") if isinstance(tree.get("vla"), dict) else {}
    if "stats" in vla:
        vla["stats"] = beside(vla["stats"])
    if isinstance(vla.get("env"), str) and ".py:" in vla["env"]:
        file, factory = vla["env"].rsplit(":", 1)
        vla["env"] = f"{beside(file)}:{factory}"
    if isinstance(tree.get("extensions"), list):
        tree["extensions"] = [beside(reference) if str(reference).endswith(".py") else reference
                              for reference in tree["extensions"]]
    return tree


def saved_form(config: Config) -> dict[str, Any]:
    """The config as `config.yaml` holds it: every key, except that an `rl` value equal to what the algorithm's
    preset fills is left unset (null), as the user left it. Loading it resolves the same values again, and the
    file run with another `algorithm.name` gets that algorithm's preset, not the first one's."""
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
