"""The stages of one RL step before the update, each over the step's `Rollout`:

    sample     prompts -> completions (the rollout engine; multi-turn: episodes) -> rewards
    score      frozen log-probs of the samples: old (policy), reference, and the critic's values
    estimate   rewards (+ KL penalty) -> token rewards -> advantages (and GAE returns), over every rank

The update (oxrl/loops/rl_update.py) and the weight sync follow. Every stage reads the run's handles
(`RLHandles`, oxrl/loops/rl.py) and fills fields of the rollout; none keeps state of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from oxrl.algorithms.advantages import NEEDS_VALUES, RolloutRewards, estimate_advantages, place_outcome_reward
from oxrl.algorithms.kl import kl_penalty_rewards
from oxrl.config.schema import RLConfig
from oxrl.data.sampler import balanced_split
from oxrl.data.types import RLPromptBatch
from oxrl.loops.accuracy import accuracy_of
from oxrl.loops.rl_batch import pad_rows, score_logprobs, score_logprobs_and_values
from oxrl.loops.params import advantage_params
from oxrl.rewards.combine import RewardOutput
from oxrl.rollout.base import Completion, SamplingParams, Submits
from oxrl.training.nonfinite import NonFiniteError


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


def sampling_params(rl: RLConfig, greedy: bool = False) -> SamplingParams:
    r = rl.rollout
    if greedy:
        return SamplingParams(n=1, temperature=0.0, max_new_tokens=r.max_new_tokens, stop=r.stop)
    return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop=r.stop)


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
    params = sampling_params(h.cfg.rl)
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
        batch, completions, scored = rank_share(batch, completions, scored, h.strategy.rank, h.strategy.world_size)
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


def single_on_policy_update(rl: RLConfig) -> bool:
    """One optimizer step per rollout, on the policy that sampled it: pi_old IS the policy at update time, so the
    update's own log-probs (detached) are the old ones and no separate no-grad pass is needed (TRL and verl skip
    it too). Not with a KL reward penalty, whose old log-probs shape the rewards before the update, nor with a
    shared value head, whose values GAE needs before the update: the pass that gives them gives the old log-probs."""
    shared_head = rl.advantage in NEEDS_VALUES and rl.critic_backbone == "shared"
    return rl.epochs == 1 and rl.mini_batches == 1 and not (rl.kl_in_reward and rl.kl_coef > 0) and not shared_head


def shared_value_head(h) -> torch.nn.Module | None:
    """The critic's value head on the policy's backbone (`rl.critic_backbone: shared`), else None."""
    return h.critic.shared_head if h.critic is not None else None


def score(h, rollout: Rollout) -> dict[str, float]:
    """Stage 2: the frozen quantities of the samples: old and reference log-probs, the critic's values."""
    started = time.perf_counter()
    rl, micro = h.cfg.rl, h.cfg.train.micro_batch_size_per_device
    temperature = rl.rollout.temperature or 1.0
    head = shared_value_head(h)
    if head is not None:  # one pass of the policy: old log-probs and values together
        rollout.old_logprobs, rollout.values = score_logprobs_and_values(h.policy, rollout.completions, micro,
                                                                         temperature, head)
    elif not single_on_policy_update(rl):
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
    if rollout.ref_logprobs is not None and rl.kl_in_reward:
        # k1 penalty per token: r_t - beta * (log pi_old - log pi_ref); summed, r - beta * KL of the sequence.
        rollout.token_rewards = [kl_penalty_rewards(r, o, f, rl.kl_coef) for r, o, f in
                                 zip(rollout.token_rewards, rollout.old_logprobs, rollout.ref_logprobs)]
    mine = (rollout.token_rewards, rollout.values, rollout.group_ids)
    gathered = h.strategy.gather_objects(mine)
    rows, values, groups, first, offset = [], [], [], 0, 0
    for rank, (rank_rewards, rank_values, rank_groups) in enumerate(gathered):
        if rank == h.strategy.rank:
            first = len(rows)
        rows += rank_rewards
        values += rank_values or []
        groups.append(rank_groups + offset)  # group ids are per-rank prompt indices: make them global
        offset += int(rank_groups.max()) + 1 if rank_groups.numel() else 0
    width = max((r.numel() for r in rows), default=0)
    inp = RolloutRewards(pad_rows(rows, width), pad_rows([torch.ones(r.numel()) for r in rows], width).bool(),
                         torch.cat(groups), pad_rows(values, width) if rollout.values is not None else None)
    out = estimate_advantages(rl.advantage, inp, advantage_params(rl))
    mine_only = range(first, first + len(rollout.completions))
    rollout.advantages = [out.advantages[i, : rows[i].numel()] for i in mine_only]
    if out.returns is not None:
        rollout.returns = [out.returns[i, : rows[i].numel()] for i in mine_only]


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
