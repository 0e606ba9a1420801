"""`oxrl models`: the registry as a table, with the layout a fine-tune needs on common GPUs."""

from __future__ import annotations

from oxrl.config.presets import task_preset
from oxrl.models.fit import fits
from oxrl.models.hardware import parse_devices
from oxrl.models.recipe import layouts
from oxrl.models.registry import RegistryEntry, load_registry
from oxrl.models.shape import ModelShape

HARDWARE = ("1x24GB", "1x80GB", "8x80GB")
CATALOG_TASK = "chat"  # SFT: the fine-tune every model gets first


def fit_label(entry: RegistryEntry, shape: ModelShape, spec: str) -> str:
    devices = parse_devices(spec)
    tree = task_preset(CATALOG_TASK)
    tree["model"] = {"name_or_path": entry.name}
    if devices.count > 1:
        tree["strategy"] = {"name": "fsdp2"}
    for _, cfg, estimate in layouts(tree, shape, devices, entry.lora_targets):
        if fits(estimate, devices):
            label = "LoRA" if cfg.lora.enabled else "full"
            return label + ("+ckpt" if cfg.model.gradient_checkpointing else "")
    return "no"


def catalog_row(entry: RegistryEntry) -> str:
    """The table's row for one model (docs/models.md quotes some of them)."""
    cells = [entry.name, entry.family, f"{entry.params_b:g}B", str(entry.context), "yes" if entry.tested else "no"]
    if entry.unsupported or entry.config is None:
        cells += ["no recipe"] + [""] * (len(HARDWARE) - 1)
    else:
        shape = ModelShape.from_config(entry.transformers_config())
        cells += [fit_label(entry, shape, spec) for spec in HARDWARE]
    return "| " + " | ".join(cells) + " |"


def format_catalog(registry_files: list[str] = ()) -> str:
    entries = load_registry(registry_files)
    head, notes = catalog_frame(entries)
    return "\n".join(head + [catalog_row(entry) for entry in entries] + notes) + "\n"


def catalog_frame(entries: list[RegistryEntry]) -> tuple[list[str], list[str]]:
    """The table's header lines and the notes below it (cheap: no memory estimate)."""
    header = ["model", "family", "params", "context", "matrix", *(f"SFT {spec}" for spec in HARDWARE)]
    notes = [
        "",
        f"SFT columns: the first layout that fits, from the memory estimate (oxrl/models/memory.py) for the `{CATALOG_TASK}` "
        "task's micro-batch (halved until it fits), bf16: full = full fine-tune, +ckpt = activation checkpointing, "
        "no = does not fit. 8x80GB shards with FSDP2, full fine-tunes only (LoRA trains sharded too, but is not picked there yet).",
        "matrix: the family is in oxRL's architecture matrix (tests/integration/test_architectures.py).",
        "No recipe: " + "; ".join(f"{e.name}: {e.unsupported}" for e in entries if e.unsupported),
        "A ready config: oxrl recipe MODEL --task math --gpus 8x80GB.  A new model: oxrl onboard MODEL.",
    ]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)], notes
