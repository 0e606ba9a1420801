"""A tiny random Llama trains: the loss falls and every trainable parameter moves."""

import torch

from oxrl.config.schema import Config
from oxrl.data.types import Example, Sequence
from oxrl.training.strategy import SingleDevice
from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import train_offline
from tests.conftest import make_tiny_llama


def tiny_config(tmp_path, **train) -> Config:
    return Config.model_validate({
        "run": {"name": "tiny", "output_dir": str(tmp_path), "seed": 0},
        "model": {"name_or_path": "unused"},
        "data": {"train": [{"path": "unused"}]},
        "algorithm": {"name": "sft"},
        "train": {"global_batch_size": 4, "micro_batch_size_per_device": 2, "max_steps": 30,
                  "optim": {"lr": 3e-3, "schedule": "constant"}, **train},
        "logging": {"progress_bar": False, "plot": False},
    })


def copy_task(n: int = 16) -> list[Example]:
    """Sequences `a b c | a b c`: the second half is learnable from the first."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        half = torch.randint(3, 40, (4,), generator=g).tolist()
        ids = [1] + half + [5] + half
        mask = [False] * 6 + [True] * 4
        out.append(Example([Sequence(ids, mask)]))
    return out


def test_tiny_model_learns_and_every_parameter_moves(tmp_path):
    cfg = tiny_config(tmp_path)
    model = make_tiny_llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    strategy = SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0)
    result = train_offline(cfg, get_objective("sft"), model, None, copy_task(), [], strategy, tmp_path / "run")
    assert result.losses[-1] < 0.7 * result.losses[0]
    unmoved = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert not unmoved, f"parameters that did not move: {unmoved}"
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
