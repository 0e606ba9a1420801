"""The model registry: oxrl/models/registry.yaml (and entries a user adds with `--registry FILE`) as data."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from oxrl.config.load import ConfigError, read_yaml_file

REGISTRY_FILE = Path(__file__).with_name("registry.yaml")
MODALITIES = ("text", "vision", "audio")


class RegistryError(ValueError):
    pass


class RegistryEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Hub id (or a local folder, for an onboarded model).")
    family: str = Field(description="transformers model_type.")
    params_b: float = Field(gt=0, description="Parameters, in billions.")
    context: int = Field(gt=0, description="Context length in tokens.")
    modality: Literal[MODALITIES] = "text"
    tested: bool = Field(False, description="The family is in oxRL's architecture matrix (tests/integration/test_architectures.py).")
    chat_template: str = Field("", description="What the chat template does that a trainer must know.")
    lora_targets: list[str] = Field(default_factory=list, description="Default LoRA target modules.")
    note: str = ""
    unsupported: str | None = Field(None, description="Why oxRL has no recipe for it (or cannot train it yet); null when it has.")
    config: dict[str, Any] | None = Field(None, description="config.json keys that fix the model's shape.")
    onboarded: dict[str, Any] | None = Field(None, description="What `oxrl onboard` checked, and when.")

    def transformers_config(self):
        """The model's transformers config, built from `config` with no download."""
        from transformers import AutoConfig

        if self.config is None:
            raise RegistryError(f"{self.name}: the registry holds no shape for it ({self.unsupported or 'no config'})")
        keys = dict(self.config)
        return AutoConfig.for_model(keys.pop("model_type"), **keys)


def read_registry_file(path: Path) -> list[RegistryEntry]:
    try:
        document = read_yaml_file(path)  # a key given twice, an alias bomb, a FIFO: refused, naming the file
    except ConfigError as error:
        raise RegistryError(str(error)) from error
    if not isinstance(document, dict) or not isinstance(document.get("models"), list):
        raise RegistryError(f"{path}: expected a mapping with a `models:` list of entries")
    entries = []
    for index, raw in enumerate(document["models"], start=1):
        try:
            entries.append(RegistryEntry.model_validate(raw))
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors())
            name = raw.get("name", "?") if isinstance(raw, dict) else "?"
            raise RegistryError(f"{path}: models entry {index} ({name}): {problems}") from error
    return entries


def load_registry(extra_files: list[str | Path] = ()) -> list[RegistryEntry]:
    """oxRL's registry, then the user's files; a user's entry replaces oxRL's of the same name."""
    entries = {entry.name.lower(): entry for entry in read_registry_file(REGISTRY_FILE)}
    for path in extra_files:
        entries.update({entry.name.lower(): entry for entry in read_registry_file(Path(path))})
    return list(entries.values())


def find_model(name: str, entries: list[RegistryEntry]) -> RegistryEntry | None:
    """The entry for a hub id, matched without case, or by its last part (`Qwen2.5-7B-Instruct`)."""
    wanted = name.lower().rstrip("/")
    for entry in entries:
        if entry.name.lower() == wanted or entry.name.lower().rsplit("/", 1)[-1] == wanted:
            return entry
    return None


def require_model(name: str, entries: list[RegistryEntry]) -> RegistryEntry:
    entry = find_model(name, entries)
    if entry is None:
        names = [e.name for e in entries]
        close = difflib.get_close_matches(name, names + [n.rsplit("/", 1)[-1] for n in names], n=1, cutoff=0.5)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        raise RegistryError(f"`{name}` is not in the model registry.{hint} `oxrl models` lists it; "
                            f"`oxrl onboard {name}` checks a new model and writes an entry to add with --registry")
    return entry
