"""The model card, `README.md`, written into every model folder a run saves (`final/` and each checkpoint), offline.

The Hub reads its YAML front matter (base model, library, tags, datasets, license) and shows the rest: the method
with its paper, the data, the results at save time, the run's config (redacted: oxrl/logging/redaction.py) and how
to load the folder. Everything comes from the config and the metrics the run already has; nothing is fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from oxrl.config.schema import Config

# A Hub id, `owner/name` (not a local path): the only kind of base model or dataset the Hub can link to.
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
_ARXIV = re.compile(r"(?:arXiv:?\s*)?(\d{4}\.\d{4,5})")


def paper_of(algorithm: str) -> str | None:
    """The arXiv id of `algorithm`'s paper, as its implementation cites it (the first id in its loss function's
    docstring, or in its row of the RL presets' table); None when it cites none (sft, cpt, rm)."""
    from oxrl.config import rl_presets
    from oxrl.config.names import DISTILLATION, RL_ALGORITHMS

    if algorithm in RL_ALGORITHMS:
        text = next((line for line in rl_presets.__doc__.splitlines() if line.split()[:1] == [algorithm]), "")
    elif algorithm == "kto":
        from oxrl.algorithms.kto import kto_loss

        text = kto_loss.__doc__
    elif algorithm in DISTILLATION:
        from oxrl.algorithms.distill import DISTILL_LOSSES, DISTILL_OBJECTIVES

        text = DISTILL_LOSSES[DISTILL_OBJECTIVES[algorithm]].__doc__
    else:
        from oxrl.algorithms.preference import PREFERENCE_LOSSES

        text = PREFERENCE_LOSSES[algorithm].loss.__doc__ if algorithm in PREFERENCE_LOSSES else None
    found = _ARXIV.search(text or "")
    return found.group(1) if found else None


def _data_files(cfg: Config) -> list:
    """The training datasets' specs: none for an RL run on a generated task (`rl.task`), which reads no files."""
    from oxrl.config.rl_presets import is_rl

    if cfg.vla is not None:  # a simulator's episodes: the run reads neither rl.task nor data.train
        return []
    return [] if is_rl(cfg.algorithm.name) and cfg.rl.task is not None else cfg.data.train


def _dataset_names(cfg: Config) -> list[str]:
    """Hub dataset ids as they are, files by their own name (`bundled:chat.jsonl` -> `chat.jsonl`)."""
    names = []
    for spec in _data_files(cfg):
        path = spec.path.removeprefix("bundled:")
        names.append(path if _HUB_ID.fullmatch(path) and not Path(path).exists() else Path(path).name)
    return list(dict.fromkeys(names))


def _base_model(cfg: Config) -> str | None:
    name = cfg.model.name_or_path
    return name if _HUB_ID.fullmatch(name) and not Path(name).exists() else None


def _license(cfg: Config) -> str | None:
    """The license a local base model's own card declares (nothing is fetched for a Hub id)."""
    card = Path(cfg.model.name_or_path) / "README.md"
    if not card.is_file():
        return None
    parts = card.read_text(errors="replace").split("---", 2)
    try:
        meta = yaml.safe_load(parts[1]) if len(parts) == 3 and not parts[0].strip() else None
    except yaml.YAMLError:  # a card without valid front matter declares no license
        return None
    return meta.get("license") if isinstance(meta, dict) and isinstance(meta.get("license"), str) else None


def model_card(cfg: Config, metrics: dict[str, float], step: int | None = None) -> str:
    """The card's text: front matter, method, data, results (`metrics`, those of `step` when given), config, usage."""
    from oxrl.config.load import saved_form
    from oxrl.logging.redaction import redact

    algorithm, base = cfg.algorithm.name, _base_model(cfg)
    meta = {"base_model": base, "library_name": "transformers", "license": _license(cfg),
            "tags": ["oxrl", algorithm] + (["lora"] if cfg.lora.enabled else []), "datasets": _dataset_names(cfg)}
    meta = {key: value for key, value in meta.items() if value}
    paper = paper_of(algorithm)
    method = f"**{algorithm}**" + (f" ([arXiv:{paper}](https://arxiv.org/abs/{paper}))" if paper else "")
    data = [f"- `{spec.path}` (format `{spec.format}`, split `{spec.split}`)" for spec in _data_files(cfg)]
    if not data and cfg.vla is None and cfg.rl.task is not None:
        data.append(f"- the generated task `{cfg.rl.task}` (oxRL's `rl.task`)")
    when = f"at step {step}" if step is not None else "at the end of training"
    results = [f"| {key} | {value:.6g} |" for key, value in metrics.items() if isinstance(value, (int, float))]
    # Only the final folder is pushed (step None); a checkpoint loads from where it is.
    target = cfg.run.hub_model_id if cfg.run.push_to_hub and step is None else "path/to/this/folder"
    adapter = cfg.lora.enabled and cfg.lora.save_mode == "adapter"
    model_class = "AutoPeftModelForCausalLM" if adapter else "AutoModelForCausalLM"
    load = (("from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer" if adapter else
             "from transformers import AutoModelForCausalLM, AutoTokenizer")
            + f'\n\nmodel = {model_class}.from_pretrained("{target}")'
            + f'\ntokenizer = AutoTokenizer.from_pretrained("{target}")')
    config_text = redact(yaml.safe_dump(saved_form(cfg), sort_keys=False))
    sections = [
        f"---\n{yaml.safe_dump(meta, sort_keys=False)}---",
        f"# {cfg.run.name or algorithm}",
        f"{'`' + base + '`' if base else 'A local model'} trained with {method} by oxRL"
        + (" (LoRA adapters)." if cfg.lora.enabled else "."),
        "## Data\n\n" + ("\n".join(data) or "- (none recorded)"),
        f"## Results\n\nThe last logged metrics {when}:\n\n| metric | value |\n|---|---|\n" + "\n".join(results)
        if results else f"## Results\n\nNo metrics were logged {when}.",
        f"## Use it\n\n```python\n{load}\n```",
        f"## Training config\n\n```yaml\n{config_text}```",
    ]
    return "\n\n".join(sections) + "\n"


def write_model_card(folder: Path, cfg: Config, metrics: dict[str, float], step: int | None = None) -> Path:
    path = Path(folder) / "README.md"
    path.write_text(model_card(cfg, metrics, step))
    return path
