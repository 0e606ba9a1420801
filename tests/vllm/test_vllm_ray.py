"""Ray rollout workers that own vLLM engines (disaggregated from the trainer): one trainer (this process) and two
vLLM rollout actors; every update's weights are broadcast to both and checked by the probe on each, and the
reward of a learnable task rises."""

import pytest
import torch

from oxrl.config.schema import Config
from oxrl.data.types import RLPromptBatch
from oxrl.loops.rl import RLHandles, train_rl
from oxrl.rewards.combine import build_reward_fn
from oxrl.rollout.build import VLLM_INSTALL_HINT
from oxrl.training.strategy import SingleDevice
from tests.vllm.conftest import make_model

pytest.importorskip("vllm", reason=f"vLLM is not installed: {VLLM_INSTALL_HINT}")
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'oxrl[ray]')")


def test_two_vllm_rollout_workers_get_every_update_and_the_reward_rises(tokenizer, tmp_path):
    from pathlib import Path

    from oxrl.cluster.remote_engine import RemoteWorkers
    from oxrl.cluster.workers import RolloutWorker

    folder = tmp_path / "model"
    make_model(5).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    cfg = Config.model_validate({
        "run": {"name": "grpo", "output_dir": str(tmp_path), "seed": 0, "launcher": "ray"},
        "model": {"name_or_path": str(folder)}, "algorithm": {"name": "grpo"},
        "rl": {"prompts_per_step": 4, "rollout": {"engine": "vllm", "n": 4, "max_new_tokens": 4, "temperature": 1.0,
                                                  "vllm": {"max_model_len": 256, "kv_cache_gib": 0.25}}},
        "train": {"max_steps": 16, "micro_batch_size_per_device": 8,
                  "optim": {"lr": 2e-2, "schedule": "constant", "max_grad_norm": 1.0}},
        "ray": {"rollout": {"count": 2}},
        "logging": {"progress_bar": False, "plot": False},
    })
    repo = str(Path(__file__).resolve().parents[2])
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": repo, "OMP_NUM_THREADS": "1"}})
    try:
        actors = [ray.remote(RolloutWorker).options(num_cpus=1).remote(cfg, i) for i in range(2)]
        model = make_model(5)
        strategy = SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0)
        engine = RemoteWorkers(actors, [], cfg.ray).engine(model, tokenizer, strategy, "float32", None)
        ids = [[1, 4 + i, 5 + i] for i in range(8)]
        train = RLPromptBatch(ids, [tokenizer.decode(p) for p in ids], [{} for _ in ids], [f"row {i}" for i in range(8)])
        h = RLHandles(cfg, model, strategy, engine, build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}]),
                      tokenizer=tokenizer, shared_rollouts=True)
        result = train_rl(h, train, RLPromptBatch([], [], [], []), tmp_path / "run")
    finally:
        ray.shutdown()
    first, last = sum(result.rewards[:4]) / 4, sum(result.rewards[-4:]) / 4
    assert last > first + 0.2, result.rewards
    assert result.final_metrics["weight_sync/probe_gap"] < 1e-4  # the trainer's against each vLLM worker's


class _OneNamePerTiedPair(SingleDevice):
    """Gathers the policy's weights as a sharded strategy may: a tied output embedding only under the input's name."""

    def policy_state_dict(self):
        state = super().policy_state_dict()
        del state["lm_head.weight"]
        return state


def test_weights_go_straight_into_vllm_and_a_tied_output_embedding_follows(tokenizer, tmp_path):
    """The broadcast lands in vLLM's own process (the worker keeps no copy of the model); vLLM's untied copy of a
    tied output embedding is loaded from the input embedding; a new group generation (as after a restart) works."""
    from pathlib import Path

    from oxrl.cluster.remote_engine import RemoteWorkers
    from oxrl.cluster.workers import RolloutWorker
    from oxrl.rollout.probe import trainer_probe_logprobs

    folder = tmp_path / "model"
    make_model(3, tied=True).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    cfg = Config.model_validate({
        "run": {"name": "grpo", "output_dir": str(tmp_path), "launcher": "ray"},
        "model": {"name_or_path": str(folder)}, "algorithm": {"name": "grpo"},
        "rl": {"rollout": {"engine": "vllm", "vllm": {"max_model_len": 256, "kv_cache_gib": 0.25}}},
        "ray": {"rollout": {"count": 1}},
    })
    repo = str(Path(__file__).resolve().parents[2])
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": repo, "OMP_NUM_THREADS": "1"}})
    try:
        actor = ray.remote(RolloutWorker).options(num_cpus=1).remote(cfg, 0)
        assert ray.get(actor.members.remote()) == 1  # one vLLM process (tensor_parallel_size 1) joins the group
        model = make_model(3, tied=True)
        strategy = _OneNamePerTiedPair(torch.device("cpu"))
        strategy.prepare(model, None)
        engine = RemoteWorkers([actor], [], cfg.ray).engine(model, tokenizer, strategy, "float32", None)
        engine.sync_weights(model)
        before = trainer_probe_logprobs(model, engine.probe)
        with torch.no_grad():
            model.model.embed_tokens.weight.add_(0.5 * torch.randn_like(model.model.embed_tokens.weight))
        moved = float((trainer_probe_logprobs(model, engine.probe) - before).abs().mean())
        assert moved > 100 * engine.tolerance  # a stale output embedding in vLLM could not pass the probe
        assert engine.sync_weights(model)["weight_sync/probe_gap"] < 1e-4
        engine.groups[0].channel = None  # the next sync forms generation 2 of the group, as after a worker's restart
        with torch.no_grad():
            model.model.norm.weight.mul_(1.5)
        assert engine.sync_weights(model)["weight_sync/probe_gap"] < 1e-4
        assert engine.generation == 2
    finally:
        ray.shutdown()
