"""RL with verifiable rewards: the algorithm box.

    for each step:
        prompts      <- this rank's share of the step's prompts (deterministic by seed, resumable)
        sample       completions <- engine(prompts, n each) (or an episode runner); rewards <- reward functions
        score        old log-probs (policy, no grad), reference log-probs (KL), critic values (PPO)
        estimate     token rewards (- beta * KL when `kl_in_reward`) -> advantages over every rank's rollouts
        update       rl.epochs x rl.mini_batches policy (and critic) steps: oxrl/loops/rl_update.py
        sync         engine.sync_weights(policy)

This file is the loop and the stages before the update; each stage reads the run's handles (`RLHandles`) and
fills fields of the step's `Rollout`, keeping no state of its own. Three things plug in without a branch here:
a critic (`h.critic`, oxrl/loops/critic.py), an episode runner (`h.env`: multi-turn environments, robot
simulators) and an online method (`h.online`: Online DPO, RFT and SPIN run `select` + an offline objective in
place of score, estimate and update, oxrl/loops/online.py). With `rl.max_staleness` = k >= 1 the samples of step
t come from the policy of step t - k, scheduled by oxrl/loops/pipeline.py (`h.ahead`).

Resume: a checkpoint holds the weights, optimizers, schedules (the critic's in `critic/`) and every RNG; the
prompts of a step are a function of the step, and the built-in `hf` engine samples from torch's global RNG, so a
resumed run repeats the uninterrupted one exactly.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from oxrl.algorithms.advantages import RolloutRewards, estimate_advantages, place_outcome_reward
from oxrl.algorithms.kl import kl_penalty_rewards
from oxrl.config.schema import Config
from oxrl.data.sampler import StepSampler, balanced_split, split_for_rank
from oxrl.data.types import RLPromptBatch
from oxrl.errors import UserError
from oxrl.logging.metrics import MetricsLogger
from oxrl.loops.rl_update import (advantage_params, check_on_policy, mismatch_metrics, mismatch_sums, pad_rows,
                                  sampled_logprobs, score_logprobs, score_logprobs_and_values, shared_value_head,
                                  single_on_policy_update, update)
from oxrl.rewards.combine import RewardOutput
from oxrl.rollout.base import Completion, SamplingParams, Submits
from oxrl.training.model_card import model_card
from oxrl.training.nonfinite import NonFiniteError
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
    # An episode runner, `run(engine, batch, params) -> Episodes`: a multi-turn environment (oxrl/loops/multiturn.py)
    # or a VLA's simulator (oxrl/vla/episodes.py), whose episodes reward themselves.
    env: Any = None
    reference: Any = None  # a FrozenModel (oxrl/models/reference.py) for the KL term; None when kl_coef is 0
    critic: Any = None  # PPO (advantage `gae`): a Critic or SharedValueHead (oxrl/loops/critic.py); None without
    tokenizer: Any = None  # saved with checkpoints: the tokenizer, or a vision-language model's processor
    policy: torch.nn.Module | None = None  # `model` as the strategy prepared it (e.g. a DeepSpeed engine): set by `prepare`
    online: Any = None  # Online DPO / RFT / SPIN (oxrl/loops/online.py): the samples train an offline objective
    # `rl.max_staleness` >= 1: the schedule that samples steps ahead, `(h, total_steps, prompts_of) -> schedule`
    # (oxrl/loops/pipeline.py RolloutPipeline.of); in-turn sampling (`InTurn`) otherwise.
    ahead: Callable[..., Any] | None = None
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


@dataclass
class Rollout:
    """One step's samples on this rank, and what the stages computed from them (per completion)."""

    completions: list[Completion]
    rewards: torch.Tensor  # [N] each completion's reward (before any KL penalty)
    token_rewards: list[torch.Tensor]  # per completion [len]: the reward on its last sampled token (+ KL penalty)
    group_ids: torch.Tensor  # [N] index of the prompt it answers (this rank's)
    old_logprobs: list[torch.Tensor] | None = None  # None: the single on-policy update computes them
    ref_logprobs: list[torch.Tensor] | None = None
    values: list[torch.Tensor] | None = None  # the critic's (gae)
    advantages: list[torch.Tensor] | None = None
    returns: list[torch.Tensor] | None = None  # the critic's targets (gae)
    batch: RLPromptBatch | None = None  # the prompts `group_ids` index (set by `sample`)
    # The policy version that sampled it: the number of updates the weights had then (oxrl/loops/pipeline.py).
    version: int = 0

    @classmethod
    def of(cls, completions: list[Completion], rewards: torch.Tensor,
           per_token: list[list[float] | None] | None = None) -> Rollout:
        """Completions and their rewards as token rewards: the per-token part (`per_token[i]`, one value per
        sampled token, when a reward gave one) on its tokens, the rest of `rewards[i]` on the last sampled token."""
        lengths = [c.num_sampled for c in completions]
        per_token = per_token or [None] * len(completions)
        outcome = rewards.clone()
        for i, values in enumerate(per_token):
            if values is not None:
                outcome[i] -= sum(values)  # the per-token part sits on its own tokens
        placed = place_outcome_reward(outcome, pad_rows([torch.ones(n) for n in lengths], max(lengths, default=0)))
        token_rewards = [row[:n] + torch.tensor(p) if p is not None else row[:n]
                         for row, n, p in zip(placed, lengths, per_token)]
        return cls(completions, rewards, token_rewards, torch.tensor([c.prompt_index for c in completions]))


@dataclass
class Sampled:
    """A step's samples, sampled by `version`, with the metrics of their sampling."""

    step: int  # 0-based
    version: int
    rollout: Rollout
    metrics: dict[str, float]


class InTurn:
    """`rl.max_staleness` 0, the synchronous loop: each step is sampled by the live weights, then trained. Steps
    sampled ahead plug in instead, with the same calls (`RLHandles.ahead`, oxrl/loops/pipeline.py)."""

    def __init__(self, h: RLHandles, total_steps: int, prompts_of: Callable[[int], RLPromptBatch]):
        self.h, self.prompts_of = h, prompts_of

    def take(self, step: int) -> Sampled:
        rollout, metrics = sample(self.h, self.prompts_of(step), step + 1)
        rollout.version = step
        return Sampled(step, step, rollout, metrics)

    def settle(self) -> None:
        """Nothing is in flight between steps."""

    def load_state_dict(self, state: dict | None, resumed_step: int, source: str) -> None:
        if state is not None:  # a pipelined run's checkpoint, with the samples of the steps after it
            staleness = state.get("max_staleness") if isinstance(state, dict) else None
            raise ResumeError(f"{source} was written with rl.max_staleness = {staleness}: resume with that value, "
                              "not 0 (its steps sampled ahead follow that schedule)")


class ResumeError(UserError, ValueError):
    """A checkpoint of a pipelined run cannot resume this run's schedule."""


def prepare(h: RLHandles, total_updates: int, run_dir: Path) -> tuple[int, dict | None, Path | None]:
    """Optimizers and schedules for the policy (and critic), handed to their strategies; resume. Returns the first
    step, and on resume this rank's samples of the later steps the checkpoint holds, and the checkpoint."""
    cfg = h.cfg
    optimizer = build_optimizer(h.model, cfg.train.optim, fused=h.strategy.fused_optimizer)
    h.policy = h.strategy.prepare(h.model, optimizer, build_scheduler(optimizer, total_updates, cfg.train.optim))
    h.policy.train()
    if h.critic is not None:
        h.critic.prepare(h.strategy, cfg, total_updates)
    if h.strategy.data_size > 1:  # weights are in sync already; samples must differ per data rank (and agree
        torch.manual_seed(cfg.run.seed + h.strategy.data_rank)  # between the ranks that split one model)
    resume_from = resume_path(cfg, run_dir)
    if resume_from is None:
        return 0, None, None
    state = h.strategy.load_checkpoint(resume_from)
    h.strategy.nonfinite.load_state_dict(state)
    sync(h, None)
    return state["step"], state.get("rank_state"), resume_from


def train_rl(h: RLHandles, train: RLPromptBatch, val: RLPromptBatch, run_dir: Path, stop=None) -> RLResult:
    """`stop`: SIGTERM and SIGINT end the run after a step, with a checkpoint (oxrl/training/signals.py)."""
    cfg, rl, strategy = h.cfg, h.cfg.rl, h.strategy
    sampler = StepSampler(len(train.prompt_ids), rl.prompts_per_step, cfg.run.seed, shuffle=cfg.data.shuffle)
    total_steps = sampler.total_steps(cfg.train)
    if rl.prompts_per_step % strategy.data_size:
        raise ValueError(f"rl.prompts_per_step ({rl.prompts_per_step}) must be a multiple of the data-parallel ranks "
                         f"({strategy.data_size}): each samples whole groups")
    start_step, sampled_ahead, checkpoint = prepare(h, total_steps * rl.epochs * rl.mini_batches, run_dir)

    def prompts_of(step: int) -> RLPromptBatch:  # this rank's prompts of a step (every rank's, shared rollouts)
        indices = sampler.step_indices(step)
        mine = indices if h.shared_rollouts else split_for_rank(indices, strategy.data_rank, strategy.data_size)
        return train.subset(mine)

    if rl.max_staleness and h.ahead is None:
        raise ValueError("rl.max_staleness >= 1 samples steps ahead: give the handles a schedule that does "
                         "(RLHandles.ahead = oxrl.loops.pipeline.RolloutPipeline.of)")
    schedule = (h.ahead if rl.max_staleness else InTurn)(h, total_steps, prompts_of)  # which policy samples a step
    if checkpoint is not None:
        from oxrl.training.checkpoint import drop_abandoned_checkpoints  # (the checkpoint modules: a resume's only)

        schedule.load_state_dict((sampled_ahead or {}).get("pipeline"), start_step, str(checkpoint))
        drop_abandoned_checkpoints(run_dir, checkpoint, start_step, strategy)  # a rewind's: every check has passed
    validating = bool(val.prompt_ids) and rl.validation_every is not None
    before = evaluate(h, val) if validating and start_step == 0 else {}  # before the step bar opens: it would sit at 0
    log = MetricsLogger(run_dir, total_steps, start_step, enabled=strategy.is_main, progress_bar=cfg.logging.progress_bar,
                        config=cfg)
    if before:
        log.log(start_step, before, advance=False)
        logger.info("held-out accuracy before training: %.3f", before["val/accuracy"])
    rewards, samples, metrics, last_eval = [], {}, {}, before
    try:
        for step in range(start_step, total_steps):
            done = step + 1
            started = time.perf_counter()
            with naming_step(done):  # collecting and rewarding (each step is started under its own name)
                sampled = schedule.take(step)
            metrics, rollout = one_step(h, sampled, done)
            elapsed = time.perf_counter() - started
            generated = strategy.all_reduce_sum(float(sum(c.num_sampled for c in rollout.completions)))
            metrics.update({"time/step": elapsed, "tokens_per_s": generated / elapsed,
                            "completions_per_s": len(rollout.completions) * strategy.data_size / elapsed})
            rewards.append(metrics["reward/mean"])
            if step == start_step or done == total_steps:  # this rank's, for the report (rank 0 writes it)
                samples["first" if step == start_step else "last"] = example_completions(rollout, done)
            if validating and (done % rl.validation_every == 0 or done == total_steps):
                with naming_step(done):
                    last_eval = evaluate(h, val)
                metrics.update(last_eval)
            if done % cfg.logging.every == 0 or done == total_steps:
                log.log(done, metrics)
            stopping = stop is not None and stop.agreed()  # a rank got SIGTERM or SIGINT: checkpoint, then stop
            periodic = cfg.checkpoint.every and (done % cfg.checkpoint.every == 0 or done == total_steps)
            if periodic or stopping and stop.checkpoint:
                schedule.settle()  # the steps sampled ahead are part of the checkpoint
                strategy.save_checkpoint(run_dir, done, h.tokenizer, strategy.nonfinite.state_dict(),
                                         cfg.checkpoint.keep_last, cfg.lora.save_mode, card=model_card(cfg, metrics, done),
                                         rank_state={"pipeline": schedule.state_dict()} if rl.max_staleness else None)
            if stopping:
                raise stop.stopped(done, run_dir)
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


# ---- sample -------------------------------------------------------------------------------------------------------


def sampling_params(cfg: Config, greedy: bool = False) -> SamplingParams:
    """The rollout settings as the engine takes them; under `vla` the episode runner sets the length (one action
    chunk) and the stop strings (none)."""
    r = cfg.rl.rollout
    length = {key: value for key in ("max_new_tokens", "stop") if (value := cfg.read(f"rl.rollout.{key}")) is not None}
    if greedy:
        return SamplingParams(n=1, temperature=0.0, **length)
    return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, **length)


@dataclass
class Sampling:
    """One call's samples from the moment they are asked for: here already (`completions`), or still being
    sampled by remote workers (`ticket`, an engine that `Submits`), collected by `finish_sampling`."""

    batch: RLPromptBatch
    started: float
    completions: list[Completion] | None = None
    scored: RewardOutput | None = None  # multi-turn episodes reward themselves
    metrics: dict[str, float] = field(default_factory=dict)
    ticket: int | None = None
    engine: Any = None


def start_sampling(engine, env, batch: RLPromptBatch, params: SamplingParams) -> Sampling:
    """Ask for `params.n` completions of each of the batch's prompts. A remote engine samples in the background
    (the caller trains meanwhile); the built-in engines and multi-turn episodes (every turn waits for the
    environment) sample here."""
    started = time.perf_counter()
    if env is not None:  # an episode runner: `run(engine, batch, params) -> Episodes`
        episodes = env.run(engine, batch, params)
        engine.offload()  # every turn is sampled: the trainer gets the memory back
        return Sampling(batch, started, episodes.completions, episodes.reward_output(),
                        {"time/generate": time.perf_counter() - started, **episodes.metrics()})
    if isinstance(engine, Submits):
        return Sampling(batch, started, ticket=engine.submit(batch.prompt_ids, params, batch.vision), engine=engine)
    completions = engine.generate(batch.prompt_ids, params, batch.vision)
    engine.offload()
    return Sampling(batch, started, completions, metrics={"time/generate": time.perf_counter() - started})


def finish_sampling(reward_fn, sampling: Sampling) -> tuple[list[Completion], RewardOutput, dict[str, float]]:
    """The samples (waiting for a remote engine's), their rewards, and timing/episode metrics. `time/generate`
    is the time this process spent sampling or waiting for samples: with a remote engine under
    `rl.max_staleness` >= 1, the part of the sampling the update did not hide."""
    metrics = dict(sampling.metrics)
    completions = sampling.completions
    if completions is None:
        waited = time.perf_counter()
        completions = sampling.engine.collect(sampling.ticket)
        metrics["time/generate"] = time.perf_counter() - waited
    if sampling.scored is not None:
        return completions, sampling.scored, metrics
    rewarding = time.perf_counter()
    batch = sampling.batch
    of_prompt = [c.prompt_index for c in completions]
    scored = reward_fn([batch.prompt_texts[i] for i in of_prompt], [c.text for c in completions],
                       [batch.fields[i] for i in of_prompt], [batch.origins[i] for i in of_prompt],
                       [c.completion_ids for c in completions])
    return completions, scored, {**metrics, "time/reward": time.perf_counter() - rewarding}


def sample_and_reward(engine, reward_fn, env, batch: RLPromptBatch,
                      params: SamplingParams) -> tuple[list[Completion], RewardOutput, dict[str, float]]:
    """Completions of the batch's prompts, their rewards, and timing/episode metrics. Single-turn: the
    engine samples and the reward functions score the text. Multi-turn (`env`): the episodes' summed
    environment rewards are the rewards (oxrl/loops/multiturn.py). `oxrl eval` samples with it too."""
    return finish_sampling(reward_fn, start_sampling(engine, env, batch, params))


def start_sample(h, batch: RLPromptBatch, step: int) -> Sampling:
    """Stage 1, begun: ask for the step's completions. With shared rollouts (Ray rollout workers) every rank
    holds the whole step's prompts: all are sampled once, seeded by the step."""
    params = sampling_params(h.cfg)
    if h.shared_rollouts:
        params.seed = sampling_seed(h.cfg.run.seed, step)
    with naming_step(step):  # e.g. sampling from weights that diverged in the last update
        return start_sampling(h.engine, h.env, batch, params)


def finish_sample(h, sampling: Sampling) -> tuple[Rollout, dict[str, float]]:
    """Stage 1, ended: the step's completions and their rewards as a Rollout (with shared rollouts, this rank's
    share of the groups), and the sampling's metrics."""
    completions, scored, metrics = finish_sampling(h.reward_fn, sampling)
    batch = sampling.batch
    metrics = {**scored.metrics("reward"), "accuracy": accuracy_of(scored.components), **metrics}
    if h.shared_rollouts:
        batch, completions, scored = rank_share(batch, completions, scored, h.strategy.data_rank, h.strategy.data_size)
    rollout = Rollout.of(completions, torch.tensor(scored.totals, dtype=torch.float32), scored.token_rewards)
    rollout.batch = batch
    return rollout, metrics


def sample(h, batch: RLPromptBatch, step: int) -> tuple[Rollout, dict[str, float]]:
    """Stage 1: sample the step's completions and reward them (`start_sample` then `finish_sample`)."""
    return finish_sample(h, start_sample(h, batch, step))


def sampling_seed(run_seed: int, step: int) -> int:
    """The seed of step `step`'s sampling: a function of the run's seed and the step only, so a rerun and a resumed
    run sample the step alike."""
    return run_seed * 1_000_003 + step


def rank_share(batch: RLPromptBatch, completions: list[Completion], scored: RewardOutput, rank: int,
               world_size: int) -> tuple[RLPromptBatch, list[Completion], RewardOutput]:
    """This rank's whole groups of a step sampled for every rank: the same number of prompts per rank, prompt +
    completion tokens balanced (`balanced_split`), prompt indices renumbered within the share."""
    tokens = [0] * len(batch.prompt_ids)
    for c in completions:
        tokens[c.prompt_index] += len(c.prompt_ids) + len(c.completion_ids)
    mine = balanced_split(list(range(len(tokens))), tokens, rank, world_size)
    position = {prompt: i for i, prompt in enumerate(mine)}
    kept = [i for i, c in enumerate(completions) if c.prompt_index in position]
    return (batch.subset(mine), [replace(completions[i], prompt_index=position[completions[i].prompt_index]) for i in kept],
            scored.subset(kept))


# ---- score and estimate -------------------------------------------------------------------------------------------


def score(h, rollout: Rollout) -> dict[str, float]:
    """Stage 2: the frozen quantities of the samples: old and reference log-probs, the critic's values."""
    started = time.perf_counter()
    rl, micro = h.cfg.rl, h.cfg.train.micro_batch_size_per_device
    temperature = rl.rollout.temperature or 1.0
    head = shared_value_head(h)
    if head is not None:  # one pass of the policy: old log-probs and values together
        rollout.old_logprobs, rollout.values = score_logprobs_and_values(h.policy, rollout.completions, micro,
                                                                         temperature, head)
    elif not single_on_policy_update(h.cfg):
        rollout.old_logprobs = score_logprobs(h.policy, rollout.completions, micro, temperature)
    if h.reference is not None:
        with h.reference.active():  # e.g. LoRA: the policy with its adapters off
            rollout.ref_logprobs = score_logprobs(h.reference.model, rollout.completions, micro, temperature)
    if h.critic is not None and head is None:  # a model of its own
        rollout.values = h.critic.values(rollout.completions)
    return {"time/logprobs": time.perf_counter() - started}


def estimate(h, rollout: Rollout) -> None:
    """Stage 3: token rewards (with the k1 KL penalty when `rl.kl_in_reward`) -> advantages (and returns).

    Computed over EVERY rank's rollouts: whole groups live on one rank, but REINFORCE++'s batch
    whitening and GAE's token whitening need the global batch, so gathering makes each estimator
    exactly what one process holding the whole step computes; each rank keeps its own rows."""
    rl = h.cfg.rl
    if rollout.ref_logprobs is not None and rl.kl_penalty_in_reward:
        # k1 penalty per token: r_t - beta * (log pi_old - log pi_ref); summed, r - beta * KL of the sequence.
        rollout.token_rewards = [kl_penalty_rewards(r, o, f, rl.kl_coef) for r, o, f in
                                 zip(rollout.token_rewards, rollout.old_logprobs, rollout.ref_logprobs)]
    mine = (rollout.token_rewards, rollout.values, rollout.group_ids)
    gathered = h.strategy.gather_objects(mine)
    rows, values, groups, first, offset = [], [], [], 0, 0
    for rank, (rank_rewards, rank_values, rank_groups) in enumerate(gathered):
        if rank == h.strategy.data_rank:
            first = len(rows)
        rows += rank_rewards
        values += rank_values or []
        groups.append(rank_groups + offset)  # group ids are per-rank prompt indices: make them global
        offset += int(rank_groups.max()) + 1 if rank_groups.numel() else 0
    width = max((r.numel() for r in rows), default=0)
    inp = RolloutRewards(pad_rows(rows, width), pad_rows([torch.ones(r.numel()) for r in rows], width).bool(),
                         torch.cat(groups), pad_rows(values, width) if rollout.values is not None else None)
    out = estimate_advantages(rl.advantage, inp, advantage_params(h.cfg))
    mine_only = range(first, first + len(rollout.completions))
    rollout.advantages = [out.advantages[i, : rows[i].numel()] for i in mine_only]
    if out.returns is not None:
        rollout.returns = [out.returns[i, : rows[i].numel()] for i in mine_only]


# ---- sync ---------------------------------------------------------------------------------------------------------


def sync(h: RLHandles, step: int | None) -> dict[str, float]:
    """The engine samples from the policy's weights from now on: after the update of `step`, or on resume (None)."""
    return h.online.sync(h, step) if h.online is not None else h.engine.sync_weights(h.model)


# ---- what a step reports ------------------------------------------------------------------------------------------


def rollout_metrics(rollout) -> dict[str, float]:
    """Rewards, lengths, advantages (RL), and (with old log-probs) the engine/trainer mismatch and KL to the reference."""
    lengths = torch.tensor([c.num_sampled for c in rollout.completions], dtype=torch.float32)  # sampled tokens
    rewards = rollout.rewards
    metrics = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "truncated_fraction": sum(c.finish_reason == "length" for c in rollout.completions) / len(rollout.completions),
    }
    if rollout.advantages is not None:  # (online algorithms train on examples, without advantages)
        advantages = torch.cat(rollout.advantages)
        metrics.update({"advantage/mean": float(advantages.mean()),
                        "advantage/std": float(advantages.std()) if advantages.numel() > 1 else 0.0,
                        "advantage/abs_max": float(advantages.abs().max())})
    old, ref = rollout.old_logprobs, rollout.ref_logprobs
    if old is not None:  # else the update measures the engine/trainer mismatch (oxrl/loops/rl_update.py)
        metrics.update(mismatch_metrics(mismatch_sums(*sampled_logprobs(rollout.completions, old))))
    if ref is not None and old is not None:  # (without old log-probs the loss reports kl_ref)
        kl = torch.cat([o - f for o, f in zip(old, ref)])
        metrics["kl_ref/k1_mean"] = float(kl.mean()) if kl.numel() else 0.0
    return metrics


def global_metrics(strategy, metrics: dict[str, float], rewards: torch.Tensor) -> dict[str, float]:
    """Step metrics over all ranks: means of the ranks' means (every rank holds as many completions),
    maxima for `*max*` keys, and the reward spread from the gathered rewards."""
    if strategy.data_size == 1:
        return metrics
    per_rank = strategy.gather_objects(metrics)
    combined = {}
    for key in metrics:
        values = [m[key] for m in per_rank]
        combined[key] = max(values) if "max" in key else sum(values) / len(values)
    everyone = torch.cat(strategy.gather_objects(rewards))
    combined["reward/std"] = float(everyone.std()) if everyone.numel() > 1 else 0.0
    return combined


# ---- evaluation ---------------------------------------------------------------------------------------------------


def evaluate(h: RLHandles, batch: RLPromptBatch) -> dict[str, float]:
    """Greedy held-out accuracy: one completion (or episode) per prompt at temperature 0. `oxrl eval`'s
    greedy pass is these same calls (oxrl/evaluation/run.py), so the two report the same numbers."""
    if not batch.prompt_ids:
        return {}
    logger.info("held-out validation: greedy answers to %d prompts", len(batch.prompt_ids))
    completions, scored, _ = sample_and_reward(h.engine, h.reward_fn, h.env, batch, sampling_params(h.cfg, greedy=True))
    summary = summarise(completions, scored)
    return {"val/accuracy": summary["accuracy"], "val/reward": summary["reward/mean"]}


def correct_flags(components: dict[str, list[float]]) -> list[bool]:
    """Per completion: full marks on the first (correctness) reward."""
    first = next(iter(components.values()), [])
    return [score >= 1.0 for score in first]


def accuracy_of(components: dict[str, list[float]]) -> float:
    """Fraction of completions with full marks on the first (correctness) reward."""
    flags = correct_flags(components)
    return sum(flags) / len(flags) if flags else 0.0


def pass_ks(n: int) -> list[int]:
    """The k reported for n samples per prompt: powers of two below n, and n itself (n = 6: 1, 2, 4, 6)."""
    ks = [1 << power for power in range(n.bit_length()) if 1 << power < n]
    return ks + [n]


def summarise(completions: list[Completion], scored: RewardOutput) -> dict[str, float]:
    """The numbers an evaluation reports from completions and their rewards (in the same order); the loop's
    held-out evaluation (`evaluate`) and `oxrl eval` both sample with `sample_and_reward` and summarise here.
    A completion is correct when it has full marks (>= 1) on the first reward: the correctness reward (`math`,
    `reasoning_gym`, an environment's `score`); with several rewards, name that one first.

        accuracy                  fraction of correct completions (one greedy sample per prompt: greedy accuracy)
        reward/mean               mean total (weighted) reward
        reward/<label>            each reward's mean, when there are several
        response_length/mean      sampled tokens per completion; also response_length/max
        truncated_fraction        completions cut off at max_new_tokens
        pass@k                    k = 1, 2, 4, ..., n when every prompt has n > 1 samples (pass_at_k.py)
    """
    if not completions:
        return {}
    lengths = [c.num_sampled for c in completions]
    metrics = {
        "accuracy": accuracy_of(scored.components),
        "reward/mean": sum(scored.totals) / len(scored.totals),
        **({f"reward/{label}": sum(s) / len(s) for label, s in scored.components.items()} if len(scored.components) > 1 else {}),
        "response_length/mean": sum(lengths) / len(lengths),
        "response_length/max": float(max(lengths)),
        "truncated_fraction": sum(c.finish_reason == "length" for c in completions) / len(completions),
    }
    samples, correct = Counter(), Counter()
    for completion, is_correct in zip(completions, correct_flags(scored.components)):
        samples[completion.prompt_index] += 1
        correct[completion.prompt_index] += is_correct
    prompts = sorted(samples)
    n, c = torch.tensor([samples[p] for p in prompts]), torch.tensor([correct[p] for p in prompts])
    if int(n.min()) > 1:  # several samples of each held-out prompt
        from oxrl.algorithms.pass_at_k import pass_at_k

        for k in pass_ks(int(n.min())):
            metrics[f"pass@{k}"] = float(pass_at_k(n, c, k).mean())
    return metrics


def example_completions(rollout: Rollout, step: int, count: int = 3) -> list[dict]:
    """The first completion of each of the step's first `count` prompts, with its reward, for the run report."""
    batch = rollout.batch
    first_of_prompt: dict[int, int] = {}
    for i, completion in enumerate(rollout.completions):
        first_of_prompt.setdefault(completion.prompt_index, i)
    return [{"step": step, "prompt": batch.prompt_texts[p], "completion": rollout.completions[i].text,
             "reward": float(rollout.rewards[i])} for p, i in list(first_of_prompt.items())[:count]]


@contextmanager
def naming_step(step: int) -> Iterator[None]:
    """Prefix the step to a NonFiniteError raised inside (the rollout engine does not know the step), unless an inner
    stage named it already (a step sampled ahead is named as itself, not as the step that started it)."""
    try:
        yield
    except NonFiniteError as error:
        if str(error).startswith("step "):
            raise
        raise NonFiniteError(f"step {step}: {error}") from error
