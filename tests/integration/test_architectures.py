"""The architecture matrix: every decoder family the installed transformers ships, tiny and random,
loaded the way `oxrl.models.load.load_model` loads it (saved to a folder, then loaded from there), so
the attention kernel choice is exercised. For each family: packed rows == each sequence run alone
under eager attention; one SFT, DPO and GRPO step move the weights; LoRA finds attention and MLP
projections; a saved folder reloads with plain `from_pretrained` and gives the same logits.

The features that break naive per-sequence SDPA are switched on and made to matter: sliding windows
smaller than the packed sequences (Gemma 2/3, Mistral), strong attention logit soft-capping (Gemma 2),
q/k norms (Qwen3, Gemma 3), MoE routing (Qwen2-MoE, Qwen3-MoE), fused projections (Phi-3), NoPE
layers (SmolLM3).
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from oxrl.models import lm_head
from oxrl.models.logprobs import forward_logits, token_logprobs
from oxrl.config.schema import LoraConfig, ModelConfig
from oxrl.data.types import pack
from oxrl.loops.objectives import get_objective
from oxrl.loops.rl import train_rl
from oxrl.loops.sl import train_offline
from oxrl.models.load import load_model
from oxrl.models.lora import merged_state_dict
from oxrl.models.packed_attention import PACKED_ATTENTION
from oxrl.models.reference import FrozenModel
from oxrl.models.save import save_hf_folder
from oxrl.rewards.combine import build_reward_fn
from oxrl.rollout.hf import HFEngine
from oxrl.training.strategy import SingleDevice
from tests.conftest import rl_handles
from tests.integration.test_packing import _examples
from tests.integration.test_preference_training import preference_config, preference_pairs
from tests.integration.test_rl_loop import NO_VALIDATION, prompts, rl_config
from tests.integration.test_rollout_hf import TinyTokenizer
from tests.integration.test_tiny_training import copy_task, tiny_config

WINDOW = 4  # shorter than the 5-, 7- and 9-token sequences of `_examples`, so the window changes the logits

# family -> (transformers model_type, config overrides, the attention load_model picks for it on CPU)
FAMILIES = {
    "llama": ("llama", {}, PACKED_ATTENTION),
    "qwen2": ("qwen2", {}, PACKED_ATTENTION),
    "qwen3": ("qwen3", {}, PACKED_ATTENTION),  # q/k norms
    "qwen2_moe": ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=64), PACKED_ATTENTION),  # keeps sliding_window=0
    "qwen3_moe": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32), PACKED_ATTENTION),
    # soft-capping has no sdpa path in transformers: eager (whose mask also separates packed sequences)
    "gemma2": ("gemma2", dict(sliding_window=WINDOW, attn_logit_softcapping=1.0, final_logit_softcapping=5.0,
                              initializer_range=0.5), "eager"),  # large weights: the capping changes the logits
    "gemma3_text": ("gemma3_text", dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]),
                    "sdpa"),  # sliding layers: sdpa with transformers' packed sliding-window mask
    "mistral": ("mistral", dict(sliding_window=WINDOW), "sdpa"),
    "phi3": ("phi3", {}, PACKED_ATTENTION),  # fused qkv_proj and gate_up_proj
    "smollm3": ("smollm3", dict(no_rope_layer_interval=2), PACKED_ATTENTION),  # layer 2 of 2 without RoPE (NoPE)
}
COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _installed(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


INSTALLED = [name for name, (model_type, _, _) in FAMILIES.items() if _installed(model_type)]
family = pytest.mark.parametrize("name", INSTALLED)
# Families whose logits are not their lm_head's output as it is: checked against oxRL's chunked log-probs only.
SCALED_LOGITS = {
    "cohere": ("cohere", dict(logit_scale=0.25), "sdpa"),  # logits * logit_scale
    "granite": ("granite", dict(logits_scaling=4.0), "sdpa"),  # logits / logits_scaling
}


def save_tiny(name: str, folder, seed: int = 0):
    """A tiny random model of family `name`, saved as a Hugging Face folder; the folder."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, overrides, _ = {**FAMILIES, **SCALED_LOGITS}[name]
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **COMMON, **overrides)).save_pretrained(folder)
    return str(folder)


def load(folder: str, lora: LoraConfig | None = None):
    return load_model(ModelConfig(name_or_path=folder), torch.device("cpu"), lora)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def moved(model, before) -> bool:
    return any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters() if n in before)


def even_tokens(prompt: str, completion: str) -> float:
    """Share of even token ids: varies within a group from the first step, so GRPO has a signal."""
    words = completion.split()
    return sum(int(w) % 2 == 0 for w in words) / max(1, len(words))


@family
def test_packed_rows_equal_each_sequence_alone_under_eager(name, tmp_path, oxrl_log):
    from transformers import AutoModelForCausalLM

    folder = save_tiny(name, tmp_path / name)
    with oxrl_log.at_level(logging.INFO, logger="oxrl"):
        model = load(folder).eval()
    assert model.config._attn_implementation == FAMILIES[name][2]
    if model.config._attn_implementation != PACKED_ATTENTION:
        assert f"keeping attention {model.config._attn_implementation!r} for" in oxrl_log.text  # the reason, logged
    eager = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    examples = _examples()
    with torch.no_grad():
        packed = forward_logits(model, pack(examples))
        alone = torch.cat([eager(input_ids=torch.tensor([e.sequences[0].input_ids])).logits[0] for e in examples])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", INSTALLED + [name for name, (kind, _, _) in SCALED_LOGITS.items() if _installed(kind)])
def test_chunked_logprobs_equal_the_full_logits(name, tmp_path, monkeypatch):
    """Long rows' log-probs and entropy come from the hidden states a chunk at a time (oxrl/models/lm_head.py):
    the same values and gradients as from the model's own logits, with each family's soft-capping or scale."""
    model = load(save_tiny(name, tmp_path / name))
    batch = pack(_examples())
    results = []
    for full_elements in (2**40, 0):  # the plain path, then every row chunked (3 rows of the vocabulary at a time)
        monkeypatch.setattr(lm_head, "FULL_LOGITS_ELEMENTS", full_elements)
        monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 3 * COMMON["vocab_size"])
        model.zero_grad()
        logprobs, entropy = token_logprobs(model, batch, temperature=0.7, with_entropy=True)
        (logprobs.sum() + 0.1 * entropy.sum()).backward()
        results.append((logprobs.detach(), entropy.detach(), *(p.grad.clone() for p in model.parameters())))
    assert results[0][0].abs().sum() > 0
    for full, chunked in zip(*results):  # fp32 sums in another order: within 2e-5 of each tensor's largest entry
        assert float((chunked - full).abs().max()) <= 2e-5 * float(full.abs().max()) + 1e-6


@family
def test_one_sft_step_moves_the_weights(name, tmp_path):
    model = load(save_tiny(name, tmp_path / name))
    before = snapshot(model)
    result = train_offline(tiny_config(tmp_path, max_steps=1), get_objective("sft"), model, None, copy_task(4), [],
                           SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0), tmp_path / "run")
    assert math.isfinite(result.losses[0]) and moved(model, before)


@family
def test_one_dpo_step_moves_the_weights(name, tmp_path):
    folder = save_tiny(name, tmp_path / name)
    model, reference = load(folder), FrozenModel(load(folder).eval().requires_grad_(False))
    before = snapshot(model)
    cfg = preference_config(tmp_path, max_steps=1)
    result = train_offline(cfg, get_objective("dpo", cfg.preference), model, None, preference_pairs(4), [],
                           SingleDevice(torch.device("cpu"), "no"), tmp_path / "run", reference)
    assert result.losses[0] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference
    assert moved(model, before)


@family
def test_one_grpo_step_moves_the_weights(name, tmp_path):
    model = load(save_tiny(name, tmp_path / name))
    before = snapshot(model)
    cfg = rl_config(tmp_path, "grpo")
    cfg.train.max_steps = 1
    reward = build_reward_fn([{"name": "tests.integration.test_architectures:even_tokens"}])
    torch.manual_seed(0)
    result = train_rl(rl_handles(cfg, model, HFEngine(model, TinyTokenizer()), reward), prompts(4), NO_VALIDATION,
                      tmp_path / "run")
    assert math.isfinite(result.final_metrics["loss"]) and moved(model, before)


@family
def test_lora_adapts_attention_and_mlp_projections(name, tmp_path):
    model = load(save_tiny(name, tmp_path / name), LoraConfig(enabled=True))  # the default: all-linear
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in model.named_parameters()
               if p.requires_grad and ".lora_" in n}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert all(".lora_" in n for n in trainable)
    assert adapted & {"q_proj", "k_proj", "v_proj", "qkv_proj"} and "o_proj" in adapted, adapted
    # Qwen2-MoE: the shared expert only (its routed experts are fused 3-D parameters peft leaves alone);
    # Qwen3-MoE: peft wraps the fused `experts` parameters themselves.
    assert adapted & {"gate_proj", "up_proj", "down_proj", "gate_up_proj", "experts"}, adapted


# Qwen3-MoE's experts are fused 3-D parameters that peft wraps in a `ParamWrapper` with no `.weight`: the
# on-the-fly merge refuses them with a clear error instead of computing something else.
UNMERGEABLE = {"qwen3_moe": "Qwen3MoeExperts"}


@family
def test_merged_lora_weights_give_the_adapted_logits(name, tmp_path):
    # What RL syncs to the rollout engine under LoRA (oxrl/models/lora.py:merged_state_dict).
    folder = save_tiny(name, tmp_path / name)
    model = load(folder, LoraConfig(enabled=True)).eval()
    with torch.no_grad():  # lora_B starts at 0: make every adapter change the output
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.1)
    plain = load(folder).eval()
    if name in UNMERGEABLE:
        with pytest.raises(NotImplementedError, match=f"LoRA on {UNMERGEABLE[name]} .* cannot be merged on the fly"):
            merged_state_dict(model)
        return
    plain.load_state_dict(merged_state_dict(model))
    ids = torch.randint(3, 128, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


@family
def test_saved_folder_reloads_with_the_same_logits(name, tmp_path):
    from transformers import AutoModelForCausalLM

    model = load(save_tiny(name, tmp_path / name)).eval()
    out = save_hf_folder(model, None, tmp_path / "saved")
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(3, 128, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not _installed("qwen3_next"), reason="transformers without Qwen3-Next")
def test_linear_attention_layers_mix_packed_sequences_so_the_family_is_refused(tmp_path):
    """Qwen3-Next (and Qwen3.5's language model) interleave Gated DeltaNet layers with attention: their
    recurrent state runs from one packed sequence into the next. Shown here, then refused by name."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from oxrl.models.load import UnsupportedModelError

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "qwen3_next", **COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"])
    model = AutoModelForCausalLM.from_config(config).eval()
    first, second = [3, 5, 7, 9, 11], [4, 6, 8, 10, 12, 14]
    with torch.no_grad():
        packed = model(input_ids=torch.tensor([first + second]),
                       position_ids=torch.tensor([list(range(5)) + list(range(6))])).logits[0, 5:]
        alone = model(input_ids=torch.tensor([second])).logits[0]
    assert (packed - alone).abs().max() > 1e-3  # the second sequence sees the first through the recurrent state
    model.save_pretrained(tmp_path / "m")
    with pytest.raises(UnsupportedModelError, match="qwen3_next: its linear_attention layers would carry state"):
        load(str(tmp_path / "m"))
