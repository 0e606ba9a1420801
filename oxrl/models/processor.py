"""A vision-language model's processor: its image processor and the run's own tokenizer, loaded together.

`oxrl.models.load.load_processor` asks for it only for a vision-language model; a text model has none."""

from __future__ import annotations

from pathlib import Path

from oxrl.config.schema import ModelConfig
from oxrl.dependencies import installed
from oxrl.models.source import ModelNotFoundError, from_pretrained_or_explain, resolve_source

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
_TORCHVISION_HINT = ("; video processors (Qwen2-VL's among them) need torchvision: install the build that matches your "
                     "torch, e.g. `pip install torchvision --index-url https://download.pytorch.org/whl/cpu` on a CPU")


class ProcessorLoadError(ValueError):
    """A vision-language model's processor cannot be loaded; one line saying why."""


def _first_sentence(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _needs_torchvision(error: BaseException) -> bool:
    text = str(error).lower()
    return not installed("torchvision") and ("torchvision" in text or "video processor" in text)


def vision_language_processor(cfg: ModelConfig, tokenizer):
    """The processor of the vision-language model `cfg` names (its image processor from the model's own location),
    wrapping `tokenizer`, with `cfg.chat_template` when set; a ProcessorLoadError saying why when it cannot be
    built."""
    from transformers import AutoProcessor, ProcessorMixin

    source = resolve_source(cfg.name_or_path)
    try:
        processor = from_pretrained_or_explain(AutoProcessor, source, "processor", tokenizer=tokenizer,
                                               trust_remote_code=cfg.trust_remote_code, revision=cfg.revision)
    except (ImportError, OSError) as error:
        # A processor whose parts cannot be built here: most often a video processor (Qwen2-VL's), which needs
        # torchvision even for image-only training. transformers' message is several lines; one is enough.
        if isinstance(error, ModelNotFoundError):
            raise
        raise ProcessorLoadError(f"{cfg.name_or_path}: its processor cannot be loaded: {_first_sentence(error)}"
                                 f"{_TORCHVISION_HINT if _needs_torchvision(error) else ''}") from error
    if not isinstance(processor, ProcessorMixin):  # AutoProcessor falls back to a tokenizer or an image processor
        present = [name for name in PROCESSOR_FILES if (Path(source.path) / name).is_file()]
        raise ProcessorLoadError(
            f"{cfg.name_or_path} is a vision-language model but AutoProcessor gave a {type(processor).__name__}, not a "
            "processor: " + (f"{', '.join(present)} is there, but the processor it names could not be built (a missing "
                             f"package?{_TORCHVISION_HINT if not installed('torchvision') else ''})" if present else
                             f"the model holds none of {', '.join(PROCESSOR_FILES)}"))
    if cfg.chat_template is not None:
        processor.chat_template = cfg.chat_template
    return processor
