"""The offline (supervised / preference) training loop.

    for each optimizer step:
        examples  <- this rank's share of the step's global batch (deterministic, resumable;
                     same count on every rank, token totals balanced: `balanced_split`)
        N         <- loss units (e.g. trained tokens) in the whole step, summed over ranks
        for each micro-batch (whole examples packed in one row, no padding):
            loss  <- objective(model, micro-batch) / N      (pure loss from oxrl.algorithms)
            backward(loss)                                   (gradients accumulate)
        clip, optimizer step, schedule step                  (no update when loss/grad norm is inf/NaN)
        log; validate; checkpoint
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

import torch

from oxrl.config.schema import Config
from oxrl.data.sampler import StepSampler, balanced_split, micro_batches
from oxrl.algorithms.sft import LossOutput
from oxrl.data.types import Example, PackedBatch, pack
from oxrl.training.optim import build_optimizer, build_scheduler
from oxrl.training.run_dir import resume_path
from oxrl.logging.metrics import MetricsLogger
from oxrl.models.packed_attention import prefix_sharing

logger = logging.getLogger(__name__)


@dataclass
class Objective:
    """What an offline objective gives this loop (the objectives by name: objectives.py): how a packed micro-batch
    becomes the input of a pure loss function. `count_units` says what its loss is normalised by (trained tokens,
    pairs, ...) and `compute` computes it (forward pass(es) -> a pure loss of `oxrl.algorithms`). The loop sums
    `count_units` over the whole optimizer step (all micro-batches, all ranks) and passes that total as the
    normaliser, which makes gradient accumulation and data parallelism exact."""

    name: str
    count_units: Callable[[PackedBatch], int]
    compute: Callable[..., LossOutput]  # (model, batch, normaliser, reference=None) -> LossOutput
    needs_reference: bool = False
    # Its examples' sequences may be packed as continuations of a shared prompt (`pack(share_prefixes=True)`): only
    # objectives that read sequence log-prob sums, never a sequence's tokens (a DPO pair's chosen and rejected).
    shares_prefixes: bool = False


@dataclass
class LoopResult:
    steps: int
    losses: list[float]  # per optimizer step, in order (those run in this process)
    final_metrics: dict[str, float]


def run_micro_batches(objective: Objective, model, examples: list[Example], micro_size: int, strategy,
                      reference=None, train: bool = True) -> tuple[dict[str, float], int]:
    """Forward (+ backward when training) over a rank's examples; returns summed metrics and tokens."""
    # A pair's prompt runs once where the model and the reference read continuations (oxrl/data/types.py `pack`).
    share = objective.shares_prefixes and prefix_sharing(model) and (reference is None or prefix_sharing(reference))
    batches = [pack(mb, share_prefixes=share) for mb in micro_batches(examples, micro_size)]
    local_units = sum(objective.count_units(b) for b in batches)
    normaliser = strategy.all_reduce_sum(float(local_units))
    if normaliser == 0:
        raise ValueError("this optimizer step has no trained tokens: check the data's loss masks and truncation")
    sums: dict[str, float] = defaultdict(float)
    tokens = 0
    for batch in batches:
        batch = batch.to(strategy.device)
        tokens += batch.input_ids.numel()
        with strategy.autocast(), torch.set_grad_enabled(train):
            out = objective.compute(model, batch, normaliser, reference=reference)
        if train:
            strategy.backward(out.loss)
        for key, value in out.metrics.items():
            sums[key] += float(value)
    return {k: strategy.all_reduce_sum(v) for k, v in sums.items()}, tokens


def validate(objective: Objective, model, examples: list[Example], micro_size: int, strategy, reference=None) -> dict[str, float]:
    if not examples:
        return {}
    usable = len(examples) - len(examples) % strategy.data_size
    if usable < len(examples):
        # Every rank must run the same number of forward passes; the few left over are not scored.
        logger.warning("validation: %d of %d examples skipped so that they divide over %d ranks",
                       len(examples) - usable, len(examples), strategy.data_size)
    examples = examples[:usable]
    mine = balanced_split(examples, [e.num_tokens for e in examples], strategy.data_rank, strategy.data_size)
    was_training = model.training
    model.eval()
    sums, _ = run_micro_batches(objective, model, mine, micro_size, strategy, reference, train=False)
    model.train(was_training)
    return {f"val/{k}": v for k, v in sums.items()}


def step_sampler(cfg: Config, num_examples: int) -> StepSampler:
    """Which examples each optimizer step trains on (deterministic: the same on resume)."""
    return StepSampler(num_examples, cfg.train.global_batch_size, cfg.run.seed, shuffle=cfg.data.shuffle)


def examples_used(cfg: Config, train_set: list[Example], val_set: list[Example]) -> list[Example]:
    """The examples `train_offline` will read: those of its steps' batches (with `train.max_steps: 1`, one batch),
    and the validation examples when it validates (`train.eval_every`). What a precomputed reference scores
    (oxrl/models/reference.py), instead of every row of the data. A resumed run's earlier steps are counted too."""
    sampler = step_sampler(cfg, len(train_set))
    used = sorted({i for step in range(sampler.total_steps(cfg.train)) for i in sampler.step_indices(step)})
    return [train_set[i] for i in used] + (list(val_set) if cfg.train.eval_every else [])


def train_offline(cfg: Config, objective: Objective, model, tokenizer, train_set: list[Example],
                  val_set: list[Example], strategy, run_dir: Path, reference=None, stop=None) -> LoopResult:
    """`stop`: SIGTERM and SIGINT end the run after a step, with a checkpoint (oxrl/training/signals.py)."""
    tc = cfg.train
    world = strategy.data_size
    if tc.global_batch_size % (tc.micro_batch_size_per_device * world):
        raise ValueError(
            f"train.global_batch_size ({tc.global_batch_size}) must be a multiple of micro_batch_size_per_device "
            f"({tc.micro_batch_size_per_device}) x data-parallel ranks ({world})"
        )
    sampler = step_sampler(cfg, len(train_set))
    total_steps = sampler.total_steps(tc)
    optimizer = build_optimizer(model, tc.optim, fused=strategy.fused_optimizer)
    scheduler = build_scheduler(optimizer, total_steps, tc.optim)
    model = strategy.prepare(model, optimizer, scheduler)  # the object to call (a DeepSpeed engine wraps it)
    model.train()

    start_step, tokens_seen = 0, 0
    resume_from = resume_path(cfg, run_dir)
    if resume_from is not None:
        from oxrl.training.checkpoint import drop_abandoned_checkpoints  # (the checkpoint modules: a resume's only)

        state = strategy.load_checkpoint(resume_from)
        start_step, tokens_seen = state["step"], state.get("tokens_seen", 0)
        strategy.nonfinite.load_state_dict(state)
        drop_abandoned_checkpoints(run_dir, resume_from, start_step, strategy)  # a rewind's: every check has passed

    metrics_log = MetricsLogger(run_dir, total_steps, start_step, enabled=strategy.is_main,
                                progress_bar=cfg.logging.progress_bar, config=cfg)
    losses: list[float] = []
    metrics: dict[str, float] = {}
    try:
        for step in range(start_step, total_steps):
            started = time.perf_counter()
            step_indices = sampler.step_indices(step)
            indices = balanced_split(step_indices, [train_set[i].num_tokens for i in step_indices], strategy.data_rank, world)
            examples = [train_set[i] for i in indices]
            sums, tokens = run_micro_batches(objective, model, examples, tc.micro_batch_size_per_device, strategy, reference)
            lr = scheduler.get_last_lr()[0]
            grad_norm = strategy.step(loss=sums["loss"], step=step + 1)  # skipped when either is inf/NaN
            elapsed = time.perf_counter() - started
            tokens = int(strategy.all_reduce_sum(float(tokens)))
            tokens_seen += tokens
            metrics = {**sums, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens / elapsed,
                       "epoch": sampler.epoch_of(step + 1), "tokens_seen": tokens_seen,
                       "train/nonfinite_steps": strategy.nonfinite.skipped}
            losses.append(sums["loss"])
            done = step + 1
            if tc.eval_every and (done % tc.eval_every == 0 or done == total_steps):
                metrics.update(validate(objective, model, val_set, tc.micro_batch_size_per_device, strategy, reference))
            if done % cfg.logging.every == 0 or done == total_steps:
                metrics_log.log(done, metrics)
            stopping = stop is not None and stop.agreed()  # a rank got SIGTERM or SIGINT: checkpoint, then stop
            periodic = cfg.checkpoint.every and done % cfg.checkpoint.every == 0 and done < total_steps
            if periodic or stopping and stop.checkpoint:
                _save(cfg, run_dir, done, tokenizer, tokens_seen, strategy, metrics)
            if stopping:
                raise stop.stopped(done, run_dir)
        if cfg.checkpoint.every and total_steps > start_step:
            _save(cfg, run_dir, total_steps, tokenizer, tokens_seen, strategy, metrics)
    finally:
        metrics_log.close()
    return LoopResult(total_steps, losses, metrics)


def _save(cfg, run_dir, step, tokenizer, tokens_seen, strategy, metrics) -> None:
    # Every rank: sharded strategies write their shards from each process, the HF folder from rank 0.
    from oxrl.training.model_card import model_card

    strategy.save_checkpoint(run_dir, step, tokenizer, {"tokens_seen": tokens_seen, **strategy.nonfinite.state_dict()},
                             keep_last=cfg.checkpoint.keep_last, lora_save=cfg.lora.save_mode,
                             card=model_card(cfg, metrics, step))

