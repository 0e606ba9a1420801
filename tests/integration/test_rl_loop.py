"""The RL loop on a tiny random model: a trivially learnable reward goes up; strict on-policy works."""

import copy
import dataclasses

import pytest
import torch

from oxrl.config.schema import Config
from oxrl.training.strategy import SingleDevice
from oxrl.data.types import RLPromptBatch
from oxrl.loops.rl_update import OffPolicyError
from oxrl.loops.rl import train_rl
from oxrl.rewards.combine import build_reward_fn
from oxrl.rollout.hf import HFEngine
from tests.conftest import make_tiny_critic, make_tiny_llama, rl_handles
from tests.integration.test_rollout_hf import TinyTokenizer

TARGET = 7


def share_of_sevens(prompt: str, completion: str) -> float:
    """Reward: the fraction of completion tokens that are token 7 (decoded as the word '7')."""
    words = completion.split()
    return sum(w == str(TARGET) for w in words) / max(1, len(words))


NO_VALIDATION = RLPromptBatch([], [], [], [])


def rl_config(tmp_path, algorithm: str, **rl) -> Config:
    return Config.model_validate({
        "run": {"name": algorithm, "output_dir": str(tmp_path), "seed": 0},
        "model": {"name_or_path": "unused"},
        "algorithm": {"name": algorithm},
        "rl": {"prompts_per_step": 4, "rollout": {"n": 4, "max_new_tokens": 4, "temperature": 1.0},
               **({"critic_lr": 1e-2} if algorithm == "ppo" else {}), **rl},
        "train": {"max_steps": 16, "micro_batch_size_per_device": 8, "optim": {"lr": 2e-2, "schedule": "constant", "max_grad_norm": 1.0}},
        "logging": {"progress_bar": False, "plot": False},
    })


def prompts(n: int = 8) -> RLPromptBatch:
    ids = [[1, 3 + i, 4 + i] for i in range(n)]
    return RLPromptBatch(ids, [" ".join(map(str, p)) for p in ids], [{} for _ in ids], [f"row {i}" for i in range(n)])


def _run(tmp_path, algorithm, engine_model=None, **rl):
    cfg = rl_config(tmp_path, algorithm, **rl)
    torch.manual_seed(0)
    model = make_tiny_llama()
    engine = HFEngine(engine_model if engine_model is not None else model, TinyTokenizer())
    if engine_model is not None:
        engine.sync_weights = lambda m: {}  # a stale engine that never receives the new weights
    reward = build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}])
    critic = make_tiny_critic() if algorithm == "ppo" else None
    return train_rl(rl_handles(cfg, model, engine, reward, critic_model=critic), prompts(), NO_VALIDATION,
                    tmp_path / algorithm)


@pytest.mark.parametrize("algorithm", ["dr_grpo", "grpo", "rloo", "cispo", "ppo"])
def test_trivially_learnable_reward_goes_up(tmp_path, algorithm):
    result = _run(tmp_path, algorithm)
    first, last = sum(result.rewards[:4]) / 4, sum(result.rewards[-4:]) / 4
    assert last > first + 0.2, result.rewards


def test_strict_on_policy_passes_when_the_engine_is_the_policy(tmp_path):
    cfg_result = _run(tmp_path, "dr_grpo", strict_on_policy=True)
    assert len(cfg_result.rewards) == 16


def test_strict_on_policy_catches_a_stale_engine(tmp_path):
    torch.manual_seed(0)
    stale = make_tiny_llama(seed=5)  # different weights from the policy being trained
    with pytest.raises(OffPolicyError, match="stale or different weights"):
        _run(tmp_path, "dr_grpo", engine_model=stale, strict_on_policy=True)


def test_ppo_critic_warmup_keeps_the_policy_still(tmp_path):
    cfg = rl_config(tmp_path, "ppo", critic_warmup_steps=3)
    cfg.train.max_steps = 3
    model = make_tiny_llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    critic = make_tiny_critic()
    critic_before = {n: p.detach().clone() for n, p in critic.named_parameters()}
    reward = build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}])
    train_rl(rl_handles(cfg, model, HFEngine(model, TinyTokenizer()), reward, critic_model=critic), prompts(),
             NO_VALIDATION, tmp_path / "warm")
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert any(not torch.equal(p, critic_before[n]) for n, p in critic.named_parameters())


TIS = {"off_policy_correction": "tis", "off_policy_cap": 2.0}


def test_engine_mismatch_is_measured_and_tis_reweights(tmp_path):
    """A synced engine shows no engine/trainer mismatch and TIS weights of exactly 1; a stale engine
    shows a positive KL and TIS weights that differ from 1 and are capped at `off_policy_cap`."""
    synced = _run(tmp_path / "synced", "dr_grpo", **TIS).final_metrics
    assert synced["logprob_mismatch/kl"] == pytest.approx(0.0, abs=1e-8)
    assert synced["off_policy/weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert synced["off_policy/truncated_frac"] == 0.0
    stale = _run(tmp_path / "stale", "dr_grpo", engine_model=make_tiny_llama(seed=5), **TIS).final_metrics
    assert stale["logprob_mismatch/kl"] > 1e-3
    assert stale["off_policy/weight_mean"] != pytest.approx(1.0, abs=1e-3)
    assert 0.0 < stale["off_policy/truncated_frac"] < 1.0  # some tokens the trainer likes far more than the engine did
    assert stale["off_policy/weight_mean"] <= 2.0


@pytest.mark.parametrize("algorithm", ["dr_grpo", "ppo"])
def test_single_update_uses_its_own_logprobs_as_old_exactly_like_a_separate_pass(tmp_path, algorithm):
    """One update per rollout: the old log-probs taken from the update's own forward (detached) give the same
    loss, gradients and metrics as scoring them in a separate no-grad pass first."""
    from oxrl.loops.rl_update import score_logprobs
    from oxrl.loops.rl import rollout_metrics
    from oxrl.loops.rl import estimate, sample, score, single_on_policy_update
    from oxrl.loops.rl_update import update

    cfg = rl_config(tmp_path, algorithm, **TIS, strict_on_policy=True)
    model = make_tiny_llama()
    critic = make_tiny_critic() if algorithm == "ppo" else None
    torch.manual_seed(0)
    reward = build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}])
    h = rl_handles(cfg, model, HFEngine(model, TinyTokenizer()), reward, critic_model=critic)
    assert single_on_policy_update(h.cfg)
    h.policy = model
    rollout, _ = sample(h, prompts(4), 1)
    score(h, rollout)
    estimate(h, rollout)
    assert rollout.old_logprobs is None and "logprob_mismatch/mean_abs" not in rollout_metrics(rollout)
    h.cfg.train.micro_batch_size_per_device = 3  # the own-log-prob path must also sum its mismatch over micro-batches
    results = {}
    for mode in ("own", "separate"):
        policy = copy.deepcopy(model)
        rollout.old_logprobs = None if mode == "own" else score_logprobs(policy, rollout.completions, 3, 1.0)
        strategy = SingleDevice(torch.device("cpu"), "no", max_grad_norm=None)
        strategy.prepare(policy, torch.optim.SGD(policy.parameters(), lr=0.0))
        results[mode] = update(dataclasses.replace(h, policy=policy, strategy=strategy, critic=None), rollout, step=1)
    own, separate = results["own"], results["separate"]
    assert own["logprob_mismatch/mean_abs"] < 1e-5 and own["logprob_mismatch/kl"] < 1e-8
    for key in ("loss", "pg_loss", "grad_norm", "off_policy/weight_mean", "approx_kl", "ratio_mean"):
        assert own[key] == pytest.approx(separate[key], rel=1e-5, abs=1e-7), key


def test_single_update_strict_check_catches_a_stale_engine_before_stepping(tmp_path):
    stale = make_tiny_llama(seed=5)
    cfg = rl_config(tmp_path, "dr_grpo", strict_on_policy=True)
    cfg.train.max_steps = 1
    model = make_tiny_llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    reward = build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}])
    with pytest.raises(OffPolicyError, match="stale or different weights"):
        train_rl(rl_handles(cfg, model, HFEngine(stale, TinyTokenizer()), reward, SingleDevice(torch.device("cpu"), "no")),
                 prompts(), NO_VALIDATION, tmp_path / "stale")
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # refused before the optimizer step
