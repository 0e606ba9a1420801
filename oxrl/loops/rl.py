"""RL with verifiable rewards: the algorithm box.

    for each step:
        prompts      <- this rank's share of the step's prompts (deterministic by seed, resumable)
        completions  <- engine.generate(prompts, n per prompt)         exact sampled token ids
        rewards      <- reward functions(prompt, completion, row fields)
                        (multi-turn: engine turns alternate with env.step, whose rewards are summed)
        old_logp     <- policy log-probs of the samples (trainer, no grad); ref_logp if KL is on
                        (one update per rollout: the update's own log-probs, detached, are old_logp)
        advantages   <- estimator(rewards, groups)                      e.g. Dr. GRPO: r - mean(group)
                        (over every rank's rewards: groups and batch statistics are global)
        for epoch in rl.epochs, for mini-batch in rl.mini_batches:
            loss     <- policy loss(logp, old_logp, advantages) / step-wide normaliser
            backward per micro-batch; optimizer step (none when loss/grad norm is inf/NaN)
        engine.sync_weights(model)

Resume: a checkpoint holds the weights, optimizer, schedule and every RNG; the prompts of a step are
a function of the step, and the built-in `hf` engine samples from torch's global RNG, so a resumed
run repeats the uninterrupted one exactly. PPO's critic is not checkpointed yet: it restarts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from oxrl.algorithms.advantages import compute_advantages
from oxrl.algorithms.policy_loss import PolicyLossInput, local_normaliser, policy_loss
from oxrl.config.schema import Config, RLConfig
from oxrl.data.sampler import StepSampler, micro_batches, split_for_rank
from oxrl.data.types import RLPromptBatch, pack
from oxrl.training.nonfinite import NonFiniteError, NonFiniteGuard
from oxrl.training.optim import build_optimizer, build_scheduler
from oxrl.training.run_dir import resume_path
from oxrl.evaluation.metrics import accuracy_of, summarise
from oxrl.logging.metrics import MetricsLogger
from oxrl.loops.critic import critic_step, gae_advantages, score_values
from oxrl.loops.mismatch import OffPolicyError, check_on_policy, mismatch_metrics, mismatch_sums, sampled_logprobs
from oxrl.loops.rl_batch import completion_example, pad_rows, policy_rows
from oxrl.loops.rl_presets import advantage_params, loss_params
from oxrl.rewards.combine import RewardOutput
from oxrl.rollout.base import Completion, SamplingParams
from oxrl.rollout.multiturn import Environment, run_episodes

logger = logging.getLogger(__name__)


@dataclass
class Rollouts:
    completions: list[Completion]
    rewards: torch.Tensor  # [N]
    group_ids: torch.Tensor  # [N]
    old_logprobs: list[torch.Tensor] | None  # per completion [len]; None: the single update computes them
    ref_logprobs: list[torch.Tensor] | None
    advantages: list[torch.Tensor] | None = None  # per completion [len]; outcome estimators repeat one value
    values: list[torch.Tensor] | None = None  # PPO critic, per completion [len]
    returns: list[torch.Tensor] | None = None  # PPO critic targets, per completion [len]


@dataclass
class Critic:
    """PPO's value model and its optimizer (see oxrl/loops/critic.py)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    nonfinite: NonFiniteGuard = field(default_factory=lambda: NonFiniteGuard(subject="critic"))


def sampling_params(rl: RLConfig, greedy: bool = False) -> SamplingParams:
    r = rl.rollout
    if greedy:
        return SamplingParams(n=1, temperature=0.0, max_new_tokens=r.max_new_tokens, stop=r.stop)
    return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop=r.stop)


@torch.no_grad()
def score_logprobs(model, completions: list[Completion], micro_size: int, temperature: float) -> list[torch.Tensor]:
    """Per-completion token log-probs under `model` (packed micro-batches, no grad)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    for chunk in micro_batches(completions, micro_size):
        logprobs, _, valid = policy_rows(model, pack([completion_example(c) for c in chunk]).to(device), temperature, False)
        out.extend(row[mask].float().cpu() for row, mask in zip(logprobs, valid))
    model.train(was_training)
    return out


def sample_and_score(engine, reward_fn, env: Environment | None, batch: RLPromptBatch,
                     params: SamplingParams) -> tuple[list[Completion], RewardOutput, dict[str, float]]:
    """Completions of the batch's prompts, their rewards, and timing/episode metrics. Single-turn: the
    engine samples and the reward functions score the text. Multi-turn (`env`): the episodes' summed
    environment rewards are the rewards (oxrl/rollout/multiturn.py)."""
    started = time.perf_counter()
    if env is not None:
        episodes = run_episodes(engine, env, batch.prompt_ids, batch.fields, params)
        engine.offload()  # every turn is sampled: the trainer gets the memory back
        return episodes.completions, episodes.reward_output(), {"time/generate": time.perf_counter() - started,
                                                                **episodes.metrics()}
    completions = engine.generate(batch.prompt_ids, params)
    engine.offload()
    generated = time.perf_counter()
    scored = reward_fn([batch.prompt_texts[c.prompt_index] for c in completions], [c.text for c in completions],
                       [batch.fields[c.prompt_index] for c in completions], [batch.origins[c.prompt_index] for c in completions])
    return completions, scored, {"time/generate": generated - started, "time/reward": time.perf_counter() - generated}


def collect(cfg: Config, rl: RLConfig, engine, reward_fn, model, reference, batch: RLPromptBatch,
            critic: Critic | None = None, strategy=None, env: Environment | None = None) -> tuple[Rollouts, dict[str, float]]:
    """Generate, score, and compute the frozen quantities of one step (old/ref log-probs, advantages)."""
    completions, scored, sampling_metrics = sample_and_score(engine, reward_fn, env, batch, sampling_params(rl))
    started = time.perf_counter()
    temperature = rl.rollout.temperature or 1.0
    micro = cfg.train.micro_batch_size_per_device
    old = None if single_on_policy_update(rl) else score_logprobs(model, completions, micro, temperature)
    ref = score_logprobs(reference, completions, micro, temperature) if reference is not None else None
    rewards = torch.tensor(scored.totals, dtype=torch.float32)
    group_ids = torch.tensor([c.prompt_index for c in completions])
    rollouts = Rollouts(completions, rewards, group_ids, old, ref)
    kl_tokens = [o - r for o, r in zip(old, ref)] if ref is not None and rl.kl_in_reward else None
    if rl.advantage == "gae":
        rollouts.values = score_values(critic.model, completions, micro)
        rollouts.advantages, rollouts.returns = gae_advantages(rl, completions, rewards, rollouts.values, kl_tokens)
    else:
        if kl_tokens is not None:
            # k1 penalty on the outcome reward: r - beta * sum_t (log pi - log pi_ref) over the sequence.
            rewards = rollouts.rewards = rewards - rl.kl_coef * torch.stack([k.sum() for k in kl_tokens])
        scalar = global_outcome_advantages(rl, rewards, group_ids, strategy)
        rollouts.advantages = [a.expand(c.num_sampled).clone() for a, c in zip(scalar, completions)]
    timings = {**sampling_metrics, "time/logprobs": time.perf_counter() - started}
    quality = {"accuracy": accuracy_of(scored.components)}
    return rollouts, {**scored.metrics("reward"), **quality, **timings, **rollout_metrics(rollouts, rl)}


def single_on_policy_update(rl: RLConfig) -> bool:
    """One optimizer step per rollout, on the policy that sampled it: pi_old IS the policy at update time, so the
    update's own log-probs (detached) are the old ones and no separate no-grad pass is needed (TRL and verl skip
    it too). Not with a KL reward penalty, whose old log-probs shape the rewards before the update."""
    return rl.epochs == 1 and rl.mini_batches == 1 and not (rl.kl_in_reward and rl.kl_coef > 0)


def global_outcome_advantages(rl: RLConfig, rewards: torch.Tensor, group_ids: torch.Tensor, strategy=None) -> torch.Tensor:
    """This rank's outcome advantages [N], computed over EVERY rank's rewards: whole groups live on
    one rank, and REINFORCE++'s batch whitening needs the global batch, so gathering makes each
    estimator exactly what one process holding the whole step would compute."""
    gathered = strategy.gather_objects((rewards, group_ids)) if strategy is not None else [(rewards, group_ids)]
    rank = strategy.rank if strategy is not None else 0
    all_rewards, all_groups, start, offset = [], [], 0, 0
    for source, (rank_rewards, rank_groups) in enumerate(gathered):
        if source == rank:
            start = sum(r.numel() for r in all_rewards)
        all_rewards.append(rank_rewards)
        all_groups.append(rank_groups + offset)  # group ids are per-rank prompt indices: make them global
        offset += int(rank_groups.max()) + 1 if rank_groups.numel() else 0
    advantages = compute_advantages(rl.advantage, torch.cat(all_rewards), torch.cat(all_groups), advantage_params(rl))
    return advantages[start : start + rewards.numel()]


def global_metrics(strategy, metrics: dict[str, float], rewards: torch.Tensor) -> dict[str, float]:
    """Step metrics over all ranks: means of the ranks' means (every rank holds as many completions),
    maxima for `*max*` keys, and the reward spread from the gathered rewards."""
    if strategy is None or strategy.world_size == 1:
        return metrics
    per_rank = strategy.gather_objects(metrics)
    combined = {}
    for key in metrics:
        values = [m[key] for m in per_rank]
        combined[key] = max(values) if "max" in key else sum(values) / len(values)
    everyone = torch.cat(strategy.gather_objects(rewards))
    combined["reward/std"] = float(everyone.std()) if everyone.numel() > 1 else 0.0
    return combined


def rollout_metrics(r: Rollouts, rl: RLConfig) -> dict[str, float]:
    lengths = torch.tensor([c.num_sampled for c in r.completions], dtype=torch.float32)  # sampled tokens
    advantages = torch.cat(r.advantages)
    metrics = {
        "reward/mean": float(r.rewards.mean()),
        "reward/std": float(r.rewards.std()) if r.rewards.numel() > 1 else 0.0,
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "truncated_fraction": sum(c.finish_reason == "length" for c in r.completions) / len(r.completions),
        "advantage/mean": float(advantages.mean()),
        "advantage/std": float(advantages.std()) if advantages.numel() > 1 else 0.0,
        "advantage/abs_max": float(advantages.abs().max()),
    }
    if r.old_logprobs is not None:  # else the update measures the engine/trainer mismatch (oxrl/loops/mismatch.py)
        metrics.update(mismatch_metrics(mismatch_sums(*sampled_logprobs(r.completions, r.old_logprobs))))
    if r.ref_logprobs is not None and r.old_logprobs is not None:  # (without old_logprobs the loss reports kl_ref)
        kl = torch.cat([o - f for o, f in zip(r.old_logprobs, r.ref_logprobs)])
        metrics["kl_ref/k1_mean"] = float(kl.mean()) if kl.numel() else 0.0
    return metrics


def update(cfg: Config, rl: RLConfig, model, strategy, rollouts: Rollouts, first_check: bool,
           critic: Critic | None = None, train_policy: bool = True, step: int | None = None) -> dict[str, float]:
    """rl.epochs x rl.mini_batches optimizer steps on one step's rollouts; returns metrics averaged over them.
    `step` (the loop's step number) names the step in non-finite warnings and errors."""
    params = loss_params(rl)
    order = list(range(len(rollouts.completions)))
    per_mini = math.ceil(len(order) / rl.mini_batches)
    totals: dict[str, float] = {}
    updates = 0
    for epoch in range(rl.epochs):
        for mini in micro_batches(order, per_mini):
            sums = {}
            if train_policy:
                sums = _mini_batch_step(cfg, rl, model, strategy, rollouts, mini, params,
                                        check=first_check and updates == 0, step=step)
            if critic is not None:
                sums.update(critic_step(rl, critic.model, critic.optimizer, [rollouts.completions[i] for i in mini],
                                        [rollouts.values[i] for i in mini], [rollouts.returns[i] for i in mini],
                                        cfg.train.micro_batch_size_per_device, critic.nonfinite, step))
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + value
            updates += 1
    return {key: value / updates for key, value in totals.items()}


def _mini_batch_step(cfg, rl, model, strategy, rollouts: Rollouts, indices: list[int], params, check: bool,
                     step: int | None = None) -> dict[str, float]:
    temperature = rl.rollout.temperature or 1.0
    micro = [indices[i : i + cfg.train.micro_batch_size_per_device] for i in range(0, len(indices), cfg.train.micro_batch_size_per_device)]
    lengths = [rollouts.completions[i].num_sampled for i in indices]  # trained tokens per completion
    local = local_normaliser(pad_rows([torch.ones(n) for n in lengths], max(lengths)), params.aggregation)
    normaliser = strategy.all_reduce_sum(float(local))
    sums: dict[str, float] = {}
    gap: dict[str, float] = {}  # engine/trainer mismatch sums, when this update supplies the old log-probs
    for mb in micro:
        batch = pack([completion_example(rollouts.completions[i]) for i in mb]).to(strategy.device)
        with strategy.autocast():
            logprobs, entropy, valid = policy_rows(model, batch, temperature, with_entropy=True)
        width = valid.shape[1]
        own_old = rollouts.old_logprobs is None  # single on-policy update: pi_old is the policy right now
        behaviour = None  # the engine's own log-probs of its samples: for the mismatch sums and truncated IS
        if own_old or params.tis_cap is not None:
            behaviour = pad_rows([torch.tensor(rollouts.completions[i].logprobs) for i in mb], width).to(logprobs.device)
        if own_old:
            old = logprobs.detach().float()
            for key, value in mismatch_sums(behaviour[valid], old[valid]).items():
                gap[key] = gap.get(key, 0.0) + value
        else:
            old = pad_rows([rollouts.old_logprobs[i] for i in mb], width).to(logprobs.device)
        ref = pad_rows([rollouts.ref_logprobs[i] for i in mb], width).to(logprobs.device) if rollouts.ref_logprobs is not None and params.kl_coef > 0 else None
        if check and not own_old:  # with its own old log-probs the first ratio is 1 by construction
            ratio_gap = float(((logprobs.detach().float() - old).abs() * valid).max())
            if ratio_gap > rl.on_policy_tolerance:
                raise OffPolicyError(f"strict_on_policy: the first update's ratio is not 1 (max |log ratio| = {ratio_gap:.3g})")
        advantages = pad_rows([rollouts.advantages[i] for i in mb], width).to(logprobs.device)
        inp = PolicyLossInput(
            logprobs=logprobs.float(), old_logprobs=old, advantages=advantages, mask=valid, normaliser=normaliser,
            ref_logprobs=ref, entropy=entropy.float() if params.entropy_coef > 0 else entropy.detach().float(),
            behaviour_logprobs=behaviour if params.tis_cap is not None else None,
        )
        loss, metrics = policy_loss(rl.policy_loss, inp, params)
        strategy.backward(loss)
        sums["loss"] = sums.get("loss", 0.0) + float(loss.detach())
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + float(value)
    sums = {key: strategy.all_reduce_sum(value) for key, value in sums.items()}  # shares of global means: add ranks
    if gap:
        mismatch = mismatch_metrics({key: strategy.all_reduce_sum(value) for key, value in gap.items()})
        if check:  # before the optimizer step: a refused update changes nothing
            check_on_policy(mismatch["logprob_mismatch/mean_abs"], rl.on_policy_tolerance)
        sums.update(mismatch)
    sums["grad_norm"] = strategy.step(loss=sums["loss"], step=step)  # skipped when either is inf/NaN
    return sums


def evaluate(engine, reward_fn, batch: RLPromptBatch, rl: RLConfig, env: Environment | None = None) -> dict[str, float]:
    """Greedy held-out accuracy: one completion (or episode) per prompt at temperature 0. `oxrl eval`'s
    greedy pass is these same calls (oxrl/evaluation/run.py), so the two report the same numbers."""
    if not batch.prompt_ids:
        return {}
    completions, scored, _ = sample_and_score(engine, reward_fn, env, batch, sampling_params(rl, greedy=True))
    summary = summarise(completions, scored)
    return {"val/accuracy": summary["accuracy"], "val/reward": summary["reward/mean"]}


def example_completions(batch: RLPromptBatch, rollouts: Rollouts, step: int, count: int = 3) -> list[dict]:
    """The first completion of each of the step's first `count` prompts, with its reward, for the run report."""
    first_of_prompt: dict[int, int] = {}
    for i, completion in enumerate(rollouts.completions):
        first_of_prompt.setdefault(completion.prompt_index, i)
    return [{"step": step, "prompt": batch.prompt_texts[p], "completion": rollouts.completions[i].text,
             "reward": float(rollouts.rewards[i])} for p, i in list(first_of_prompt.items())[:count]]


def subset(batch: RLPromptBatch, indices: list[int]) -> RLPromptBatch:
    return RLPromptBatch([batch.prompt_ids[i] for i in indices], [batch.prompt_texts[i] for i in indices],
                         [batch.fields[i] for i in indices], [batch.origins[i] for i in indices])


@contextmanager
def naming_step(step: int) -> Iterator[None]:
    """Prefix the step to a NonFiniteError raised inside (the rollout engine does not know the step)."""
    try:
        yield
    except NonFiniteError as error:
        raise NonFiniteError(f"step {step}: {error}") from error


@dataclass
class RLResult:
    steps: int
    rewards: list[float]  # mean reward per step
    accuracy_before: float | None
    accuracy_after: float | None
    final_metrics: dict[str, float]
    samples: dict[str, list[dict]] = field(default_factory=dict)  # "first"/"last": example_completions of those steps


def train_rl(cfg: Config, rl: RLConfig, model, tokenizer, engine, reward_fn, train: RLPromptBatch, val: RLPromptBatch,
             strategy, run_dir: Path, reference=None, critic: Critic | None = None, env: Environment | None = None) -> RLResult:
    """RL training; `reward_fn` scores single-turn completions, or `env` runs multi-turn episodes and rewards them."""
    sampler = StepSampler(len(train.prompt_ids), rl.prompts_per_step, cfg.run.seed, shuffle=cfg.data.shuffle)
    total_steps = sampler.total_steps(cfg.train.epochs, cfg.train.max_steps)
    if rl.prompts_per_step % strategy.world_size:
        raise ValueError(f"rl.prompts_per_step ({rl.prompts_per_step}) must be a multiple of the world size "
                         f"({strategy.world_size}): each rank samples whole groups")
    if critic is not None and strategy.world_size > 1:
        raise ValueError("PPO's critic (rl.advantage `gae`) trains in one process only for now: use a critic-free "
                         "algorithm (grpo, dr_grpo, rloo, reinforce_pp, ...) under torchrun")
    if critic is not None:
        critic.nonfinite.max_consecutive = cfg.train.max_nonfinite_steps
    optimizer = build_optimizer(model, cfg.train.optim)
    scheduler = build_scheduler(optimizer, total_steps * rl.epochs * rl.mini_batches, cfg.train.optim)
    # `policy` is what the loop calls (a DeepSpeed engine wraps the module); `model` stays the module the
    # rollout engine samples from.
    policy = strategy.prepare(model, optimizer, scheduler)
    policy.train()
    if strategy.world_size > 1:
        torch.manual_seed(cfg.run.seed + strategy.rank)  # weights are in sync already; samples must differ per rank
    start_step = 0
    resume_from = resume_path(cfg, run_dir)
    if resume_from is not None:
        state = strategy.load_checkpoint(resume_from)
        start_step = state["step"]
        strategy.nonfinite.load_state_dict(state)
        engine.sync_weights(model)
    metrics_log = MetricsLogger(run_dir, total_steps, start_step, enabled=strategy.is_main,
                                progress_bar=cfg.logging.progress_bar, config=cfg)
    evaluate_now = rl.validation_every is not None and val.prompt_ids
    before = evaluate(engine, reward_fn, val, rl, env) if evaluate_now and start_step == 0 else {}
    if before:
        metrics_log.log(start_step, before, advance=False)
        logger.info("held-out accuracy before training: %.3f", before["val/accuracy"])
    rewards: list[float] = []
    metrics: dict[str, float] = {}
    samples: dict[str, list[dict]] = {}
    last_eval = before
    try:
        for step in range(start_step, total_steps):
            started = time.perf_counter()
            batch = subset(train, split_for_rank(sampler.step_indices(step), strategy.rank, strategy.world_size))
            with naming_step(step + 1):  # e.g. sampling from weights that diverged in the last update
                rollouts, metrics = collect(cfg, rl, engine, reward_fn, policy, reference, batch, critic, strategy, env)
            metrics = global_metrics(strategy, metrics, rollouts.rewards)
            if rl.strict_on_policy and rollouts.old_logprobs is not None:  # else the update checks it
                check_on_policy(metrics["logprob_mismatch/mean_abs"], rl.on_policy_tolerance)
            train_started = time.perf_counter()
            warming_up = critic is not None and step < rl.critic_warmup_steps  # only the critic learns
            metrics.update(update(cfg, rl, policy, strategy, rollouts, first_check=rl.strict_on_policy and not warming_up,
                                  critic=critic, train_policy=not warming_up, step=step + 1))
            metrics.update(engine.sync_weights(model))  # e.g. vLLM: the sync's seconds and probe gap
            metrics["time/train"] = time.perf_counter() - train_started
            elapsed = time.perf_counter() - started
            generated = strategy.all_reduce_sum(float(sum(c.num_sampled for c in rollouts.completions)))
            metrics["train/nonfinite_steps"] = strategy.nonfinite.skipped
            if critic is not None:
                metrics["critic/nonfinite_steps"] = critic.nonfinite.skipped
            metrics.update({"lr": scheduler.get_last_lr()[0], "time/step": elapsed,
                            "completions_per_s": len(rollouts.completions) * strategy.world_size / elapsed, "tokens_per_s": generated / elapsed})
            rewards.append(metrics["reward/mean"])
            done = step + 1
            if step == start_step or done == total_steps:  # this rank's, for the report (rank 0 writes it)
                samples["first" if step == start_step else "last"] = example_completions(batch, rollouts, done)
            if evaluate_now and (done % rl.validation_every == 0 or done == total_steps):
                with naming_step(done):
                    last_eval = evaluate(engine, reward_fn, val, rl, env)
                metrics.update(last_eval)
            if done % cfg.logging.every == 0 or done == total_steps:
                metrics_log.log(done, metrics)
            if cfg.checkpoint.every and (done % cfg.checkpoint.every == 0 or done == total_steps):
                strategy.save_checkpoint(run_dir, done, tokenizer, strategy.nonfinite.state_dict(), cfg.checkpoint.keep_last,
                                         cfg.lora.save)
    finally:
        metrics_log.close()
    return RLResult(total_steps, rewards, before.get("val/accuracy"), last_eval.get("val/accuracy"), metrics, samples)
