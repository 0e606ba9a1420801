"""LoRA trains only the adapters; the merged model gives the same outputs."""

import torch

from oxrl.config.schema import LoraConfig
from oxrl.training.strategy import SingleDevice
from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import train_offline
from oxrl.models.lora import add_lora
from oxrl.models.save import save_hf_folder
from tests.conftest import make_tiny_llama
from tests.integration.test_tiny_training import copy_task, tiny_config


def _lora_model():
    # init_lora_weights leaves B = 0, so the adapters start as a no-op; training must move them.
    return add_lora(make_tiny_llama(), LoraConfig(enabled=True, rank=4, alpha=8, target_modules=["q_proj", "v_proj"]))


def test_lora_trains_only_adapters_and_merges_exactly(tmp_path):
    model = _lora_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    cfg = tiny_config(tmp_path, max_steps=5)
    strategy = SingleDevice(torch.device("cpu"), "no")
    train_offline(cfg, get_objective("sft"), model, None, copy_task(8), [], strategy, tmp_path / "run")
    for name, param in model.named_parameters():
        moved = not torch.equal(param.detach(), before[name])
        assert moved == (name in trainable), name

    ids = torch.tensor([[1, 7, 9, 4, 11]])
    model.eval()
    expected = model(input_ids=ids).logits
    from transformers import AutoModelForCausalLM

    save_hf_folder(model, None, tmp_path / "merged", lora_save="merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
    # Saving merged must not have folded the adapters into the live training model.
    assert any("lora_" in n for n, _ in model.named_parameters())


def test_adapter_only_save_loads_with_peft(tmp_path):
    from peft import PeftModel

    model = _lora_model()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(0.1)  # make the adapter matter
    save_hf_folder(model, None, tmp_path / "adapter", lora_save="adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    base = make_tiny_llama()
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    ids = torch.tensor([[1, 7, 9]])
    torch.testing.assert_close(loaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits)


def test_lora_resume_restores_adapters(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=4)
    cfg.checkpoint.every = 2
    cfg.checkpoint.keep_last = 3
    full_model = _lora_model()
    strategy = SingleDevice(torch.device("cpu"), "no")
    full = train_offline(cfg, get_objective("sft"), full_model, None, copy_task(8), [], strategy, tmp_path / "a")
    cfg.run.resume = str(tmp_path / "a" / "checkpoints" / "step_000002")
    resumed = train_offline(cfg, get_objective("sft"), _lora_model(), None, copy_task(8), [], SingleDevice(torch.device("cpu"), "no"), tmp_path / "b")
    for a, b in zip(full.losses[2:], resumed.losses):
        assert abs(a - b) < 1e-6
