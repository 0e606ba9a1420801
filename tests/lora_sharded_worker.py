"""LoRA scenarios that tests/system/test_lora_sharded.py runs under `torchrun --nproc_per_node 2` (gloo, CPU).

    torchrun --nproc_per_node 2 -m tests.lora_sharded_worker SCENARIO OUT_DIR

Rank 0 writes OUT_DIR/result.json (and the gathered policy weights as safetensors). The same
helpers run the single-device baselines inside the test process.
"""

from __future__ import annotations

import sys
from pathlib import Path

from safetensors.torch import save_file

from oxrl.config.schema import Config, LoraConfig
from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import train_offline
from oxrl.models.lora import add_lora
from oxrl.models.reference import AdapterDisabledReference
from oxrl.training.build import build_strategy
from oxrl.training.strategy import Strategy
from tests.conftest import make_tiny_llama
from tests.distributed_worker import config, grad_norms, probe_logits, run_as_worker, train_sft
from tests.integration.test_preference_training import preference_pairs

LORA = LoraConfig(enabled=True, rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"])


def lora_model(seed: int = 0):
    # make_tiny_llama seeds torch, so the adapters' A matrices are the same on every rank and in the baseline.
    return add_lora(make_tiny_llama(seed=seed), LORA)


def lora_config(out: Path, strategy: dict | None = None, algorithm: str = "sft", **train) -> Config:
    cfg = config(out, algorithm, strategy, **train)
    cfg.lora = LORA
    return cfg


def train_lora_sft(cfg: Config, strategy: Strategy, run_dir: Path, seed: int = 0):
    return train_sft(cfg, strategy, run_dir, model=lora_model(seed))


def train_lora_dpo(cfg: Config, strategy: Strategy, run_dir: Path) -> list[float]:
    """DPO whose reference is the policy with its adapters off (`preference.reference: lora_disabled`)."""
    model = lora_model()
    result = train_offline(cfg, get_objective("dpo", cfg.preference), model, None, preference_pairs(8), [], strategy,
                           run_dir, AdapterDisabledReference(model))
    return result.losses


def finish(strategy: Strategy, model, run_dir: Path, out: Path, name: str) -> dict:
    """The trained policy's gathered weights (policy.safetensors), logits, and its merged and adapter folders."""
    state = strategy.policy_state_dict()
    if strategy.is_main:
        save_file({key: tensor.contiguous() for key, tensor in state.items()}, out / f"{name}_policy.safetensors")
    else:
        assert state is None
    strategy.save_hf_folder(None, out / f"{name}_merged", lora_save="merged")
    strategy.save_hf_folder(None, out / f"{name}_adapter", lora_save="adapter")
    return {"losses": None, "grad_norms": grad_norms(run_dir) if strategy.is_main else [], "logits": probe_logits(model)}


def train_and_resume(out: Path, strategy: dict, name: str) -> dict:
    cfg = lora_config(out, strategy)
    cfg.lora = LORA.model_copy(update={"save": "adapter"})  # checkpoints as adapter folders; final folders both ways
    built = build_strategy(cfg)
    model, losses = train_lora_sft(cfg, built, out / name)
    result = {**finish(built, model, out / name, out, name), "losses": losses}
    resumed_cfg = lora_config(out, strategy)
    resumed_cfg.run.resume = str(out / name / "checkpoints" / "step_000002")
    # Other base weights than the run's: the resumed run must take them (not only the adapters) from the shards.
    _, result["resumed"] = train_lora_sft(resumed_cfg, build_strategy(resumed_cfg), out / f"{name}_resumed", seed=123)
    return result


def lora_disabled_dpo_config(out: Path, strategy: dict | None) -> Config:
    cfg = lora_config(out, strategy, "dpo", max_steps=3)
    cfg.preference.reference = "lora_disabled"
    return cfg


def scenario_fsdp2(out: Path) -> dict:
    result = train_and_resume(out, {"name": "fsdp2"}, "fsdp2")
    dpo_cfg = lora_disabled_dpo_config(out, {"name": "fsdp2"})
    result["dpo"] = train_lora_dpo(dpo_cfg, build_strategy(dpo_cfg), out / "dpo")
    return result


def scenario_deepspeed(out: Path) -> dict:
    result = {"zero3": train_and_resume(out, {"name": "deepspeed", "zero_stage": 3}, "zero3")}
    dpo_cfg = lora_disabled_dpo_config(out, {"name": "deepspeed", "zero_stage": 3})
    result["dpo"] = train_lora_dpo(dpo_cfg, build_strategy(dpo_cfg), out / "dpo")
    cfg = lora_config(out, {"name": "deepspeed", "zero_stage": 2})
    strategy = build_strategy(cfg)
    model, losses = train_lora_sft(cfg, strategy, out / "zero2")
    result["zero2"] = {**finish(strategy, model, out / "zero2", out, "zero2"), "losses": losses}
    return result


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")}

if __name__ == "__main__":
    run_as_worker(SCENARIOS[sys.argv[1]])
