"""LoRA under FSDP2 and DeepSpeed ZeRO: 2 ranks == 1 rank, and the saved folders are the trained policy.

Each `distributed` test reads a scenario of tests/lora_sharded_worker.py, launched once per module
under `torchrun --nproc_per_node 2` (gloo, CPU, as in tests/system/test_distributed.py), and compares it
with the same LoRA run on one device in this process. Tolerance 1e-5 absolute (fp32; the runs differ
in summation order only).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from oxrl.models.lora import LoraMerge, merge_lora, merged_state_dict
from tests import lora_sharded_worker as worker
from tests.conftest import make_tiny_llama
from tests.distributed_worker import PROBE_IDS, grad_norms
from tests.system.test_distributed import HAS_DEEPSPEED, assert_close, single, torchrun

needs_deepspeed = pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install -e '.[deepspeed]')")


# ----------------------------------------------------------------------------- cheap, no processes


def test_merge_lora_adds_the_scaled_product_under_base_names():
    weight = torch.arange(6.0).reshape(2, 3)  # [out 2, in 3]
    a = torch.tensor([[1.0, 0.0, 2.0]])  # [r 1, in 3]
    b = torch.tensor([[1.0], [-1.0]])  # [out 2, r 1]
    state = {"q.base_layer.weight": weight, "q.lora_A.x.weight": a, "q.lora_B.x.weight": b, "norm.weight": torch.ones(3)}
    merged = merge_lora(state, {"q": LoraMerge({"x": 0.5})})
    # B @ A = [[1, 0, 2], [-1, 0, -2]]; times 0.5, added to [[0, 1, 2], [3, 4, 5]]
    assert set(merged) == {"q.weight", "norm.weight"}
    assert torch.equal(merged["q.weight"], torch.tensor([[0.5, 1.0, 3.0], [2.5, 4.0, 4.0]]))
    assert torch.equal(state["q.base_layer.weight"], torch.arange(6.0).reshape(2, 3))  # the input is untouched
    # Stored (in, out), as GPT-2's Conv1D: the delta is transposed.
    transposed = merge_lora({**state, "q.base_layer.weight": weight.T}, {"q": LoraMerge({"x": 0.5}, fan_in_fan_out=True)})
    assert torch.equal(transposed["q.weight"], merged["q.weight"].T)
    # A layer that is not to be merged (merged already, or adapters off) keeps its base weight.
    assert torch.equal(merge_lora(state, {})["q.weight"], weight)


def test_single_device_policy_state_dict_is_a_merged_copy():
    model = worker.lora_model()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    strategy = single()
    strategy.prepare(model, None)
    state = strategy.policy_state_dict()
    expected = merged_state_dict(model)
    assert state.keys() == expected.keys() == make_tiny_llama().state_dict().keys()
    assert all(torch.equal(state[k], expected[k]) for k in state)
    base = model.get_base_model().model.embed_tokens.weight
    assert state["model.embed_tokens.weight"].data_ptr() != base.data_ptr()  # a snapshot, not the live tensor


# ----------------------------------------------------------------------------- 2 processes


def run_scenario(name: str, factory) -> tuple[dict, object]:
    out = factory.mktemp(f"lora_{name}")
    torchrun(["-m", "tests.lora_sharded_worker", name, str(out)])
    return json.loads((out / "result.json").read_text()), out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    out = tmp_path_factory.mktemp("lora_single")
    model, losses = worker.train_lora_sft(worker.lora_config(out), single(), out / "run")
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(PROBE_IDS)).logits
    return {"model": model, "losses": losses, "grad_norms": grad_norms(out / "run"), "logits": logits,
            "merged": merged_state_dict(model)}


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory):
    return run_scenario("fsdp2", tmp_path_factory)


@pytest.fixture(scope="module")
def deepspeed(tmp_path_factory):
    return run_scenario("deepspeed", tmp_path_factory)


def assert_matches_one_rank(result: dict, out, name: str, baseline: dict) -> None:
    """Losses, grad norms and the gathered policy (`policy_state_dict`) equal the single-device LoRA run's."""
    assert len(result["losses"]) == 4
    assert_close(result["losses"], baseline["losses"])
    assert_close(result["grad_norms"], baseline["grad_norms"])
    policy = load_file(out / f"{name}_policy.safetensors")
    assert policy.keys() == baseline["merged"].keys()  # the base model's own names: no lora_ / base_layer
    for key, tensor in policy.items():
        torch.testing.assert_close(tensor, baseline["merged"][key], atol=1e-5, rtol=0.0)
    # Only the adapters trained: every weight LoRA does not touch is still the initial one, bit for bit.
    initial = make_tiny_llama().state_dict()
    untouched = [key for key in policy if "q_proj" not in key and "v_proj" not in key]
    assert untouched and all(torch.equal(policy[key], initial[key]) for key in untouched)
    adapted = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(policy[adapted], initial[adapted])


def assert_folders_are_the_policy(result: dict, out, name: str, baseline: dict) -> None:
    """The merged folder loads in plain transformers, the adapter folder with peft, both giving the trained logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.tensor(PROBE_IDS)
    merged = AutoModelForCausalLM.from_pretrained(out / f"{name}_merged").eval()
    assert json.loads((out / f"{name}_merged" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert not any("lora" in key for key in merged.state_dict())
    for folder in (out / f"{name}_adapter", out / name / "checkpoints" / "step_000004"):  # checkpoints saved as adapters
        assert (folder / "adapter_config.json").is_file() and not (folder / "config.json").exists()
        adapted = PeftModel.from_pretrained(make_tiny_llama(), folder).eval()
        with torch.no_grad():
            assert_close(adapted(input_ids=ids).logits.tolist(), baseline["logits"].tolist())
    with torch.no_grad():
        logits = merged(input_ids=ids).logits
    assert_close(logits.tolist(), result["logits"])  # the sharded model, as it was in the 2 processes
    assert_close(logits.tolist(), baseline["logits"].tolist())


@pytest.mark.distributed
def test_fsdp2_lora_two_ranks_match_one(fsdp2, baseline):
    result, out = fsdp2
    assert_matches_one_rank(result, out, "fsdp2", baseline)


@pytest.mark.distributed
def test_fsdp2_lora_merged_and_adapter_folders_load(fsdp2, baseline):
    result, out = fsdp2
    assert_folders_are_the_policy(result, out, "fsdp2", baseline)


@pytest.mark.distributed
def test_fsdp2_lora_resume_matches_the_uninterrupted_run(fsdp2):
    result, out = fsdp2
    assert_close(result["resumed"], result["losses"][2:], tol=1e-6)
    assert (out / "fsdp2" / "checkpoints" / "step_000002" / "training_state" / "sharded").is_dir()


@pytest.fixture(scope="module")
def lora_disabled_dpo(tmp_path_factory) -> list[float]:
    out = tmp_path_factory.mktemp("lora_dpo_single")
    return worker.train_lora_dpo(worker.lora_disabled_dpo_config(out, None), single(), out / "dpo")


def assert_lora_disabled_dpo_matches_one(losses: list[float], expected: list[float]) -> None:
    """`preference.reference: lora_disabled` (the sharded policy with its adapters off) scores as on one device."""
    assert_close(losses, expected)
    assert losses[0] == pytest.approx(0.6931471805599453, abs=1e-6)  # the adapters start as a no-op: log 2
    assert losses[-1] < losses[0]  # the reference stayed the base model while the adapters moved


@pytest.mark.distributed
def test_fsdp2_lora_dpo_against_the_adapters_off_reference_matches_one(fsdp2, lora_disabled_dpo):
    assert_lora_disabled_dpo_matches_one(fsdp2[0]["dpo"], lora_disabled_dpo)


@pytest.mark.distributed
@needs_deepspeed
def test_deepspeed_zero2_and_zero3_lora_match_one_rank_and_resume(deepspeed, baseline):
    result, out = deepspeed
    for stage in ("zero2", "zero3"):
        assert_matches_one_rank(result[stage], out, stage, baseline)
        assert_close(result[stage]["logits"], baseline["logits"].tolist())
    assert_close(result["zero3"]["resumed"], result["zero3"]["losses"][2:], tol=1e-6)


@pytest.mark.distributed
@needs_deepspeed
def test_deepspeed_zero3_lora_dpo_against_the_adapters_off_reference_matches_one(deepspeed, lora_disabled_dpo):
    assert_lora_disabled_dpo_matches_one(deepspeed[0]["dpo"], lora_disabled_dpo)


@pytest.mark.distributed
@needs_deepspeed
def test_deepspeed_zero3_lora_merged_and_adapter_folders_load(deepspeed, baseline):
    result, out = deepspeed
    assert_folders_are_the_policy(result["zero3"], out, "zero3", baseline)
