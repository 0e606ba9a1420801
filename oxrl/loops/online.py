"""Online algorithms: the step's samples become offline examples, trained with an offline objective.

    for each step:
        sample     completions <- engine(prompts, n each); rewards <- any reward        (as in RL: rl.py),
                   `rl.max_staleness` steps ahead as in RL (oxrl/loops/pipeline.py; not spin)
        select     online_dpo: (best, worst) pair per prompt, ties dropped       oxrl/algorithms/online.py
                   rft:        the completions at or above the threshold (or best-of-n), distinct
                   spin:       (gold answer, own answer) for every own answer
        update     rl.epochs x rl.mini_batches steps of the objective on them (online.loss / SFT), against
                   the reference where the loss has one: the initial policy (online_dpo), the opponent (spin)
        sync       engine <- policy (spin: at the iteration's end, opponent <- policy, then the engine)

The loop, checkpoints, resume and metrics are the RL loop's (oxrl/loops/rl.py); only the update differs.
The objectives are the offline ones (oxrl/loops/objectives.py), so a pair is scored exactly as in DPO.

SPIN (arXiv:2401.01335): in iteration t the opponent, a frozen copy of the policy theta_t, answers the
prompts and is the DPO reference; the engine samples from the opponent, so every own answer of the
iteration is theta_t's, as in the paper's synthetic data. The iteration ends after
`online.iteration_steps` steps; then theta_{t+1} (the trained policy) becomes the opponent.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from oxrl.algorithms.online import best_worst_pairs, rejection_sample
from oxrl.config.schema import Config
from oxrl.data.sampler import balanced_split, micro_batches
from oxrl.data.types import Example, RLPromptBatch, Sequence
from oxrl.loops.sl import Objective
from oxrl.loops.objectives import get_objective
from oxrl.loops.rl import global_metrics, naming_step, rollout_metrics, sync
from oxrl.loops.rl_update import completion_example
from oxrl.loops.sl import run_micro_batches
from oxrl.models.reference import FrozenModel, build_reference

logger = logging.getLogger(__name__)


@dataclass
class Selection:
    examples: list[Example]  # this rank's examples of the step
    counts: dict[str, float] = field(default_factory=dict)  # this rank's counts, summed over ranks for the metrics
    rates: dict[str, tuple[str, str]] = field(default_factory=dict)  # metric -> (numerator, denominator) of counts


def _sequence(completion) -> Sequence:
    (sequence,) = completion_example(completion).sequences  # single-turn: one sequence per completion
    return sequence


class OnlineMethod(ABC):
    """What sets Online DPO, RFT and SPIN apart: how samples become examples, and when the engine syncs."""

    def __init__(self, cfg: Config, objective: Objective, reference: FrozenModel | None = None):
        self.cfg = cfg
        self.objective = objective
        self.reference = reference  # the loss's reference (None for SFT, SimPO, ORPO)

    @abstractmethod
    def select(self, batch: RLPromptBatch, rollout) -> Selection:
        """This rank's examples of the step, from its prompts and their scored samples."""

    def sync(self, h, step: int | None) -> dict[str, float]:
        """After each update (`step`), and on resume (None): the engine samples from the policy."""
        return h.engine.sync_weights(h.model)

    def step(self, h, rollout, metrics: dict[str, float], step: int) -> tuple[dict[str, float], object]:
        """select -> update -> sync on the step's samples (and their sampling's `metrics`): the RL loop's step for
        an online method; the metrics and rollout."""
        with naming_step(step):
            selection = self.select(rollout.batch, rollout)
        metrics = global_metrics(h.strategy, {**metrics, **rollout_metrics(rollout)}, rollout.rewards)
        started = time.perf_counter()
        metrics["lr"] = h.strategy.scheduler.get_last_lr()[0]  # the step's (first) update's, before the schedule moves
        metrics.update(online_update(h, selection, step))
        metrics.update(sync(h, step))
        metrics.update({"time/train": time.perf_counter() - started, "train/nonfinite_steps": h.strategy.nonfinite.skipped})
        return metrics, rollout


class OnlineDPO(OnlineMethod):
    def select(self, batch: RLPromptBatch, rollout) -> Selection:
        pairs = best_worst_pairs(rollout.rewards, rollout.group_ids)
        examples = [Example([_sequence(rollout.completions[c]), _sequence(rollout.completions[r])])
                    for c, r in zip(pairs.chosen, pairs.rejected)]
        counts = {"pairs/count": len(examples), "pairs/ties": pairs.ties, "prompts": len(pairs.chosen) + pairs.ties,
                  "gap_sum": sum(pairs.reward_gaps)}
        return Selection(examples, counts, {"pairs/tie_fraction": ("pairs/ties", "prompts"),
                                            "pairs/reward_gap": ("gap_sum", "pairs/count")})


class RFT(OnlineMethod):
    def select(self, batch: RLPromptBatch, rollout) -> Selection:
        online = self.cfg.online
        kept = rejection_sample(rollout.rewards, rollout.group_ids, [c.completion_ids for c in rollout.completions],
                                online.keep, online.threshold, online.dedupe)
        examples = [completion_example(rollout.completions[i]) for i in kept.indices]
        counts = {"rft/kept": len(examples), "rft/duplicates": kept.duplicates, "samples": len(rollout.completions)}
        return Selection(examples, counts, {"rft/kept_fraction": ("rft/kept", "samples")})


class SPIN(OnlineMethod):
    """The reference is the opponent: a frozen copy of the policy, which the engine samples from."""

    def __init__(self, cfg: Config, objective: Objective, reference: FrozenModel, tokenizer, iteration_steps: int):
        super().__init__(cfg, objective, reference)
        self.tokenizer = tokenizer
        self.iteration_steps = iteration_steps

    def gold_ids(self, batch: RLPromptBatch, index: int) -> list[int]:
        """The gold answer's tokens as an assistant turn the engine would end: its text, then EOS."""
        field_name = self.cfg.online.gold_field
        gold = batch.fields[index].get(field_name)
        if not isinstance(gold, str) or not gold.strip():
            raise ValueError(f"`spin` needs the gold answer in the field `{field_name}` (online.gold_field) of every "
                             f"prompt row; {batch.origins[index]} has {gold!r}")
        ids = self.tokenizer(gold, add_special_tokens=False)["input_ids"]
        eos = self.tokenizer.eos_token_id
        return ids + ([eos] if eos is not None else [])

    def select(self, batch: RLPromptBatch, rollout) -> Selection:
        examples, same = [], 0
        gold = {index: self.gold_ids(batch, index) for index in sorted({c.prompt_index for c in rollout.completions})}
        for completion in rollout.completions:
            prompt, answer = completion.prompt_ids, gold[completion.prompt_index]
            same += list(completion.completion_ids) == answer
            chosen = Sequence(prompt + answer, [False] * len(prompt) + [True] * len(answer), completion.vision)
            examples.append(Example([chosen, _sequence(completion)]))
        counts = {"spin/pairs": len(examples), "spin/same": same}
        return Selection(examples, counts, {"spin/own_equals_gold": ("spin/same", "spin/pairs")})

    def sync(self, h, step: int | None) -> dict[str, float]:
        if step is not None and step % self.iteration_steps:  # mid-iteration: the opponent and the engine keep theta_t
            return {"spin/iteration": float(step // self.iteration_steps + 1)}
        self.reference.model.load_state_dict(h.model.state_dict())  # theta_{t+1} becomes the opponent
        metrics = h.engine.sync_weights(self.reference.model)
        if step is not None:
            logger.info("spin: iteration %d ends at step %d; the policy becomes the opponent", step // self.iteration_steps, step)
        return {**metrics, "spin/iteration": float(0 if step is None else step // self.iteration_steps)}


def build_online(cfg: Config, model, tokenizer, strategy, train_prompts: int) -> tuple[OnlineMethod, torch.nn.Module]:
    """The run's online method, and the model its engine samples from (the policy; for SPIN the opponent)."""
    name = cfg.algorithm.name
    objective = get_objective(cfg.trained_objective, cfg.preference)
    if name == "spin":
        steps = spin_iteration_steps(cfg, train_prompts)
        opponent = build_reference("frozen_copy", model, [], cfg.train.micro_batch_size_per_device, strategy)
        return SPIN(cfg, objective, opponent, tokenizer, steps), opponent.model
    reference = None
    if objective.needs_reference:
        reference = build_reference(cfg.preference.reference, model, [], cfg.train.micro_batch_size_per_device, strategy)
    method = {"online_dpo": OnlineDPO, "rft": RFT}[name]
    return method(cfg, objective, reference), model


def spin_iteration_steps(cfg: Config, train_prompts: int, validating: bool = False) -> int:
    """SPIN's steps per iteration; a checkpoint, or with held-out prompts (`validating`) a validation, inside an
    iteration is refused (before the model loads): the opponent is not saved, so a run resumes, and is validated, at
    an iteration's end only."""
    steps = cfg.online.iteration_steps or math.ceil(train_prompts / cfg.rl.prompts_per_step)
    periods = [("checkpoint.every", cfg.checkpoint.every)]
    if validating:
        periods.append(("rl.validation_every", cfg.rl.validation_every))
    for key, every in periods:
        if every and every % steps:
            raise ValueError(f"`spin`: {key} ({every}) must be a multiple of the iteration's {steps} steps "
                             "(online.iteration_steps, null: one pass over the prompts)")
    return steps


def online_update(h, selection: Selection, step: int) -> dict[str, float]:
    """`rl.epochs` x `rl.mini_batches` optimizer steps of the objective on every rank's examples of the step.

    The examples are pooled over ranks and dealt out again with `balanced_split` (the same number per
    rank, so sharded forwards stay in step); a remainder below the world size is left out. A step with
    no example (every prompt a tie, nothing kept) makes no optimizer step."""
    strategy, rl, micro = h.strategy, h.cfg.rl, h.cfg.train.micro_batch_size_per_device
    counts = {key: strategy.all_reduce_sum(float(value)) for key, value in selection.counts.items()}
    metrics = {key: value for key, value in counts.items() if "/" in key}
    metrics.update({name: counts[a] / counts[b] if counts[b] else 0.0 for name, (a, b) in selection.rates.items()})
    pooled = [e for rank in strategy.gather_objects(selection.examples) for e in rank]
    usable = len(pooled) - len(pooled) % strategy.data_size
    metrics["online/examples"] = float(usable)
    if usable == 0:
        logger.info("step %d: no examples to train on (%s): no optimizer step", step, counts)
        return metrics
    pooled = pooled[:usable]
    mine = balanced_split(pooled, [e.num_tokens for e in pooled], strategy.data_rank, strategy.data_size)
    totals: dict[str, float] = {}
    updates = 0
    for _epoch in range(rl.epochs):
        for part in micro_batches(mine, math.ceil(len(mine) / rl.mini_batches)):
            sums, _ = run_micro_batches(h.online.objective, h.policy, part, micro, strategy, h.online.reference)
            sums["grad_norm"] = strategy.step(loss=sums["loss"], step=step)  # skipped when inf/NaN
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + value
            updates += 1
    return {**metrics, **{key: value / updates for key, value in totals.items()}}
