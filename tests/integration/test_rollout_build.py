"""Choosing the rollout engine: config errors come before any model loads; LoRA weights merge for an engine."""

import importlib.util
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from oxrl.config.schema import Config, LoraConfig, RolloutConfig
from oxrl.models.lora import add_lora, merged_state_dict
from oxrl.rollout.build import build_engine, check_engine
from oxrl.rollout.hf import HFEngine
from tests.conftest import make_tiny_llama
from tests.integration.test_rollout_hf import TinyTokenizer


def vllm_importable() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import vllm  # noqa: F401
    except (ImportError, RuntimeError):
        return False
    return True


def test_vllm_options_are_validated():
    rollout = RolloutConfig.model_validate({"engine": "vllm", "vllm": {"tensor_parallel_size": 2, "sync_check_tolerance": 0.01}})
    assert rollout.vllm.tensor_parallel_size == 2 and rollout.vllm.gpu_memory_utilization == 0.5
    with pytest.raises(ValidationError):
        RolloutConfig.model_validate({"engine": "vllm", "vllm": {"gpu_memory_utilisation": 0.3}})  # typo: extra=forbid
    with pytest.raises(ValidationError):
        RolloutConfig.model_validate({"engine": "sglang"})


@pytest.mark.skipif(vllm_importable(), reason="vLLM is importable here: the missing-vLLM error cannot happen")
def test_missing_vllm_is_a_clear_error_before_the_model_loads(tmp_path):
    from oxrl.runner import run

    cfg = Config.model_validate({
        "run": {"name": "no-vllm", "output_dir": str(tmp_path)},
        "model": {"name_or_path": str(tmp_path / "no-such-model")},  # loading it would fail differently
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "task_size": 4, "validation_size": 0, "prompts_per_step": 2,
               "rollout": {"engine": "vllm", "n": 2}},
    })
    with pytest.raises(ImportError, match="vLLM cannot be imported") as error:
        run(cfg)
    assert "pip install 'vllm>=0.32'" in str(error.value) and "scripts/setup_vllm_cpu.sh" in str(error.value)
    assert "oxrl[" not in str(error.value)  # `oxrl` on PyPI is another project


@pytest.mark.skipif(vllm_importable(), reason="vLLM is importable here: the missing-vLLM error cannot happen")
def test_missing_vllm_through_the_cli_is_one_clear_line(tmp_path, caplog):
    import yaml

    from oxrl.cli import main

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({
        "run": {"name": "no-vllm", "output_dir": str(tmp_path)}, "model": {"name_or_path": str(tmp_path / "none")},
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "task_size": 4, "validation_size": 0, "rollout": {"engine": "vllm"}},
    }))
    assert main(["train", str(path)]) == 2  # an input problem: exit 2, no traceback
    assert "rl.rollout.engine is `vllm` but vLLM cannot be imported" in caplog.text


@pytest.mark.parametrize("world_size, shards", [(2, False), (1, True)])
def test_vllm_refuses_several_processes_or_sharded_weights(world_size, shards):
    strategy = SimpleNamespace(world_size=world_size, shards_parameters=shards)
    with pytest.raises(ValueError, match="one training process"):
        check_engine(RolloutConfig(engine="vllm"), strategy)


def test_hf_is_the_default_engine():
    model = make_tiny_llama()
    strategy = SimpleNamespace(world_size=1, shards_parameters=False, autocast=nullcontext, device=torch.device("cpu"))
    check_engine(RolloutConfig(), strategy)
    engine = build_engine(RolloutConfig(max_batch_size=3, precision="trainer"), model, TinyTokenizer(), strategy)
    assert isinstance(engine, HFEngine) and engine.max_batch_size == 3 and not engine.synced
    assert engine.autocast is strategy.autocast and engine.copy is None  # it samples in the trainer's precision
    engine = build_engine(RolloutConfig(precision="bf16"), model, TinyTokenizer(), strategy)
    assert next(engine.copy.parameters()).dtype == torch.bfloat16


def test_lora_merged_state_dict_is_the_policy_without_touching_the_model():
    model = add_lora(make_tiny_llama(), LoraConfig(enabled=True, rank=4, alpha=8.0))
    with torch.no_grad():  # non-zero adapters, as after training
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    live = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = merged_state_dict(model)
    assert all(torch.equal(p, live[n]) for n, p in model.named_parameters())  # nothing merged in place
    plain = make_tiny_llama()
    assert set(state) == set(plain.state_dict())  # the base model's own names, no lora_ / base_layer
    plain.load_state_dict(state)
    ids = torch.tensor([[1, 7, 9, 4, 11]])
    model.eval()
    torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    lora_only = plain.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(lora_only, model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight)
