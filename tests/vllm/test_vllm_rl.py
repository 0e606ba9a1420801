"""A short RL run with vLLM rollouts: a trivially learnable reward goes up, strictly on-policy."""

import pytest
import torch

from oxrl.config.schema import Config
from oxrl.training.strategy import SingleDevice
from oxrl.data.types import RLPromptBatch
from oxrl.loops.rl import train_rl
from oxrl.rewards.combine import build_reward_fn
from oxrl.rollout.build import VLLM_INSTALL_HINT
from tests.conftest import rl_handles
from tests.vllm.conftest import make_model

pytest.importorskip("vllm", reason=f"vLLM is not installed: {VLLM_INSTALL_HINT}")


def test_reward_goes_up_with_vllm_rollouts(engine, tokenizer, tmp_path):
    cfg = Config.model_validate({
        "run": {"name": "vllm-rl", "output_dir": str(tmp_path), "seed": 0},
        "model": {"name_or_path": "unused"},
        "algorithm": {"name": "dr_grpo"},
        # strict_on_policy: every step, vLLM's sampled log-probs must match the trainer's (the sync worked).
        # 8 x 8 completions of 4 tokens: the random model samples "7" about once in 128 tokens, so a step of 64
        # tokens often has none (no signal) and whether learning starts within 16 steps depended on vLLM's
        # draws, which differ between CPUs; with 256 tokens a step nearly every step has one.
        "rl": {"prompts_per_step": 8, "rollout": {"engine": "vllm", "n": 8, "max_new_tokens": 4, "temperature": 1.0},
               "strict_on_policy": True},
        "train": {"max_steps": 16, "micro_batch_size_per_device": 8, "optim": {"lr": 2e-2, "schedule": "constant", "max_grad_norm": 1.0}},
        "logging": {"progress_bar": False, "plot": False},
    })
    model = make_model(5)
    engine.sync_weights(model)
    ids = [[1, 4 + i, 5 + i] for i in range(8)]
    train = RLPromptBatch(ids, [tokenizer.decode(p) for p in ids], [{} for _ in ids], [f"row {i}" for i in range(8)])
    reward = build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}])  # the words "7" in the decoded text
    h = rl_handles(cfg, model, engine, reward, SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0), tokenizer=tokenizer)
    result = train_rl(h, train, RLPromptBatch([], [], [], []), tmp_path / "run")
    first, last = sum(result.rewards[:4]) / 4, sum(result.rewards[-4:]) / 4
    assert last > first + 0.2, result.rewards
    assert result.final_metrics["logprob_mismatch/mean_abs"] < 1e-4
    assert result.final_metrics["weight_sync/probe_gap"] < 1e-4 and result.final_metrics["time/weight_sync"] > 0


def test_ppo_with_a_shared_value_head_syncs_only_the_policy_to_vllm(engine, tokenizer, tmp_path):
    """The value head lives on the policy module; vLLM receives the architecture's weights alone, and the
    engine's log-probs still equal the trainer's (strict_on_policy) while the head trains."""
    from oxrl.loops.critic import SharedValueHead
    from oxrl.models.value_head import attach_value_head

    cfg = Config.model_validate({
        "run": {"name": "vllm-ppo", "output_dir": str(tmp_path), "seed": 0},
        "model": {"name_or_path": "unused"},
        "algorithm": {"name": "ppo"},
        "rl": {"prompts_per_step": 4, "rollout": {"engine": "vllm", "n": 4, "max_new_tokens": 4, "temperature": 1.0},
               "strict_on_policy": True, "critic_backbone": "shared"},
        "train": {"max_steps": 3, "micro_batch_size_per_device": 8, "optim": {"lr": 1e-2, "schedule": "constant"}},
        "logging": {"progress_bar": False, "plot": False},
    })
    model = make_model(5)
    head = attach_value_head(model)
    engine.sync_weights(model)
    ids = [[1, 4 + i, 5 + i] for i in range(8)]
    train = RLPromptBatch(ids, [tokenizer.decode(p) for p in ids], [{} for _ in ids], [f"row {i}" for i in range(8)])
    reward = build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}])
    h = rl_handles(cfg, model, engine, reward, SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0), tokenizer=tokenizer)
    h.critic = SharedValueHead(head, cfg.rl.value_coef, cfg.rl.value_clip)
    before = head.weight.detach().clone()
    result = train_rl(h, train, RLPromptBatch([], [], [], []), tmp_path / "run")
    assert result.final_metrics["weight_sync/probe_gap"] < 1e-4 and result.final_metrics["critic/loss"] > 0
    assert not torch.equal(head.weight, before)  # the head trained; vLLM never saw it

