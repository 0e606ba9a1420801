"""The model registry, `oxrl models`, `oxrl recipe` and the Trainer's LoRA-first choice (no downloads)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from oxrl import Trainer
from oxrl.cli import main
from oxrl.config.load import load_config
from oxrl.config.schema import ModelConfig
from oxrl.models import fit
from oxrl.models.fit import choose_lora, model_shape
from oxrl.models.hardware import Devices, HardwareSpecError, parse_devices
from oxrl.models.recipe import DoesNotFitError, recipe
from oxrl.models.registry import RegistryError, load_registry, read_registry_file, require_model
from oxrl.models.shape import ModelShape

ENTRIES = load_registry()
SHAPED = [entry for entry in ENTRIES if entry.config is not None]


@pytest.mark.parametrize("entry", SHAPED, ids=[entry.name for entry in SHAPED])
def test_each_entry_s_shape_has_its_stated_size_and_lora_targets(entry):
    shape = ModelShape.from_config(entry.transformers_config())  # built on the meta device
    assert shape.parameters / 1e9 == pytest.approx(entry.params_b, rel=0.02)
    assert shape.context == entry.context
    assert set(entry.lora_targets) <= {linear.name for linear in shape.linears}
    assert shape.lora_parameters(16, entry.lora_targets) > 0


def test_the_registry_holds_the_models_it_promises():
    names = {entry.name for entry in ENTRIES}
    for wanted in ("Qwen/Qwen3-0.6B", "Qwen/Qwen2.5-7B-Instruct", "google/gemma-3-1b-it", "mistralai/Mistral-7B-Instruct-v0.3",
                   "meta-llama/Llama-3.1-8B-Instruct", "microsoft/Phi-3.5-mini-instruct", "microsoft/phi-4",
                   "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "Qwen/Qwen3.5-35B-A3B"):
        assert wanted in names
    assert all(entry.unsupported for entry in ENTRIES if entry.modality != "text")


def test_a_name_is_found_by_its_last_part_and_a_typo_gets_a_suggestion():
    assert require_model("qwen2.5-7b-instruct", ENTRIES).name == "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(RegistryError, match="Did you mean `Qwen2.5-7B-Instruct`"):
        require_model("Qwen2.5-7B-Instruc", ENTRIES)


def test_a_bad_registry_file_names_the_file_the_entry_and_the_field(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "me/model", "family": "llama", "params_b": -1, "context": 10}]}))
    with pytest.raises(RegistryError, match=r"mine.yaml: models entry 1 \(me/model\): params_b"):
        read_registry_file(path)
    path.write_text("models: {not: a list}")
    with pytest.raises(RegistryError, match="a `models:` list"):
        read_registry_file(path)


def test_a_user_entry_replaces_the_shipped_one(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "qwen/qwen3-0.6b", "family": "qwen3", "params_b": 0.6,
                                                "context": 1024, "note": "mine"}]}))
    entries = load_registry([path])
    assert len(entries) == len(ENTRIES)
    assert require_model("Qwen/Qwen3-0.6B", entries).note == "mine"


def test_device_specs():
    assert parse_devices("8x80GB") == Devices("cuda", 8, 80 * 1000**3, "80GB GPU")
    assert parse_devices("24GiB").total == 24 * 1024**3
    with pytest.raises(HardwareSpecError, match="8xx"):
        parse_devices("8xx")


def test_recipes_pick_sharding_then_lora_then_refuse():
    big = recipe("Qwen/Qwen2.5-7B-Instruct", "math", parse_devices("8x80GB"))
    assert big.tree["strategy"] == {"name": "fsdp2"} and "lora" not in big.tree
    assert "torchrun --nproc-per-node 8" in big.yaml()
    small = recipe("Qwen2.5-7B-Instruct", "chat", parse_devices("1x24GB"))
    assert small.tree["lora"]["enabled"] is True
    assert small.tree["lora"]["target_modules"] == require_model("Qwen/Qwen2.5-7B-Instruct", ENTRIES).lora_targets
    assert small.estimate.total <= 0.9 * 24 * 1000**3
    with pytest.raises(DoesNotFitError, match="does not fit 1 x 16GB GPU"):
        recipe("microsoft/phi-4", "chat", parse_devices("1x16GB"))
    with pytest.raises(RegistryError, match="no shape for image-text models, so there is no recipe"):
        recipe("Qwen/Qwen2-VL-7B-Instruct", "chat", parse_devices("1x80GB"))


def test_a_single_gpu_rl_recipe_shares_the_gpu_with_vllm():
    one = recipe("Qwen/Qwen3-0.6B", "math", parse_devices("1x80GB"))
    assert one.tree["rl"]["rollout"]["engine"] == "vllm"
    assert 0 < one.tree["rl"]["rollout"]["vllm"]["gpu_memory_utilization"] <= 0.5


def test_a_printed_recipe_loads_as_a_config(tmp_path, capsys):
    out = tmp_path / "recipe.yaml"
    assert main(["recipe", "Qwen/Qwen2.5-1.5B-Instruct", "--task", "chat", "--gpus", "1x24GB", "--out", str(out)]) == 0
    cfg = load_config(str(out))
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct" and cfg.algorithm.name == "sft"
    assert main(["recipe", "Qwen/Qwen2.5-1.5B-Instruct", "--task", "chat", "--gpus", "nonsense"]) == 2


def test_oxrl_models_lists_every_entry(capsys):
    assert main(["models"]) == 0
    table = capsys.readouterr().out
    for entry in ENTRIES:
        assert f"| {entry.name} |" in table
    assert "| microsoft/phi-4 | phi3 | 14.66B | 16384 | yes | no | LoRA | full |" in table


def test_a_local_model_s_shape_is_its_own_config(tmp_path, tiny_llama):
    tiny_llama.save_pretrained(tmp_path / "m")
    shape = model_shape(ModelConfig(name_or_path=str(tmp_path / "m")))
    assert shape.parameters == sum(p.numel() for p in tiny_llama.parameters())


def lora_decision(name: str, memory_gib: float, caplog) -> bool:
    cfg = load_config(None, base={"model": {"name_or_path": name}, "algorithm": {"name": "sft"},
                                  "data": {"train": [{"path": "x.jsonl"}], "max_length": 512}})
    with caplog.at_level(logging.INFO, logger="oxrl.models.fit"):
        return choose_lora(cfg, Devices("cpu", 1, int(memory_gib * 1024**3), "CPU"))


def test_lora_first_when_a_full_fine_tune_does_not_fit(caplog):
    # Qwen2.5-1.5B in fp32 on the CPU: about 23 GiB of weights, gradients and AdamW moments, 6 GiB with LoRA.
    assert lora_decision("Qwen/Qwen2.5-1.5B-Instruct", 64, caplog) is False
    assert lora_decision("Qwen/Qwen2.5-1.5B-Instruct", 16, caplog) is True
    assert "training LoRA adapters instead" in caplog.text
    assert lora_decision("Qwen/Qwen2.5-1.5B-Instruct", 2, caplog) is False
    assert "neither a full fine-tune" in caplog.text


def test_the_trainer_turns_lora_on_unless_told(monkeypatch):
    # The chat task's micro-batch of 4 x 512 tokens: a full fine-tune needs ~37 GiB, LoRA ~20 GiB.
    monkeypatch.setattr(fit, "available_memory", lambda cpu=False: Devices("cpu", 1, 24 * 1024**3, "CPU"))
    assert Trainer(model="Qwen/Qwen2.5-1.5B-Instruct").config(task="chat").lora.enabled is True
    told = Trainer(model="Qwen/Qwen2.5-1.5B-Instruct", **{"lora.enabled": False})
    assert told.config(task="chat").lora.enabled is False
    assert Trainer(model="smollm2-135m-instruct").config(task="chat").lora.enabled is False
