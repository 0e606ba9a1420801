"""A run resumed from a mid-run checkpoint continues exactly like the uninterrupted run."""

import json

import torch

from oxrl.data.sampler import StepSampler
from oxrl.training.strategy import SingleDevice
from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import train_offline
from tests.conftest import make_tiny_llama
from tests.integration.test_tiny_training import copy_task, tiny_config


def _train(cfg, model, run_dir):
    strategy = SingleDevice(torch.device("cpu"), "no", max_grad_norm=cfg.train.optim.max_grad_norm)
    return train_offline(cfg, get_objective("sft"), model, None, copy_task(12), [], strategy, run_dir)


def test_resume_reproduces_the_uninterrupted_losses(tmp_path):
    # Cosine schedule with warmup, weight decay and dropout-free fp32: any state not restored
    # (optimizer moments, schedule position, weights, data position) changes the losses.
    train = {"max_steps": 6, "optim": {"lr": 3e-3, "schedule": "cosine", "warmup_steps": 2, "weight_decay": 0.1}}
    cfg = tiny_config(tmp_path, **train)
    cfg.checkpoint.every = 3
    cfg.checkpoint.keep_last = 5
    full = _train(cfg, make_tiny_llama(seed=0), tmp_path / "full")
    checkpoint = tmp_path / "full" / "checkpoints" / "step_000003"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "config.json").is_file()

    resumed_cfg = tiny_config(tmp_path, **train)
    resumed_cfg.run.resume = str(checkpoint)
    # A differently initialised model: the checkpoint must overwrite every weight.
    resumed = _train(resumed_cfg, make_tiny_llama(seed=123), tmp_path / "resumed")
    assert len(resumed.losses) == 3
    for a, b in zip(full.losses[3:], resumed.losses):
        assert abs(a - b) < 1e-6, (full.losses, resumed.losses)
    logged = [json.loads(line)["step"] for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [4, 5, 6]


def test_checkpoint_loads_with_plain_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(tmp_path, max_steps=2)
    cfg.checkpoint.every = 2
    model = make_tiny_llama()
    _train(cfg, model, tmp_path / "run")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoints" / "step_000002")
    ids = torch.tensor([[1, 5, 9, 12]])
    torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits)


def test_sampler_sees_the_same_data_in_the_same_order_across_epochs():
    a = StepSampler(10, 4, seed=3)
    b = StepSampler(10, 4, seed=3)
    stream_a = [a.step_indices(s) for s in range(6)]  # 2.4 epochs
    stream_b = [b.step_indices(s) for s in (5, 2, 0, 1, 3, 4)]  # out of order: still a function of the step
    assert stream_a == [stream_b[i] for i in (2, 3, 1, 4, 5, 0)]
    first_epoch = sum(stream_a[:2], []) + stream_a[2][:2]
    assert sorted(first_epoch) == list(range(10))  # each epoch is a permutation
    assert StepSampler(10, 4, seed=4).step_indices(0) != stream_a[0]


def test_a_resume_trains_with_the_configured_lr_and_weight_decay(tmp_path):
    """The checkpoint supplies the schedule's position; the config its peak lr, shape and AdamW settings."""
    from oxrl.training.optim import lr_factor

    cfg = tiny_config(tmp_path, max_steps=4, optim={"lr": 1e-3, "schedule": "cosine", "warmup_steps": 1})
    cfg.checkpoint.every = 2
    _train(cfg, make_tiny_llama(), tmp_path / "first")
    changed = tiny_config(tmp_path, max_steps=4, optim={"lr": 2e-4, "schedule": "linear", "warmup_steps": 1,
                                                        "weight_decay": 0.05})
    changed.run.resume = str(tmp_path / "first" / "checkpoints" / "step_000002")
    strategy = SingleDevice(torch.device("cpu"), "no", max_grad_norm=changed.train.optim.max_grad_norm)
    train_offline(changed, get_objective("sft"), make_tiny_llama(), None, copy_task(12), [], strategy, tmp_path / "second")
    logged = {json.loads(line)["step"]: json.loads(line)["lr"] for line in (tmp_path / "second" / "metrics.jsonl").read_text().splitlines()}
    assert logged == {step: 2e-4 * lr_factor(step - 1, 4, changed.train.optim) for step in (3, 4)}
    assert [g["weight_decay"] for g in strategy.optimizer.param_groups] == [0.05, 0.0]
    assert all(g["initial_lr"] == 2e-4 for g in strategy.optimizer.param_groups)
