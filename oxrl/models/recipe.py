"""`oxrl recipe MODEL --task T --gpus 8x80GB`: a ready config for a model, a task and the hardware.

It starts from the task's preset (oxrl/config/presets.py), picks the strategy for the device count, and then
the first of these that the memory estimate says fits: a full fine-tune, the same with activation
checkpointing, LoRA, LoRA with checkpointing; each first with the preset's micro-batch, then with halves of
it (the global batch stays, accumulated over more micro-batches). The estimate assumes every sequence is as
long as `data.max_length`: the worst case. The YAML it returns loads with `oxrl train` as it is.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import yaml

from oxrl.config.load import apply_override, load_config
from oxrl.config.presets import task_preset
from oxrl.config.rl_presets import is_rl
from oxrl.config.schema import mesh_refusal
from oxrl.models.fit import HEADROOM, describe_fit, fits, model_shape, training_plan
from oxrl.models.source import BUNDLED
from oxrl.models.hardware import Devices
from oxrl.models.memory import MemoryEstimate, estimate_memory, gib
from oxrl.models.registry import RegistryError, find_model, load_registry
from oxrl.models.shape import ModelShape

# Tried in this order; the first that fits is the recipe.
LAYOUTS = ((False, False), (False, True), (True, False), (True, True))  # (LoRA, activation checkpointing)
# Then, on several devices, a full fine-tune with checkpointing on a mesh (tp, cp): fewest ranks splitting one model
# first, tensor parallel before context parallel (a long row is what cp is for, and the estimate's rows are all
# data.max_length long), tp at most 8 (the GPUs of one node: it communicates at every layer).
MESHES = ((2, 1), (1, 2), (4, 1), (2, 2), (8, 1), (4, 2), (1, 4), (8, 2), (2, 4), (4, 4), (8, 4), (1, 8), (2, 8), (8, 8))
VLLM_DEFAULT_SHARE = 0.5


class DoesNotFitError(ValueError):
    pass


@dataclass
class Recipe:
    tree: dict
    estimate: MemoryEstimate
    notes: list[str]

    def yaml(self) -> str:
        header = "".join(f"# {line}\n" for line in self.notes)
        return header + yaml.safe_dump(self.tree, sort_keys=False)


def recipe(model: str, task: str, devices: Devices, algorithm: str | None = None,
           registry_files: list[str] = ()) -> Recipe:
    entry = find_model(model, load_registry(registry_files))
    if entry is not None and entry.unsupported:
        raise RegistryError(f"{entry.name}: {entry.unsupported}")
    tree = task_preset(task)
    # A short registry name becomes its hub id; a local folder or the bundled alias stays as it is.
    local = model in BUNDLED or Path(model).expanduser().exists()
    tree["model"] = {"name_or_path": entry.name if entry is not None and not local else model}
    if algorithm is not None:
        tree["algorithm"] = {"name": algorithm}
    if devices.count > 1:
        tree["strategy"] = {"name": "fsdp2"}
    shape = model_shape(load_config(None, base=tree).model, registry_files)
    for candidate, cfg, estimate in layouts(tree, shape, devices, entry.lora_targets if entry is not None else []):
        if fits(estimate, devices):
            return Recipe(candidate, estimate, _notes(cfg, entry, devices, estimate))
    raise DoesNotFitError(
        f"{model} on {task} does not fit {devices.describe()} even with LoRA, activation checkpointing and "
        f"micro-batch {cfg.train.micro_batch_size_per_device}: {describe_fit(estimate, devices)}. Use more or larger "
        "devices (--gpus), or shorten data.max_length")


def layouts(tree: dict, shape: ModelShape, devices: Devices, lora_targets: list[str] = ()):
    """(tree, config, estimate) of each layout of `tree` on `devices`, in the order tried (module docstring)."""
    micro_batch = load_config(None, base=tree).train.micro_batch_size_per_device
    for lora, checkpointing in LAYOUTS:
        if lora and devices.count > 1:
            continue  # LoRA trains sharded (tests/system/test_lora_sharded.py), but recipes do not pick it there yet
        for micro in _halvings(micro_batch):
            candidate = copy.deepcopy(tree)
            apply_override(candidate, ["train", "micro_batch_size_per_device"], micro)
            apply_override(candidate, ["model", "gradient_checkpointing"], checkpointing)
            if lora:
                apply_override(candidate, ["lora", "enabled"], True)
                if lora_targets:
                    apply_override(candidate, ["lora", "target_modules"], list(lora_targets))
            cfg = load_config(None, base=candidate)
            if is_rl(cfg.algorithm.name) and devices.kind == "cuda" and devices.count == 1:
                candidate, cfg = _with_vllm(candidate, cfg, shape, devices)
            yield candidate, cfg, estimate_memory(shape, training_plan(cfg, devices))
    yield from mesh_layouts(tree, shape, devices, micro_batch)


def mesh_layouts(tree: dict, shape: ModelShape, devices: Devices, micro_batch: int):
    """The full fine-tune with activation checkpointing on each mesh of `MESHES` that `devices` and the model allow."""
    if devices.count == 1 or mesh_refusal(load_config(None, base=tree)) is not None:
        return
    for tp, cp in MESHES:
        if devices.count % (tp * cp) or shape.tensor_parallel_refusal(tp) is not None:
            continue
        for micro in _halvings(micro_batch):
            candidate = copy.deepcopy(tree)
            apply_override(candidate, ["train", "micro_batch_size_per_device"], micro)
            apply_override(candidate, ["model", "gradient_checkpointing"], True)
            apply_override(candidate, ["strategy", "mesh"], {"tp": tp, "cp": cp})
            cfg = load_config(None, base=candidate)
            yield candidate, cfg, estimate_memory(shape, training_plan(cfg, devices))


def _halvings(micro: int) -> list[int]:
    sizes = [micro]
    while sizes[-1] % 2 == 0:
        sizes.append(sizes[-1] // 2)
    return sizes


def _with_vllm(tree: dict, cfg, shape, devices: Devices):
    """vLLM colocated on the one GPU, asleep while the trainer runs, its share what the trainer leaves.
    Too small a share for the weights plus a KV cache keeps the transformers engine."""
    without_vllm = estimate_memory(shape, training_plan(cfg, devices))
    share = min(VLLM_DEFAULT_SHARE, (HEADROOM * devices.total - without_vllm.static) / devices.total)
    if share * devices.total < 2 * shape.parameters * 2:  # bf16 weights, and as much again for the KV cache
        return tree, cfg
    tree = copy.deepcopy(tree)
    apply_override(tree, ["rl", "rollout", "engine"], "vllm")
    apply_override(tree, ["rl", "rollout", "vllm", "gpu_memory_utilization"], round(share - 0.005, 2))
    return tree, load_config(None, base=tree)


def _notes(cfg, entry, devices: Devices, estimate: MemoryEstimate) -> list[str]:
    mesh = cfg.strategy.mesh
    layout = ("LoRA" if cfg.lora.enabled else "full fine-tune") + (
        " + activation checkpointing" if cfg.model.gradient_checkpointing else "") + (
        f" on a mesh of tensor parallel {mesh.tp} x context parallel {mesh.cp}" if mesh.tp * mesh.cp > 1 else "")
    notes = [f"oxrl recipe: {cfg.model.name_or_path}, {cfg.algorithm.name}, on {devices.describe()}",
             f"layout: {layout}, strategy {cfg.strategy.name}, micro-batch {cfg.train.micro_batch_size_per_device} "
             f"x data.max_length {cfg.data.max_length} tokens (the estimate's worst case)" + (
                 f", rollouts on {cfg.rl.rollout.engine}" if is_rl(cfg.algorithm.name) else ""),
             f"memory estimate: {describe_fit(estimate, devices)}"]
    if entry is not None:
        notes.append(f"model: {entry.family}, {entry.params_b:g}B parameters, context {entry.context}")
        if entry.chat_template:
            notes.append(f"chat template: {entry.chat_template}")
        if entry.note:
            notes.append(f"note: {entry.note}")
    if devices.count > 1:
        notes.append(f"launch: torchrun --nproc-per-node {devices.count} -m oxrl train recipe.yaml")
        if is_rl(cfg.algorithm.name):
            notes.append("rollouts: vLLM does not run beside sharded training yet; the transformers engine generates")
    else:
        notes.append("launch: oxrl train recipe.yaml")
    notes.append(f"free memory kept for the runtime: {gib((1 - HEADROOM) * devices.total)} per device")
    return notes
