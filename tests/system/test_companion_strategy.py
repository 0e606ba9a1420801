"""A companion strategy trains a second model (PPO's critic) beside the policy: its own clipping,
schedule and non-finite count, checkpointed in `<checkpoint>/critic/` with the policy, resumed exactly,
on one device and under torchrun (FSDP2, DeepSpeed ZeRO-3) where 1 rank == 2 ranks.

The torchrun runs are scenarios of tests/companion_worker.py, compared with the same training in
this process on one device (tolerances as in tests/system/test_distributed.py: 1e-5 between 1 and 2 ranks,
which differ in summation order only; 1e-6 between a resumed run and the uninterrupted one).
"""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from oxrl.training.nonfinite import NonFiniteError
from oxrl.training.optim import build_optimizer, build_scheduler, lr_factor
from oxrl.training.strategy import SingleDevice
from tests import companion_worker as worker
from tests.conftest import make_tiny_llama
from tests.system.test_distributed import HAS_DEEPSPEED, assert_close, torchrun

CPU = torch.device("cpu")


def single_pair(seed: int = 0):
    strategy = SingleDevice(CPU, "no", max_grad_norm=1.0, max_nonfinite_steps=2)
    return strategy, *worker.prepare_pair(strategy, seed)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_same_tensors(a[key], b[key])
        elif isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def critic_backward(critic, critic_strategy, scale: float = 1.0) -> float:
    ids = worker.rows(1)[0]
    loss = ((critic(input_ids=ids).logits - 1.0) ** 2).sum() * scale
    critic_strategy.backward(loss)
    return float(loss.detach())


# ----------------------------------------------------------------------------- one device


def test_a_companion_clips_to_its_own_norm_follows_its_own_schedule_and_counts_its_own_skips(caplog):
    strategy, _, critic, critic_strategy = single_pair()
    assert type(critic_strategy) is SingleDevice and critic_strategy.device == strategy.device
    assert (critic_strategy.max_grad_norm, strategy.max_grad_norm) == (worker.CRITIC_MAX_GRAD_NORM, 1.0)
    assert critic_strategy.nonfinite.max_consecutive == 2 and critic_strategy.nonfinite.subject == "critic"

    critic_backward(critic, critic_strategy)
    norm = critic_strategy.clip_gradients()
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in critic.parameters()]))
    assert norm > 10 * worker.CRITIC_MAX_GRAD_NORM and float(clipped) == pytest.approx(worker.CRITIC_MAX_GRAD_NORM, rel=1e-4)
    critic_strategy.optimizer.zero_grad()

    critic_backward(critic, critic_strategy)
    critic_strategy.step(1.0, step=1)  # the critic's schedule moves; the policy's does not
    assert critic_strategy.scheduler.get_last_lr()[0] == worker.CRITIC_OPTIM.lr * lr_factor(1, worker.TOTAL_STEPS, worker.CRITIC_OPTIM)
    assert strategy.scheduler.last_epoch == 0

    before = snapshot(critic)
    with caplog.at_level(logging.WARNING):
        critic_backward(critic, critic_strategy, scale=float("nan"))
        critic_strategy.step(float("nan"), step=2)
    assert_same_tensors(before, snapshot(critic))
    assert (critic_strategy.nonfinite.skipped, strategy.nonfinite.skipped) == (1, 0)
    assert "step 2 (critic): non-finite" in caplog.text
    critic_backward(critic, critic_strategy, scale=float("nan"))
    with pytest.raises(NonFiniteError, match=r"step 3 \(critic\).*2 such steps in a row"):
        critic_strategy.step(float("nan"), step=3)


def test_a_checkpoint_holds_the_companion_and_a_resume_continues_bit_exactly(tmp_path):
    from transformers import AutoModelForTokenClassification

    from oxrl.models.critic import load_critic

    strategy, policy, critic, critic_strategy = single_pair()
    worker.train_steps(strategy, policy, critic, critic_strategy, range(1, 3))
    critic_strategy.nonfinite.skipped = 4  # counts of earlier skipped steps, kept beside the critic's state
    checkpoint = strategy.save_checkpoint(tmp_path, 2, None, {"tokens_seen": 7}, keep_last=5)
    saved = copy.deepcopy({  # the optimizers' state dicts hold the live moment tensors: copies
        "policy": snapshot(policy), "critic": snapshot(critic), "rng": torch.get_rng_state(),
        "policy_optimizer": strategy.optimizer.state_dict(), "critic_optimizer": critic_strategy.optimizer.state_dict(),
        "policy_schedule": strategy.scheduler.state_dict(), "critic_schedule": critic_strategy.scheduler.state_dict()})
    uninterrupted = worker.train_steps(strategy, policy, critic, critic_strategy, range(3, 4))
    after = {"policy": snapshot(policy), "critic": snapshot(critic)}

    assert sorted(p.name for p in (checkpoint / "critic" / "training_state").iterdir()) == \
        ["nonfinite.json", "optimizer.pt", "scheduler.pt"]
    loaded = AutoModelForTokenClassification.from_pretrained(checkpoint / "critic")
    assert loaded.config.architectures == ["LlamaForTokenClassification"] and loaded.config.num_labels == 1
    assert_same_tensors(saved["critic"], loaded.state_dict())
    assert_same_tensors(saved["critic"], load_critic(str(checkpoint / "critic"), CPU).state_dict())  # its own head, kept

    torch.manual_seed(99)  # the resume must bring the checkpoint's RNG back
    resumed, policy, critic, critic_strategy = single_pair(seed=123)
    assert resumed.load_checkpoint(checkpoint) == {"tokens_seen": 7, "step": 2}
    assert_same_tensors(saved["policy"], snapshot(policy))
    assert_same_tensors(saved["critic"], snapshot(critic))
    assert torch.equal(saved["rng"], torch.get_rng_state())
    assert_same_tensors(saved["policy_optimizer"], resumed.optimizer.state_dict())
    assert_same_tensors(saved["critic_optimizer"], critic_strategy.optimizer.state_dict())
    assert saved["policy_schedule"] == resumed.scheduler.state_dict()
    assert saved["critic_schedule"] == critic_strategy.scheduler.state_dict()
    assert critic_strategy.nonfinite.skipped == 4 and resumed.nonfinite.skipped == 0
    assert worker.train_steps(resumed, policy, critic, critic_strategy, range(3, 4)) == uninterrupted
    assert_same_tensors(after["policy"], snapshot(policy))
    assert_same_tensors(after["critic"], snapshot(critic))


def test_a_checkpoint_without_the_companion_folder_is_refused_naming_it(tmp_path):
    alone = SingleDevice(CPU, "no", max_grad_norm=1.0)  # a run without a critic
    model = make_tiny_llama()
    optimizer = build_optimizer(model, worker.POLICY_OPTIM)
    alone.prepare(model, optimizer, build_scheduler(optimizer, worker.TOTAL_STEPS, worker.POLICY_OPTIM))
    checkpoint = alone.save_checkpoint(tmp_path, 1, None, {}, keep_last=5)
    assert not (checkpoint / "critic").exists()
    strategy, policy, _, _ = single_pair(seed=5)
    before = snapshot(policy)
    with pytest.raises(FileNotFoundError, match="has no critic/ folder"):
        strategy.load_checkpoint(checkpoint)
    assert_same_tensors(before, snapshot(policy))  # refused before anything was restored


def test_non_finite_companion_weights_are_never_saved(tmp_path):
    strategy, _, critic, _ = single_pair()
    with torch.no_grad():
        critic.score.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"checkpoint step 1 \(critic\).*score.weight"):
        strategy.save_checkpoint(tmp_path, 1, None, {}, keep_last=5)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_attach_takes_only_a_companion_under_a_free_folder_name():
    strategy, *_ = single_pair()
    with pytest.raises(ValueError, match="companion"):
        strategy.attach("other", SingleDevice(CPU, "no"))
    for name in ("critic", "training_state", "a/b", ""):
        with pytest.raises(ValueError, match="sub-folder"):
            strategy.attach(name, strategy.companion("x", None))


def test_only_the_parent_leaves_the_process_group(tmp_path):
    from oxrl.config.schema import StrategyConfig
    from oxrl.training.distributed import DistEnv
    from oxrl.training.fsdp import FSDP2Strategy

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        parent = FSDP2Strategy(DistEnv(0, 0, 1, CPU), StrategyConfig(name="fsdp2"), "no", 1.0, max_nonfinite_steps=4)
        companion = parent.companion("critic", 0.5)
        assert type(companion) is FSDP2Strategy and companion.mp_policy is parent.mp_policy
        assert (companion.max_grad_norm, companion.nonfinite.max_consecutive) == (0.5, 4)
        companion.close()
        assert dist.is_initialized()
        parent.close()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ----------------------------------------------------------------------------- 2 processes


def run_scenario(name: str, factory) -> tuple[dict, object]:
    out = factory.mktemp(name)
    torchrun(["-m", "tests.companion_worker", name, str(out)])
    return json.loads((out / "result.json").read_text()), out


@pytest.fixture(scope="module")
def single_baseline(tmp_path_factory):
    out = tmp_path_factory.mktemp("companion_single")
    return worker.train_and_resume({"name": "single"}, out), out


def critic_weights(checkpoint) -> dict[str, torch.Tensor]:
    return load_file(checkpoint / "critic" / "model.safetensors")


def assert_pair_matches_one_rank_and_resumes(result: dict, out, baseline, shard_dir: str) -> None:
    expected, baseline_out = baseline
    for key in ("policy_norm", "critic_norm", "critic_loss", "critic_lr"):
        assert_close(result["full"][key], expected["full"][key])
        assert_close(result["resumed"][key], result["full"][key][2:], tol=1e-6)
    final = out / "full" / "checkpoints" / "step_000004"
    one_rank = critic_weights(baseline_out / "full" / "checkpoints" / "step_000004")
    two_ranks, resumed = critic_weights(final), critic_weights(out / "resumed" / "checkpoints" / "step_000004")
    for name, tensor in one_rank.items():
        assert_close(two_ranks[name].tolist(), tensor.tolist())
        assert_close(resumed[name].tolist(), two_ranks[name].tolist(), tol=1e-6)
    assert json.loads((final / "critic" / "config.json").read_text())["architectures"] == ["LlamaForTokenClassification"]
    assert (final / "critic" / "training_state" / shard_dir).is_dir() and (final / "training_state" / shard_dir).is_dir()


@pytest.mark.distributed
def test_fsdp2_companion_two_ranks_match_one_and_resume(tmp_path_factory, single_baseline):
    result, out = run_scenario("fsdp2", tmp_path_factory)
    assert_pair_matches_one_rank_and_resumes(result, out, single_baseline, "sharded")


@pytest.mark.distributed
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install 'oxrl[deepspeed]')")
def test_deepspeed_zero3_companion_two_ranks_match_one_and_resume(tmp_path_factory, single_baseline):
    result, out = run_scenario("deepspeed_zero3", tmp_path_factory)
    assert_pair_matches_one_rank_and_resumes(result, out, single_baseline, "deepspeed")
