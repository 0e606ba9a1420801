"""Online DPO and SPIN with vLLM rollouts: the engine gets the policy after every update (Online DPO) or the
opponent at every iteration's end (SPIN), each sync checked by vLLM's probe."""

import pytest
import torch

from oxrl.config.schema import Config
from oxrl.data.types import RLPromptBatch
from oxrl.loops.online import build_online
from oxrl.loops.rl import RLHandles, train_rl
from oxrl.rewards.combine import build_reward_fn
from oxrl.rollout.build import VLLM_INSTALL_HINT
from oxrl.training.strategy import SingleDevice
from tests.vllm.conftest import make_model

pytest.importorskip("vllm", reason=f"vLLM is not installed: {VLLM_INSTALL_HINT}")


def online_run(engine, tokenizer, tmp_path, algorithm: str, steps: int, **sections):
    cfg = Config.model_validate({
        "run": {"name": algorithm, "output_dir": str(tmp_path), "seed": 0},
        "model": {"name_or_path": "unused"}, "algorithm": {"name": algorithm},
        "rl": {"prompts_per_step": 4, "rollout": {"engine": "vllm", "n": 4, "max_new_tokens": 4, "temperature": 1.0}},
        "preference": {"beta": 0.5},
        "train": {"max_steps": steps, "micro_batch_size_per_device": 8,
                  "optim": {"lr": 2e-2, "schedule": "constant", "max_grad_norm": 1.0}},
        "logging": {"progress_bar": False, "plot": False}, **sections,
    })
    model = make_model(5)
    strategy = SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0)
    ids = [[1, 4 + i, 5 + i] for i in range(8)]
    train = RLPromptBatch(ids, [tokenizer.decode(p) for p in ids], [{"response": "7 9 7"} for _ in ids],
                          [f"row {i}" for i in range(8)])
    online, sampled = build_online(cfg, model, tokenizer, strategy, len(ids))
    engine.sync_weights(sampled)
    h = RLHandles(cfg, model, strategy, engine, build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}]),
                  tokenizer=tokenizer, online=online)
    return train_rl(h, train, RLPromptBatch([], [], [], []), tmp_path / "run"), h


def test_online_dpo_with_vllm_rollouts_raises_the_reward(engine, tokenizer, tmp_path):
    result, _ = online_run(engine, tokenizer, tmp_path, "online_dpo", 16)
    first, last = sum(result.rewards[:4]) / 4, sum(result.rewards[-4:]) / 4
    assert last > first + 0.2, result.rewards
    assert result.final_metrics["weight_sync/probe_gap"] < 1e-4


def test_spin_with_vllm_syncs_the_opponent_at_iteration_ends(engine, tokenizer, tmp_path):
    result, h = online_run(engine, tokenizer, tmp_path, "spin", 4, online={"iteration_steps": 2})
    assert result.final_metrics["spin/iteration"] == 2
    assert result.final_metrics["weight_sync/probe_gap"] < 1e-4  # the last step ended an iteration: synced, checked
    for name, weight in h.model.state_dict().items():  # ... with the opponent that became the policy
        torch.testing.assert_close(h.online.reference.model.state_dict()[name], weight)
