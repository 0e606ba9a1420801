"""A model folder's weights, checked before transformers reads them.

oxRL loads safetensors only (a pickle can run code). A folder whose weights are pickles, a truncated or damaged
safetensors file (a header whose offsets or shapes do not match its data), or an index naming a shard the folder
lacks would otherwise end in a traceback from deep inside the loader; here each is one line naming the file and
what to do. The headers are read (memory-mapped), never the tensors, so the check costs milliseconds.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from oxrl.files import InputFileError, check_regular

logger = logging.getLogger(__name__)

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
ADAPTER_SAFETENSORS = "adapter_model.safetensors"  # a peft adapter folder's weights
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_INDEX_BYTES = 64 << 20  # an index maps tensor names to shards: a few hundred kB for the largest models

REDOWNLOAD = "download or save it again"


class ModelWeightsError(ValueError):
    """Weights that cannot be loaded; the message names the file and what to do."""


def check_weights(folder: Path) -> None:
    """ModelWeightsError unless `folder`'s safetensors weights are all there and their headers are sound."""
    if (folder / SAFETENSORS_INDEX).exists():
        files = _index_shards(folder / SAFETENSORS_INDEX)
    elif (folder / SAFETENSORS).exists():
        files = [folder / SAFETENSORS]
    elif (folder / ADAPTER_SAFETENSORS).exists():
        files = [folder / ADAPTER_SAFETENSORS]
    else:
        pickles = sorted(path.name for path in folder.iterdir() if path.name.endswith(PICKLE_SUFFIXES + (".bin.index.json",)))
        if pickles:
            raise ModelWeightsError(
                f"{folder}: its weights are pickle files only ({', '.join(pickles)}), which oxRL does not load (unpickling "
                "can run code): convert them to safetensors where you trust them (load the model and save_pretrained it, "
                "which writes model.safetensors) or use the model's safetensors release")
        raise ModelWeightsError(f"{folder}: holds no weights ({SAFETENSORS} or {SAFETENSORS_INDEX} and its shards)")
    for file in files:
        _check_safetensors(file)


def _index_shards(index: Path) -> list[Path]:
    """The shard files `index` names, each a file of its folder."""
    try:
        size = check_regular(index)
        if size > MAX_INDEX_BYTES:
            raise InputFileError(f"{size:,} bytes, more than an index's {MAX_INDEX_BYTES:,}")
        shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        if not all(isinstance(shard, str) for shard in shards):
            raise TypeError("a shard name is not a string")
    except (InputFileError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError, TypeError,
            AttributeError) as error:
        raise ModelWeightsError(f"{index}: not a safetensors index ({type(error).__name__}: {error}): "
                                f"{REDOWNLOAD}") from None
    for shard in sorted(shards):
        if Path(shard).name != shard or shard in ("", ".", ".."):
            raise ModelWeightsError(f"{index}: names {shard!r} as a shard, which is not a file name of its folder: "
                                    f"{REDOWNLOAD}")
        if not (index.parent / shard).exists():
            raise ModelWeightsError(f"{index}: names the shard {shard}, which {index.parent} lacks (an incomplete "
                                    f"download?): {REDOWNLOAD}")
    return [index.parent / shard for shard in sorted(shards)]


def _check_safetensors(file: Path) -> None:
    from safetensors import SafetensorError, safe_open

    try:
        check_regular(file)
        with safe_open(file, framework="pt"):  # parses and checks the header: offsets, shapes, dtypes, coverage
            pass
    except InputFileError as error:
        raise ModelWeightsError(f"{file}: {error}") from None
    except (SafetensorError, OSError) as error:
        raise ModelWeightsError(f"{file}: a damaged safetensors file, truncated or with a header that does not match "
                                f"its data ({error}): {REDOWNLOAD}") from None


def refuse_mismatched(loading_info: dict, where: str) -> None:
    """ModelWeightsError when transformers found saved tensors of other shapes than the config gives (a header that
    lies consistently, or weights of another model): the loader would re-initialise them at random."""
    mismatched = sorted(loading_info.get("mismatched_keys") or (), key=str)
    if mismatched:
        shown = "; ".join(f"{key} saved as {tuple(saved)}, {tuple(expected)} by config.json"
                          for key, saved, expected in mismatched[:3])
        more = f" and {len(mismatched) - 3} more" if len(mismatched) > 3 else ""
        raise ModelWeightsError(f"{where}: weights of other shapes than its config gives ({shown}{more}): the weights "
                                f"and config.json are not of one model, or the file was altered: {REDOWNLOAD}")


def warn_ignored_auto_map(config, where: str) -> None:
    """Say that the custom classes `config.auto_map` names were not used: trust_remote_code is off, and a
    built-in `model_type` let transformers load its own class instead, silently."""
    auto_map = getattr(config, "auto_map", None) or {}
    if auto_map:
        classes = ", ".join(f"{name}: {target}" for name, target in sorted(auto_map.items(), key=str))
        classes = classes if len(classes) <= 300 else classes[:300] + "..."
        logger.warning("%s: config.json's auto_map names custom code (%s), which was not run because "
                       "model.trust_remote_code is off: the built-in `%s` classes load instead. If the model needs its "
                       "own code, set model.trust_remote_code: true (it runs that code: only for a source you trust)",
                       where, classes, config.model_type)
