"""The fused AdamW a single-device run uses is the same update as torch's default AdamW, and resumes from it."""

import copy

import torch

from oxrl.config.schema import OptimConfig
from oxrl.training.deepspeed_strategy import DeepSpeedStrategy
from oxrl.training.fsdp import FSDP2Strategy
from oxrl.training.optim import build_optimizer
from oxrl.training.strategy import SingleDevice
from tests.conftest import make_tiny_llama


def train(model, optimizer, steps: int, first: int = 0) -> None:
    for step in range(first, first + steps):
        ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()


def test_fused_adamw_makes_the_default_adamws_update():
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1)
    default, fused = make_tiny_llama(seed=1), make_tiny_llama(seed=1)
    default_opt, fused_opt = build_optimizer(default, cfg), build_optimizer(fused, cfg, fused=True)
    assert fused_opt.defaults["fused"] and not default_opt.defaults["fused"]
    assert [g["weight_decay"] for g in fused_opt.param_groups] == [0.1, 0.0]  # 1-D parameters still skip decay
    before = {name: p.detach().clone() for name, p in default.named_parameters()}
    train(default, default_opt, 5)
    train(fused, fused_opt, 5)
    for (name, a), b in zip(default.named_parameters(), fused.parameters()):
        assert not torch.equal(a, before[name]), name  # every parameter moved (lr 1e-2)
        torch.testing.assert_close(b, a, atol=2e-6, rtol=1e-5)


def test_fused_adamw_resumes_from_a_default_adamws_state():
    cfg = OptimConfig(lr=1e-2)
    reference, resumed = make_tiny_llama(seed=2), make_tiny_llama(seed=2)
    reference_opt = build_optimizer(reference, cfg)
    train(reference, reference_opt, 3)
    resumed.load_state_dict(reference.state_dict())
    resumed_opt = build_optimizer(resumed, cfg, fused=True)
    resumed_opt.load_state_dict(copy.deepcopy(reference_opt.state_dict()))  # as from a checkpoint written before
    train(reference, reference_opt, 3, first=3)
    train(resumed, resumed_opt, 3, first=3)
    for a, b in zip(reference.parameters(), resumed.parameters()):
        torch.testing.assert_close(b, a, atol=2e-6, rtol=1e-5)


def test_only_a_single_device_fuses():
    assert SingleDevice.fused_optimizer
    assert not FSDP2Strategy.fused_optimizer and not DeepSpeedStrategy.fused_optimizer
