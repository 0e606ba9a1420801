"""A policy and its companion (a tiny critic) trained together, under `torchrun --nproc_per_node 2` (gloo, CPU)
for tests/system/test_companion_strategy.py, and in the test process on one device for the baseline.

    torchrun --nproc_per_node 2 -m tests.companion_worker SCENARIO OUT_DIR

Each step trains the policy (token NLL) and the critic (squared error to fixed targets) on the same
4 rows of unequal lengths, split 2 + 2 over the ranks; both losses are divided by the global token
count, so 1 rank == 2 ranks up to summation order. Rank 0 writes OUT_DIR/result.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from oxrl.config.schema import Config, OptimConfig
from oxrl.training.build import build_strategy
from oxrl.training.optim import build_optimizer, build_scheduler
from oxrl.training.strategy import Strategy
from tests.conftest import make_tiny_critic, make_tiny_llama
from tests.distributed_worker import run_as_worker

TOTAL_STEPS = 4
# Different schedules, weight decay and clipping for the two models: a companion that borrowed any of
# the policy's would train differently. Warmup + decay: a resume that loses the position changes the lr.
POLICY_OPTIM = OptimConfig(lr=3e-3, schedule="cosine", warmup_steps=1, weight_decay=0.1)
CRITIC_OPTIM = OptimConfig(lr=1e-2, schedule="linear", warmup_steps=2, weight_decay=0.05)
CRITIC_MAX_GRAD_NORM = 0.05  # below the critic's gradient norms here, so every critic step is clipped


def config(out: Path, strategy: dict) -> Config:
    """A config for `build_strategy` (the strategy reads run.device, strategy and train; the rest is unused).
    The policy is clipped to train.optim.max_grad_norm (1.0)."""
    return Config.model_validate({
        "run": {"name": "companion", "output_dir": str(out), "seed": 0, "device": "cpu"},
        "model": {"name_or_path": "unused"},
        "data": {"train": [{"path": "unused"}]},
        "algorithm": {"name": "sft"},
        "train": {"micro_batch_size_per_device": 1, "mixed_precision": "no", "optim": {"max_grad_norm": 1.0}},
        "strategy": strategy,
    })


def prepare_pair(strategy: Strategy, seed: int = 0):
    """(policy, critic, the critic's companion strategy), prepared and attached as "critic"."""
    critic_strategy = strategy.companion("critic", CRITIC_MAX_GRAD_NORM)
    models = []
    for prepared_by, model, optim in ((strategy, make_tiny_llama(seed=seed), POLICY_OPTIM),
                                      (critic_strategy, make_tiny_critic(seed=seed + 1), CRITIC_OPTIM)):
        optimizer = build_optimizer(model, optim)
        models.append(prepared_by.prepare(model, optimizer, build_scheduler(optimizer, TOTAL_STEPS, optim)))
    strategy.attach("critic", critic_strategy)
    return models[0], models[1], critic_strategy


def rows(step: int) -> list[torch.Tensor]:
    """The step's 4 rows [1, L], L from 4 to 9 (fixed by the step, not by any RNG)."""
    g = torch.Generator().manual_seed(step)
    return [torch.randint(3, 100, (1, 4 + (step + i) % 6), generator=g) for i in range(4)]


def train_steps(strategy: Strategy, policy, critic, critic_strategy: Strategy, steps: range) -> dict[str, list[float]]:
    """Train both models over `steps` (1-based step numbers); the per-step global numbers."""
    log: dict[str, list[float]] = {"policy_norm": [], "critic_norm": [], "critic_loss": [], "critic_lr": []}
    for step in steps:
        batch = rows(step)
        share = len(batch) // strategy.world_size
        mine = batch[strategy.rank * share:(strategy.rank + 1) * share]
        tokens = float(sum(ids.shape[1] for ids in batch))  # the global normaliser: every rank's rows
        nll = critic_loss = 0.0
        for ids in mine:
            logits = policy(input_ids=ids, use_cache=False).logits[0, :-1]
            loss = F.cross_entropy(logits.float(), ids[0, 1:], reduction="sum") / tokens
            strategy.backward(loss)
            nll += float(loss.detach())
            values = critic(input_ids=ids, use_cache=False).logits[0, :, 0]
            loss = ((values.float() - (ids[0] % 7) / 7.0) ** 2).sum() / tokens
            critic_strategy.backward(loss)
            critic_loss += float(loss.detach())
        log["policy_norm"].append(strategy.step(strategy.all_reduce_sum(nll), step))
        critic_loss = critic_strategy.all_reduce_sum(critic_loss)
        log["critic_norm"].append(critic_strategy.step(critic_loss, step))
        log["critic_loss"].append(critic_loss)
        log["critic_lr"].append(critic_strategy.scheduler.get_last_lr()[0])
    return log


def train_and_resume(strategy_cfg: dict, out: Path) -> dict:
    """4 steps with a checkpoint at 2 and 4; then a pair of fresh models resumed from step 2 trains 3 and 4."""
    strategy = build_strategy(config(out, strategy=strategy_cfg))
    policy, critic, critic_strategy = prepare_pair(strategy)
    full = train_steps(strategy, policy, critic, critic_strategy, range(1, 3))
    strategy.save_checkpoint(out / "full", 2, None, {}, keep_last=5)
    for key, values in train_steps(strategy, policy, critic, critic_strategy, range(3, 5)).items():
        full[key] += values
    strategy.save_checkpoint(out / "full", 4, None, {}, keep_last=5)

    resumed_strategy = build_strategy(config(out, strategy=strategy_cfg))
    policy, critic, critic_strategy = prepare_pair(resumed_strategy, seed=123)  # other weights: the load must replace them
    step = resumed_strategy.load_checkpoint(out / "full" / "checkpoints" / "step_000002")["step"]
    resumed = train_steps(resumed_strategy, policy, critic, critic_strategy, range(step + 1, 5))
    resumed_strategy.save_checkpoint(out / "resumed", 4, None, {}, keep_last=5)
    return {"full": full, "resumed": resumed}


SCENARIOS = {"fsdp2": {"name": "fsdp2"}, "deepspeed_zero3": {"name": "deepspeed", "zero_stage": 3}}  # strategy settings


def main() -> None:
    settings = SCENARIOS[sys.argv[1]]
    run_as_worker(lambda out: train_and_resume(settings, out))

if __name__ == "__main__":
    main()
