"""Does a config fit its hardware? The memory estimate (oxrl/models/memory.py) for a whole Config.

The shape comes from a local model's config.json (a folder, a .gguf file, the bundled model), else from the
registry's entry, else from the hub's config.json: nothing is loaded but that small file.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from oxrl.config.names import PREFERENCE, REWARD_MODEL
from oxrl.config.schema import Config, ModelConfig
from oxrl.models.hardware import Devices, available_memory
from oxrl.models.memory import MemoryEstimate, TrainingPlan, estimate_memory, gib, refuse_oversized, weights_sharded
from oxrl.models.shape import ModelShape, ModelTooLargeError
from oxrl.models.precision import samples_from_bf16_copy, uses_bf16

logger = logging.getLogger(__name__)

# Objectives whose example is a pair (chosen and rejected packed side by side); KTO's is one sequence.
PAIRED = frozenset(PREFERENCE + REWARD_MODEL) - {"kto"}

# Room left for what the estimate leaves out: the CUDA context and kernels, the allocator's fragmentation.
HEADROOM = 0.9


def model_shape(model: ModelConfig, registry_files: list[str] = ()) -> ModelShape:
    """The shape of `model`: a local model's own config.json, else the registry's entry, else the hub's
    config.json (downloaded: a few kB)."""
    from transformers import AutoConfig

    from oxrl.models.source import from_pretrained_or_explain, resolve_source

    source = resolve_source(model.name_or_path)
    config = None
    if not Path(source.path).exists():  # a hub id: the registry's entry, when it has one, needs no network
        from oxrl.models.registry import find_model, load_registry

        entry = find_model(model.name_or_path, load_registry(registry_files))
        config = entry.transformers_config() if entry is not None and entry.config is not None else None
    if config is None:
        config = from_pretrained_or_explain(AutoConfig, source, "model config", revision=model.revision,
                                            trust_remote_code=model.trust_remote_code)
    return ModelShape.from_config(getattr(config, "text_config", None) or config, model.trust_remote_code)


def needs_reference(cfg: Config) -> bool:
    """Whether the run holds a fixed model beside the policy: a reference, a teacher or SPIN's opponent."""
    from oxrl.config.names import REFERENCE_FREE
    from oxrl.config.rl_presets import is_rl

    if cfg.algorithm.name == "spin":
        return True  # the opponent
    if cfg.algorithm.name in ("online_dpo", "rft"):
        return cfg.trained_objective not in REFERENCE_FREE
    if is_rl(cfg.algorithm.name):
        return cfg.rl.kl_coef > 0
    return cfg.algorithm.name not in REFERENCE_FREE


def training_plan(cfg: Config, devices: Devices, lora: bool | None = None, row_tokens: int | None = None) -> TrainingPlan:
    """What `cfg` would do on `devices` (one process per device), in the estimate's terms. `row_tokens`: the
    longest packed micro-batch the data can make, once it is known; without it every sequence is taken to be
    `data.max_length` long (the worst case)."""
    from oxrl.config.rl_presets import is_rl
    from oxrl.models.load import resolve_dtype

    on_gpu = devices.kind == "cuda"
    strategy = cfg.strategy.name if cfg.strategy.name != "auto" else ("fsdp2" if devices.count > 1 else "single")
    micro = cfg.train.micro_batch_size_per_device
    rl = is_rl(cfg.algorithm.name)
    sequences = 2 if cfg.algorithm.name in PAIRED or cfg.trained_objective in PAIRED else 1
    vllm = rl and cfg.rl.rollout.engine == "vllm" and on_gpu
    lora = cfg.lora.enabled if lora is None else lora
    # Each setting is read only where the run reads it (the config refuses it elsewhere); the plan's defaults stand in.
    own = {name: value for name, value in (("zero_stage", cfg.read("strategy.zero_stage")),
                                           ("cpu_offload", cfg.read("strategy.cpu_offload"))) if value is not None}
    mesh = cfg.read("strategy.mesh")
    if mesh is not None:
        own.update(tp=mesh.tp, cp=mesh.cp)
    if lora:  # (the Python API asks what LoRA would take before it is on: lora.enabled is not what decides here)
        targets = cfg.lora.target_modules
        own.update(lora_rank=cfg.lora.rank, lora_targets=targets if isinstance(targets, str) else tuple(targets))
    if vllm:
        own.update(vllm_share_bytes=int(cfg.rl.rollout.vllm.gpu_memory_utilization * devices.total),
                   vllm_sleeps=cfg.rl.rollout.vllm.sleep_between_phases)
    if rl:
        own.update(logit_tokens=micro * cfg.completion_tokens,
                   critic=cfg.critic == "separate",
                   rollout_copy=cfg.rl.rollout.engine == "hf" and samples_from_bf16_copy(
                       cfg.engine_precision, devices.kind, weights_sharded(strategy, own.get("zero_stage"))))
    return TrainingPlan(
        tokens_per_micro_batch=row_tokens or micro * sequences * cfg.data.max_length,
        dtype=str(resolve_dtype(cfg.model.dtype, torch.device("cuda" if on_gpu else "cpu"))).removeprefix("torch."),
        bf16_autocast=uses_bf16(cfg.train.mixed_precision, devices.kind),
        strategy=strategy, devices=devices.count, gradient_checkpointing=cfg.model.gradient_checkpointing, lora=lora,
        # (context parallel runs oxRL's packed kernel, which builds no mask)
        dense_attention_mask=on_gpu and cfg.model.attn_implementation != "flash_attention_2"
        and (mesh is None or mesh.cp == 1),
        reference=needs_reference(cfg), **own)


def fits(estimate: MemoryEstimate, devices: Devices) -> bool:
    return estimate.total <= HEADROOM * devices.total


def describe_fit(estimate: MemoryEstimate, devices: Devices) -> str:
    verdict = "fits" if fits(estimate, devices) else "does NOT fit"
    return (f"{estimate.lines()[0]}; {verdict} in {devices.describe()} "
            f"(with {round((1 - HEADROOM) * 100)}% kept for the runtime: {gib(HEADROOM * devices.total)})")


def run_devices(device: torch.device, world_size: int) -> Devices:
    """The memory of the devices a run trains on: its GPUs (one per process), or the CPU's RAM."""
    if device.type != "cuda":
        return available_memory(cpu=True)
    detected = available_memory()
    return Devices("cuda", world_size, detected.total, detected.name)


# What the run holds before its first token: no batch size, sequence length or checkpointing lowers it.
STATIC_PARTS = ("weights", "optimizer", "reference", "critic", "autocast_copies", "rollout_copy")


def log_memory_estimate(cfg: Config, device: torch.device, world_size: int, row_tokens: int | None = None) -> None:
    """Before any model loads: the estimated peak per device, and a warning when it will not fit. A run whose
    static memory (STATIC_PARTS) is more than a device has cannot train at all: a ModelTooLargeError, unless
    `model.allow_oversized`; a `strategy.mesh.tp` the model cannot be split over: a ValueError naming why."""
    from oxrl.models.source import ModelNotFoundError

    devices = run_devices(device, world_size)
    plan = training_plan(cfg, devices, row_tokens=row_tokens)
    try:
        shape = model_shape(cfg.model)
        estimate = estimate_memory(shape, plan)
    except ModelTooLargeError as error:
        if not cfg.model.allow_oversized:
            raise ModelTooLargeError(f"{cfg.model.name_or_path}: {error}") from None
        logger.warning("memory: no estimate for %s (model.allow_oversized)", cfg.model.name_or_path)
        return
    except (ModelNotFoundError, OSError, ValueError) as error:
        # its first line: transformers lists every class it knows after it; the model load itself says what is wrong
        logger.info("memory: no estimate (%s)", str(error).partition("\n")[0])
        return
    refusal = shape.tensor_parallel_refusal(plan.tp)  # (checked again, for any tp, when the model is split)
    if refusal:
        raise ValueError(f"strategy.mesh.tp = {plan.tp} cannot split {cfg.model.name_or_path}: {refusal}")
    if not cfg.model.allow_oversized:
        parts = ", ".join(f"{part.replace('_', ' ')} {gib(getattr(estimate, part))}" for part in STATIC_PARTS
                          if getattr(estimate, part))
        refuse_oversized(estimate.static, devices, f"{cfg.model.name_or_path}: before its first token, training it with "
                         f"strategy `{plan.strategy}` holds ({parts}) on each device, in all",
                         "Train LoRA adapters (lora.enabled: true), shard the states over more devices (strategy.name: "
                         "fsdp2 or deepspeed), or choose a smaller model")
    if fits(estimate, devices):
        logger.info("memory: %s", describe_fit(estimate, devices))
    else:
        logger.warning("memory: %s. Expect out-of-memory: lower data.max_length or train.micro_batch_size_per_device, "
                       "or set model.gradient_checkpointing or lora.enabled (`oxrl recipe` finds a layout that fits)",
                       describe_fit(estimate, devices))


def choose_lora(cfg: Config, devices: Devices) -> bool:
    """LoRA-first: True when a full fine-tune of `cfg` would not fit `devices` and LoRA would (logged)."""
    shape = model_shape(cfg.model)
    full = estimate_memory(shape, training_plan(cfg, devices, lora=False))
    if fits(full, devices):
        return False
    adapters = estimate_memory(shape, training_plan(cfg, devices, lora=True))
    if not fits(adapters, devices):
        logger.warning("memory: neither a full fine-tune (%s) nor LoRA (%s) fits %s: expect out-of-memory; lower "
                       "data.max_length or train.micro_batch_size_per_device, or set model.gradient_checkpointing",
                       gib(full.total), gib(adapters.total), devices.describe())
        return False
    logger.info("memory: a full fine-tune needs about %s per device and %s has %s: training LoRA adapters instead "
                "(%s; set lora.enabled explicitly to choose yourself)", gib(full.total), devices.describe(),
                gib(devices.total), gib(adapters.total))
    return True
