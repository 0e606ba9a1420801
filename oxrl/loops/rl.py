"""RL with verifiable rewards: the algorithm box.

    for each step:
        prompts      <- this rank's share of the step's prompts (deterministic by seed, resumable)
        sample       completions <- engine(prompts, n each); rewards <- reward functions (or an environment),
                     from the policy of `rl.max_staleness` steps ago (0: the current one; oxrl/loops/pipeline.py)
        score        old log-probs (policy, no grad), reference log-probs (KL), critic values (PPO)
        estimate     token rewards (- beta * KL when `kl_in_reward`) -> advantages over every rank's rollouts
        update       rl.epochs x rl.mini_batches policy (and critic) steps: oxrl/loops/rl_update.py
        sync         engine.sync_weights(policy)

Online DPO, RFT and SPIN run this same loop with `select` + an offline objective in place of score,
estimate and update (`OnlineMethod.step`, oxrl/loops/online.py).

The stages live in rl_stages.py and rl_update.py; each reads the run's handles (`RLHandles`) and the
step's `Rollout`. Resume: a checkpoint holds the weights, optimizers, schedules (the critic's in
`critic/`) and every RNG; the prompts of a step are a function of the step, and the built-in `hf`
engine samples from torch's global RNG, so a resumed run repeats the uninterrupted one exactly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from oxrl.config.schema import Config
from oxrl.data.sampler import StepSampler, split_for_rank
from oxrl.data.types import RLPromptBatch
from oxrl.loops.accuracy import summarise
from oxrl.logging.metrics import MetricsLogger
from oxrl.loops.mismatch import check_on_policy
from oxrl.loops.rl_metrics import global_metrics, rollout_metrics
from oxrl.loops.pipeline import RolloutPipeline, Sampled
from oxrl.loops.rl_stages import Rollout, estimate, naming_step, sample_and_reward, sampling_params, score
from oxrl.loops.rl_update import update
from oxrl.training.optim import build_optimizer, build_scheduler
from oxrl.training.run_dir import resume_path

logger = logging.getLogger(__name__)


@dataclass
class RLHandles:
    """Everything the loop works with, built once per run. `cfg.rl` is resolved (the preset applied)."""

    cfg: Config
    model: torch.nn.Module  # the policy module; the engine samples from it
    strategy: Any  # oxrl/training/strategy.py
    engine: Any  # a RolloutEngine (oxrl/rollout/base.py)
    reward_fn: Any = None  # scores single-turn completions (oxrl/rewards/combine.py); None with `env`
    env: Any = None  # multi-turn episodes (oxrl/loops/multiturn.py Environment), which reward themselves
    reference: Any = None  # a FrozenModel (oxrl/models/reference.py) for the KL term; None when kl_coef is 0
    critic: Any = None  # PPO (advantage `gae`): a Critic or SharedValueHead (oxrl/loops/critic.py); None without
    tokenizer: Any = None  # saved with checkpoints: the tokenizer, or a vision-language model's processor
    policy: torch.nn.Module | None = None  # `model` as the strategy prepared it (e.g. a DeepSpeed engine): set by `prepare`
    online: Any = None  # Online DPO / RFT / SPIN (oxrl/loops/online.py): the samples train an offline objective
    # True when the engine is shared by every rank (Ray rollout workers, oxrl/cluster): each rank passes the whole
    # step's prompts and keeps its share of the sampled groups (`rank_share`).
    shared_rollouts: bool = False


@dataclass
class RLResult:
    steps: int
    rewards: list[float]  # mean reward per step
    accuracy_before: float | None
    accuracy_after: float | None
    final_metrics: dict[str, float]
    samples: dict[str, list[dict]] = field(default_factory=dict)  # "first"/"last": example_completions of those steps


def prepare(h: RLHandles, total_updates: int, run_dir: Path) -> tuple[int, dict | None, Path | None]:
    """Optimizers and schedules for the policy (and critic), handed to their strategies; resume. Returns the first
    step, and on resume this rank's samples of the later steps the checkpoint holds, and the checkpoint."""
    cfg = h.cfg
    optimizer = build_optimizer(h.model, cfg.train.optim, fused=h.strategy.fused_optimizer)
    h.policy = h.strategy.prepare(h.model, optimizer, build_scheduler(optimizer, total_updates, cfg.train.optim))
    h.policy.train()
    if h.critic is not None:
        h.critic.prepare(h.strategy, cfg, total_updates)
    if h.strategy.world_size > 1:
        torch.manual_seed(cfg.run.seed + h.strategy.rank)  # weights are in sync already; samples must differ per rank
    resume_from = resume_path(cfg, run_dir)
    if resume_from is None:
        return 0, None, None
    state = h.strategy.load_checkpoint(resume_from)
    h.strategy.nonfinite.load_state_dict(state)
    sync(h, None)
    return state["step"], state.get("rank_state"), resume_from


def sync(h: RLHandles, step: int | None) -> dict[str, float]:
    """The engine samples from the policy's weights from now on: after the update of `step`, or on resume (None)."""
    return h.online.sync(h, step) if h.online is not None else h.engine.sync_weights(h.model)


def train_rl(h: RLHandles, train: RLPromptBatch, val: RLPromptBatch, run_dir: Path) -> RLResult:
    cfg, rl, strategy = h.cfg, h.cfg.rl, h.strategy
    sampler = StepSampler(len(train.prompt_ids), rl.prompts_per_step, cfg.run.seed, shuffle=cfg.data.shuffle)
    total_steps = sampler.total_steps(cfg.train.epochs, cfg.train.max_steps)
    if rl.prompts_per_step % strategy.world_size:
        raise ValueError(f"rl.prompts_per_step ({rl.prompts_per_step}) must be a multiple of the world size "
                         f"({strategy.world_size}): each rank samples whole groups")
    start_step, sampled_ahead, checkpoint = prepare(h, total_steps * rl.epochs * rl.mini_batches, run_dir)

    def prompts_of(step: int) -> RLPromptBatch:  # this rank's prompts of a step (every rank's, shared rollouts)
        indices = sampler.step_indices(step)
        mine = indices if h.shared_rollouts else split_for_rank(indices, strategy.rank, strategy.world_size)
        return train.subset(mine)

    pipeline = RolloutPipeline.of(h, total_steps, prompts_of)
    if checkpoint is not None:
        pipeline.load_state_dict((sampled_ahead or {}).get("pipeline"), start_step, str(checkpoint))
    log = MetricsLogger(run_dir, total_steps, start_step, enabled=strategy.is_main, progress_bar=cfg.logging.progress_bar,
                        config=cfg)
    validating = rl.validation_every is not None and bool(val.prompt_ids)
    before = evaluate(h, val) if validating and start_step == 0 else {}
    if before:
        log.log(start_step, before, advance=False)
        logger.info("held-out accuracy before training: %.3f", before["val/accuracy"])
    rewards, samples, metrics, last_eval = [], {}, {}, before
    try:
        for step in range(start_step, total_steps):
            done = step + 1
            started = time.perf_counter()
            with naming_step(done):  # collecting and rewarding (each step is started under its own name)
                sampled = pipeline.take(step)
            metrics, rollout = one_step(h, sampled, done)
            elapsed = time.perf_counter() - started
            generated = strategy.all_reduce_sum(float(sum(c.num_sampled for c in rollout.completions)))
            metrics.update({"time/step": elapsed, "tokens_per_s": generated / elapsed,
                            "completions_per_s": len(rollout.completions) * strategy.world_size / elapsed})
            rewards.append(metrics["reward/mean"])
            if step == start_step or done == total_steps:  # this rank's, for the report (rank 0 writes it)
                samples["first" if step == start_step else "last"] = example_completions(rollout, done)
            if validating and (done % rl.validation_every == 0 or done == total_steps):
                with naming_step(done):
                    last_eval = evaluate(h, val)
                metrics.update(last_eval)
            if done % cfg.logging.every == 0 or done == total_steps:
                log.log(done, metrics)
            if cfg.checkpoint.every and (done % cfg.checkpoint.every == 0 or done == total_steps):
                pipeline.settle()  # the steps sampled ahead are part of the checkpoint
                strategy.save_checkpoint(run_dir, done, h.tokenizer, strategy.nonfinite.state_dict(),
                                         cfg.checkpoint.keep_last, cfg.lora.save,
                                         rank_state={"pipeline": pipeline.state_dict()} if rl.max_staleness else None)
    finally:
        log.close()
    return RLResult(total_steps, rewards, before.get("val/accuracy"), last_eval.get("val/accuracy"), metrics, samples)


def one_step(h: RLHandles, sampled: Sampled, step: int) -> tuple[dict[str, float], Rollout]:
    """score -> estimate -> update -> sync, on this rank's samples of step `step` (1-based)."""
    rl = h.cfg.rl
    rollout = sampled.rollout
    # Every sample of a step comes from the one version the schedule names: its lag is the step's.
    lag = {"off_policy/version_lag": float(step - 1 - sampled.version)} if rl.max_staleness else {}
    if h.online is not None:  # Online DPO / RFT: their own step over the same sampling (oxrl/loops/online.py)
        metrics, rollout = h.online.step(h, rollout, sampled.metrics, step)
        return {**metrics, **lag}, rollout
    with naming_step(step):
        metrics = {**sampled.metrics, **score(h, rollout)}
    estimate(h, rollout)
    metrics = global_metrics(h.strategy, {**metrics, **rollout_metrics(rollout)}, rollout.rewards)
    metrics.update(lag)
    if rl.strict_on_policy and rollout.old_logprobs is not None:  # else the update checks it
        check_on_policy(metrics["logprob_mismatch/mean_abs"], rl.on_policy_tolerance)
    started = time.perf_counter()
    # The learning rate of the step's (first) update, read before the update advances the schedule, as SFT logs it.
    metrics["lr"] = h.strategy.scheduler.get_last_lr()[0]
    warming_up = h.critic is not None and step <= rl.critic_warmup_steps  # only the critic learns
    metrics.update(update(h, rollout, step, train_policy=not warming_up))
    metrics.update(sync(h, step))  # e.g. vLLM: the sync's seconds and probe gap
    metrics["time/train"] = time.perf_counter() - started
    metrics["train/nonfinite_steps"] = h.strategy.nonfinite.skipped
    if h.critic is not None:
        metrics.update(h.critic.metrics())
    return metrics, rollout


def evaluate(h: RLHandles, batch: RLPromptBatch) -> dict[str, float]:
    """Greedy held-out accuracy: one completion (or episode) per prompt at temperature 0. `oxrl eval`'s
    greedy pass is these same calls (oxrl/evaluation/run.py), so the two report the same numbers."""
    if not batch.prompt_ids:
        return {}
    completions, scored, _ = sample_and_reward(h.engine, h.reward_fn, h.env, batch, sampling_params(h.cfg.rl, greedy=True))
    summary = summarise(completions, scored)
    return {"val/accuracy": summary["accuracy"], "val/reward": summary["reward/mean"]}


def example_completions(rollout: Rollout, step: int, count: int = 3) -> list[dict]:
    """The first completion of each of the step's first `count` prompts, with its reward, for the run report."""
    batch = rollout.batch
    first_of_prompt: dict[int, int] = {}
    for i, completion in enumerate(rollout.completions):
        first_of_prompt.setdefault(completion.prompt_index, i)
    return [{"step": step, "prompt": batch.prompt_texts[p], "completion": rollout.completions[i].text,
             "reward": float(rollout.rewards[i])} for p, i in list(first_of_prompt.items())[:count]]
