"""Reference models: the LoRA-disabled policy is the base model, precomputed == frozen copy, and
reference-free objectives never build one (checked through the runner)."""

import copy
import json

import pytest
import torch

from oxrl.config.schema import Config, LoraConfig
from oxrl.data.types import pack
from oxrl.training.strategy import SingleDevice
from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import train_offline
from oxrl.models.lora import add_lora
from oxrl.models.reference import AdapterDisabledReference, FrozenModel, build_reference
from tests.conftest import make_tiny_llama
from tests.integration.test_preference_training import preference_config, preference_pairs

CPU = SingleDevice(torch.device("cpu"), "no")


def test_lora_disabled_reference_is_the_base_model():
    base = make_tiny_llama()
    policy = add_lora(copy.deepcopy(base), LoraConfig(enabled=True, rank=4, alpha=8))
    with torch.no_grad():  # adapters start as a no-op (B = 0); make them matter
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    batch = pack(preference_pairs(3))
    policy.train()
    reference = build_reference("lora_disabled", policy, [], 1, CPU)
    assert isinstance(reference, AdapterDisabledReference) and reference.model is policy  # no second copy
    expected = FrozenModel(base.eval()).sequence_logps(batch)
    torch.testing.assert_close(reference.sequence_logps(batch), expected, atol=1e-5, rtol=1e-5)
    assert policy.training  # the loop's mode is restored
    with torch.no_grad():  # and the adapters are back on afterwards
        assert (FrozenModel(policy).sequence_logps(batch) - expected).abs().max() > 1e-3


def test_lora_disabled_needs_a_peft_model():
    with pytest.raises(ValueError, match="lora.enabled"):
        build_reference("lora_disabled", make_tiny_llama(), [], 1, CPU)


def test_precomputed_reference_gives_the_frozen_copy_losses(tmp_path):
    train_set, val_set = preference_pairs(8), preference_pairs(4, seed=5)
    cfg = preference_config(tmp_path, max_steps=4, eval_every=2)
    objective = get_objective("dpo", cfg.preference)
    results = {}
    for kind in ("frozen_copy", "precomputed"):
        model = make_tiny_llama()
        reference = build_reference(kind, model, train_set + val_set, 2, CPU)
        results[kind] = train_offline(cfg, objective, model, None, train_set, val_set, CPU, tmp_path / kind, reference)
    assert results["precomputed"].losses == pytest.approx(results["frozen_copy"].losses, abs=1e-5)
    frozen, precomputed = results["frozen_copy"].final_metrics, results["precomputed"].final_metrics
    for key in ("val/loss", "val/rewards/margins", "rewards/margins"):
        assert precomputed[key] == pytest.approx(frozen[key], abs=1e-5), key


def test_precomputed_reference_names_unscored_sequences():
    reference = build_reference("precomputed", make_tiny_llama(), preference_pairs(2), 2, CPU)
    with pytest.raises(KeyError, match="not scored before training"):
        reference.sequence_logps(pack(preference_pairs(2, seed=9)))


@pytest.fixture
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer):
    """A tiny random Llama with SmolLM2's tokenizer, saved as a HF folder the runner can load."""
    path = tmp_path_factory.mktemp("tiny_model")
    make_tiny_llama(vocab_size=len(smollm2_tokenizer)).save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    return path


def _run_config(tmp_path, model_dir, name: str) -> Config:
    from oxrl.config.load import load_config

    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"What is {a}+{a}?", "chosen": f"{2 * a}", "rejected": f"{2 * a + 1}"} for a in range(4)]
    data.write_text("\n".join(json.dumps(row) for row in rows))
    return load_config(None, [
        f"model.name_or_path={model_dir}", f"data.train=[{{path: {data}}}]", f"algorithm.name={name}",
        f"run.output_dir={tmp_path}", "run.device=cpu", "train.global_batch_size=2", "train.micro_batch_size_per_device=2",
        "train.max_steps=1", "logging.progress_bar=false", "logging.plot=false", "checkpoint.save_final=false",
    ])


@pytest.mark.parametrize("name", ["simpo", "dpo"])
def test_runner_builds_a_reference_only_when_the_objective_needs_one(tmp_path, tiny_model_dir, monkeypatch, name):
    import oxrl.models.reference
    from oxrl.runner import run

    calls = []
    real_build = oxrl.models.reference.build_reference
    monkeypatch.setattr(oxrl.models.reference, "build_reference", lambda *args: calls.append(args) or real_build(*args))
    result = run(_run_config(tmp_path, tiny_model_dir, name))
    assert len(calls) == (name == "dpo") and result.losses and "rewards/accuracy" in result.final_metrics


@pytest.mark.parametrize("lora", [False, True])
def test_rl_builds_its_kl_reference_like_every_objective(tmp_path, smollm2_tokenizer, lora):
    """KL-regularised RL takes its reference from `build_reference`: a frozen copy, or with LoRA the policy with its
    adapters off (no second model). The KL to it is 0 before the first update and grows after it."""
    from oxrl.loops.rl_setup import rl_handles
    from oxrl.runner import run
    from tests.conftest import save_tiny_model

    save_tiny_model(tmp_path / "model", smollm2_tokenizer)
    tree = {
        "run": {"name": "sgrpo", "output_dir": str(tmp_path / "runs"), "seed": 3, "device": "cpu"},
        "model": {"name_or_path": str(tmp_path / "model")},
        "algorithm": {"name": "sgrpo"},
        "lora": {"enabled": True, "rank": 4, "alpha": 8} if lora else {},
        "rl": {"task": "arithmetic", "task_size": 8, "validation_size": 0, "prompts_per_step": 2,
               "rollout": {"n": 4, "max_new_tokens": 8, "temperature": 1.0}, "kl_coef": 0.5,
               "rewards": [{"name": "tests.integration.test_online:varied"}]},
        "train": {"max_steps": 2, "micro_batch_size_per_device": 8, "optim": {"lr": 5e-2, "schedule": "constant"}},
        "logging": {"progress_bar": False, "plot": False},
        "checkpoint": {"save_final": False},
    }
    cfg = Config.model_validate(tree)
    h = rl_handles(cfg, CPU, smollm2_tokenizer, None, None, 8)
    assert isinstance(h.reference, AdapterDisabledReference) == lora
    assert (h.reference.model is h.model) == lora
    run(cfg)
    rows = [json.loads(line) for line in (tmp_path / "runs" / "sgrpo" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the first update starts from the reference
    assert rows[1]["kl_ref"] > 1e-6
