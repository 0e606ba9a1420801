"""PPO with a shared-backbone critic (`rl.critic_backbone: shared`): one forward gives log-probs and values,
the run learns, the final folder stays a clean causal LM with the head beside it, and resume is exact."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from oxrl.models.logprobs import token_logprobs
from oxrl.config.schema import Config
from oxrl.data.types import pack
from oxrl.loops.critic import SharedValueHead, value_rows
from oxrl.loops.rl import train_rl
from oxrl.loops.rl_update import completion_example, policy_rows
from oxrl.models.save import save_hf_folder
from oxrl.models.value_head import VALUE_HEAD_FILE, attach_value_head
from oxrl.rewards.combine import build_reward_fn
from oxrl.rollout.base import Completion
from oxrl.rollout.hf import HFEngine
from tests.conftest import make_tiny_critic, make_tiny_llama, rl_handles
from tests.integration.test_rl_loop import NO_VALIDATION, prompts
from tests.system.test_rl_resume import rows_by_step
from tests.integration.test_rollout_hf import TinyTokenizer


def completions() -> list[Completion]:
    """Two completions, one a multi-turn episode with environment tokens and a restarted context."""
    return [Completion(0, [1, 5, 6], [7, 8, 9], [-1.0] * 3, "eos", ""),
            Completion(1, [1, 4], [10, 11, 12, 13, 14, 15], [-1.0] * 3, "eos", "",
                       loss_mask=[True, False, False, False, True, True], context_starts=[3])]


def with_random_head(model):
    head = attach_value_head(model)
    torch.nn.init.normal_(head.weight)  # values far from 0, so that a misaligned one shows
    torch.nn.init.normal_(head.bias)
    return head


def test_one_forward_gives_the_logprobs_and_the_values_of_the_final_hidden_state():
    model = make_tiny_llama().eval()
    head = with_random_head(model)
    batch = pack([completion_example(c) for c in completions()])
    alone, alone_entropy = token_logprobs(model, batch, with_entropy=True)
    logprobs, entropy, values = token_logprobs(model, batch, with_entropy=True, value_head=head)
    assert torch.equal(logprobs, alone) and torch.equal(entropy, alone_entropy)

    out = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False, output_hidden_states=True)
    final = out.hidden_states[-1][0]  # [T, H]
    # The installed transformers gives the final norm's output last: the backbone's output, what the LM head reads.
    backbone = model.model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    assert torch.equal(final, backbone.last_hidden_state[0])
    assert torch.allclose(model.lm_head(final), out.logits[0], atol=1e-6)
    positions = torch.nonzero(batch.loss_mask[0], as_tuple=True)[0]
    by_hand = torch.zeros_like(values).index_put((positions,), final[positions - 1] @ head.weight[0] + head.bias[0])
    assert torch.allclose(values, by_hand, atol=1e-6)
    assert values[positions].abs().min() > 0 and (values != 0).sum() == positions.numel()


def test_shared_values_line_up_with_the_separate_critics():
    """A separate critic with the policy's backbone and the head's weights gives the same values per token."""
    model = make_tiny_llama().eval()
    head = with_random_head(model)
    critic = make_tiny_critic().eval()
    critic.model.load_state_dict(model.model.state_dict())
    critic.score.load_state_dict(head.state_dict())
    batch = pack([completion_example(c) for c in completions()])
    with torch.no_grad():
        _, _, shared, valid = policy_rows(model, batch, 1.0, False, value_head=head)
        separate, separate_valid = value_rows(critic, completions(), torch.device("cpu"))
    assert torch.equal(valid, separate_valid)
    assert torch.allclose(shared, separate, atol=1e-5)


def shared_config(tmp_path, name: str = "ppo", **settings) -> Config:
    return Config.model_validate({
        "run": {"name": name, "output_dir": str(tmp_path), "seed": 0},
        "model": {"name_or_path": "unused"},
        "algorithm": {"name": "ppo"},
        "rl": {"prompts_per_step": 4, "rollout": {"n": 4, "max_new_tokens": 4, "temperature": 1.0},
               "critic_backbone": "shared", **settings},
        "train": {"max_steps": 16, "micro_batch_size_per_device": 8,
                  "optim": {"lr": 2e-2, "schedule": "constant", "max_grad_norm": 1.0}},
        "logging": {"progress_bar": False, "plot": False},
    })


def parity_of_prompt(prompt: str, completion: str) -> float:
    """Reward: 1 for prompts whose second token is even. The policy cannot change it: the value targets hold still."""
    return float(int(prompt.split()[1]) % 2 == 0)


def shared_handles(cfg, model, reward: str = "tests.integration.test_rl_loop:share_of_sevens"):
    """The loop's handles for PPO with the value head on `model` (as oxrl/runner.py builds them)."""
    reward = build_reward_fn([{"name": reward}])
    h = rl_handles(cfg, model, HFEngine(model, TinyTokenizer()), reward)
    return dataclasses.replace(h, critic=SharedValueHead(attach_value_head(model), h.cfg.rl.value_coef, h.cfg.rl.value_clip))


def test_ppo_with_a_shared_head_learns_and_every_parameter_moves(tmp_path):
    torch.manual_seed(0)
    model = make_tiny_llama()
    h = shared_handles(shared_config(tmp_path), model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert "value_head.weight" in before
    result = train_rl(h, prompts(), NO_VALIDATION, tmp_path / "ppo")
    first, last = sum(result.rewards[:4]) / 4, sum(result.rewards[-4:]) / 4
    assert last > first + 0.2, result.rewards
    rows = rows_by_step(tmp_path / "ppo")
    assert {"critic/loss", "critic/clip_frac", "critic/abs_error", "pg_loss"} <= set(rows[1])
    assert "critic/grad_norm" not in rows[1]  # one step, the policy's: no critic step of its own
    unmoved = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert not unmoved


def test_the_shared_heads_value_loss_falls(tmp_path):
    """On rewards the policy cannot move. (While share_of_sevens is learnt, the returns grow with the reward and
    the value loss grows with them, for a separate critic as much as for a shared head.)"""
    torch.manual_seed(0)
    h = shared_handles(shared_config(tmp_path), make_tiny_llama(), "tests.integration.test_shared_value_head:parity_of_prompt")
    train_rl(h, prompts(), NO_VALIDATION, tmp_path / "ppo")
    rows = rows_by_step(tmp_path / "ppo")
    critic_loss = [rows[step]["critic/loss"] for step in sorted(rows)]
    assert sum(critic_loss[-4:]) / 4 < 0.7 * sum(critic_loss[:4]) / 4, critic_loss


def test_critic_warmup_trains_the_head_alone(tmp_path):
    cfg = shared_config(tmp_path, critic_warmup_steps=3)
    cfg.train.max_steps = 3
    model = make_tiny_llama()
    h = shared_handles(cfg, model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    train_rl(h, prompts(), NO_VALIDATION, tmp_path / "warm")
    moved = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert moved == {"value_head.weight", "value_head.bias"}
    assert "pg_loss" not in rows_by_step(tmp_path / "warm")[3]


def test_the_final_folder_is_a_clean_causal_lm_with_the_head_beside_it(tmp_path):
    from transformers import AutoModelForCausalLM

    for tied in (False, True):
        model = make_tiny_llama(tie_word_embeddings=tied)
        head = with_random_head(model)
        folder = save_hf_folder(model, None, tmp_path / f"tied_{tied}")
        loaded, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
        assert not info["unexpected_keys"] and not info["missing_keys"], info
        assert not hasattr(loaded, "value_head")
        ids = torch.tensor([[1, 5, 6, 7]])
        assert torch.equal(loaded(ids).logits, model(ids).logits)
        saved = load_file(folder / VALUE_HEAD_FILE)
        assert set(saved) == {"value_head.weight", "value_head.bias"}
        assert torch.equal(saved["value_head.weight"], head.weight) and torch.equal(saved["value_head.bias"], head.bias)
        reused = attach_value_head(loaded, folder)  # a run that starts from this folder continues the head
        assert torch.equal(reused.weight, head.weight) and torch.equal(reused.bias, head.bias)


def test_with_lora_the_head_trains_beside_the_adapters_and_is_saved_beside_either_folder(tmp_path):
    from oxrl.config.schema import LoraConfig
    from oxrl.models.lora import add_lora

    model = add_lora(make_tiny_llama(), LoraConfig(enabled=True, rank=4))
    head = with_random_head(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert {"base_model.model.value_head.weight", "base_model.model.value_head.bias"} <= trainable
    for lora_save in ("merged", "adapter"):
        folder = save_hf_folder(model, None, tmp_path / lora_save, lora_save=lora_save)
        assert torch.equal(load_file(folder / VALUE_HEAD_FILE)["value_head.weight"], head.weight)
        assert not any("value_head" in key for file in folder.glob("*.safetensors") if file.name != VALUE_HEAD_FILE
                       for key in load_file(file))


def test_a_shared_head_run_through_the_runner_saves_a_clean_final_folder(tmp_path, smollm2_tokenizer):
    from transformers import AutoModelForCausalLM

    from oxrl.config.load import load_config
    from oxrl.runner import run
    from tests.conftest import save_tiny_model

    save_tiny_model(tmp_path / "model", smollm2_tokenizer)
    result = run(load_config(None, base={
        "run": {"name": "shared", "output_dir": str(tmp_path / "runs"), "seed": 0, "device": "cpu"},
        "model": {"name_or_path": str(tmp_path / "model")},
        "algorithm": {"name": "ppo"},
        "rl": {"task": "arithmetic", "task_size": 8, "validation_size": 0, "prompts_per_step": 2,
               "critic_backbone": "shared", "value_coef": 0.25, "rollout": {"n": 2, "max_new_tokens": 4}},
        "train": {"max_steps": 2, "micro_batch_size_per_device": 4},
        "checkpoint": {"every": 1},
        "logging": {"progress_bar": False, "plot": False},
    }))
    rows = rows_by_step(result.run_dir)
    assert rows[2]["critic/loss"] > 0 and "critic/nonfinite_steps" not in rows[2]
    for folder in (result.final_model_dir, result.run_dir / "checkpoints" / "step_000002"):
        _, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
        assert not info["unexpected_keys"] and not info["missing_keys"], (folder, info)
        assert set(load_file(folder / VALUE_HEAD_FILE)) == {"value_head.weight", "value_head.bias"}
    assert not (result.run_dir / "checkpoints" / "step_000002" / "critic").exists()


def train_shared(tmp_path, run_name: str, resume: str | bool = False):
    from tests.system.test_rl_resume import checkpointed_every_2_steps

    cfg = checkpointed_every_2_steps(shared_config(tmp_path, run_name), resume)
    model = make_tiny_llama(seed=7 if resume else 0)  # a resumed run must take every weight from the checkpoint
    torch.manual_seed(0)
    result = train_rl(shared_handles(cfg, model), prompts(), NO_VALIDATION, tmp_path / run_name)
    return result, rows_by_step(tmp_path / run_name), model


def test_shared_head_ppo_resumed_from_a_checkpoint_repeats_the_uninterrupted_steps(tmp_path):
    full, full_rows, full_model = train_shared(tmp_path, "full")
    checkpoint = tmp_path / "full" / "checkpoints" / "step_000002"
    assert set(load_file(checkpoint / VALUE_HEAD_FILE)) == {"value_head.weight", "value_head.bias"}
    resumed, resumed_rows, resumed_model = train_shared(tmp_path, "resumed", str(checkpoint))
    assert resumed.rewards == pytest.approx(full.rewards[2:], abs=1e-6)
    assert sorted(resumed_rows) == [3, 4]
    for step in (3, 4):
        for key in ("reward/mean", "loss", "pg_loss", "grad_norm", "critic/loss", "critic/abs_error", "lr"):
            assert resumed_rows[step][key] == pytest.approx(full_rows[step][key], rel=1e-6, abs=1e-6), (step, key)
    assert torch.allclose(resumed_model.value_head.weight, full_model.value_head.weight, atol=1e-6)


def test_shared_head_is_refused_where_it_is_not_supported_before_any_model_loads(tmp_path):
    from oxrl.loops.rl_setup import rl_handles as run_handles

    cfg = shared_config(tmp_path)
    with pytest.raises(ValueError, match="rl.critic_backbone `shared`.*Use rl.critic_backbone: separate"):
        # a strategy that is not one process' (the model "unused" would fail to load: it is never tried)
        run_handles(cfg, SimpleNamespace(device=torch.device("cpu")), None, None, None, 0)
