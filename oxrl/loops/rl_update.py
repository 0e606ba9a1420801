"""Stage 4 of an RL step, the update: `rl.epochs` x `rl.mini_batches` optimizer steps on the step's rollout.

    for epoch, for mini-batch:
        N      <- trained tokens (or sequences) of the mini-batch on every rank: the loss normaliser
        for micro-batch: logp <- policy(samples); loss <- policy_loss(logp, old, advantages, ref) / N; backward
        policy step (clip, schedule; none when the loss or grad norm is inf/NaN)
        critic step on the same mini-batch (gae)

With a shared value head (`rl.critic_backbone: shared`) the micro-batch's forward also gives the values, the
loss is policy_loss + value_coef x value_loss, and there is no critic step: the policy's step trains both.

One update per rollout takes pi_old from the update's own log-probs (detached), and measures the
engine/trainer mismatch there; `rl.strict_on_policy` refuses the update before its step if the samples
were not the policy's own.

Below the update, the two things it is made of:

Completions as training rows. A completion is trained as one `Sequence` = prompt tokens + exactly the sampled
completion tokens (never re-tokenised text), with the loss mask on the sampled tokens only (a multi-turn
episode's environment-written tokens are context, not trained). An episode whose context restarted
(`Completion.context_starts`) becomes several sequences of one `Example`, each with its own positions, so the
trainer sees exactly the context the engine saw. Micro-batches pack several examples in one row;
`completion_index` then gathers each completion's trained positions into a padded [S, L] layout (one row per
completion), the one the policy losses take. The score stage (oxrl/loops/rl.py) and the critic use them too.

The engine/trainer mismatch, on the tokens the engine sampled (environment-written tokens of multi-turn
episodes have no engine log-prob and are left out):

    logprob_mismatch/mean_abs   mean |log p_engine(y) - log p_trainer(y)|
    logprob_mismatch/kl         mean k3 estimate of KL(engine || trainer), y ~ engine (0 when they agree)

They are 0 up to float noise when the engine samples from the weights being trained (the built-in engine, or
vLLM after a verified sync); a growing value means the samples are off-policy (stale weights, kernel or
precision differences), which `rl.off_policy_correction` corrects and `rl.strict_on_policy` refuses. Computed
from additive sums, so micro-batches and ranks combine exactly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from oxrl.algorithms.advantages import AdvantageParams
from oxrl.algorithms.kl import k3
from oxrl.algorithms.policy_loss import PolicyLossInput, PolicyLossParams, local_normaliser, policy_loss
from oxrl.config.params import params_from
from oxrl.config.schema import Config
from oxrl.data.sampler import micro_batches
from oxrl.data.types import Example, PackedBatch, Sequence, pack
from oxrl.models.logprobs import token_logprobs
from oxrl.models.packed_attention import prefix_sharing
from oxrl.rollout.base import Completion

if TYPE_CHECKING:
    from oxrl.algorithms.value_loss import ValueLossInput


def loss_params(cfg: Config) -> PolicyLossParams:
    return params_from(PolicyLossParams, cfg.rl, lambda rule: rule.reads(cfg), max_len=cfg.completion_tokens)


def advantage_params(cfg: Config) -> AdvantageParams:
    return params_from(AdvantageParams, cfg.rl, lambda rule: rule.reads(cfg))


def single_on_policy_update(cfg: Config) -> bool:
    """One optimizer step per rollout, on the policy that sampled it: pi_old IS the policy at update time, so the
    update's own log-probs (detached) are the old ones and no separate no-grad pass is needed (TRL and verl skip
    it too). Not with a KL reward penalty, whose old log-probs shape the rewards before the update, nor with a
    shared value head, whose values GAE needs before the update: the pass that gives them gives the old log-probs."""
    rl = cfg.rl
    return rl.epochs == 1 and rl.mini_batches == 1 and not rl.kl_penalty_in_reward and cfg.critic != "shared"


def shared_value_head(h) -> torch.nn.Module | None:
    """The critic's value head on the policy's backbone (`rl.critic_backbone: shared`), else None."""
    return h.critic.shared_head if h.critic is not None else None


def update(h, rollout, step: int, train_policy: bool = True) -> dict[str, float]:
    """The step's optimizer steps; returns their metrics averaged over them. `step` names the step in messages."""
    rl = h.cfg.rl
    params = loss_params(h.cfg)
    order = list(range(len(rollout.completions)))
    per_mini = math.ceil(len(order) / rl.mini_batches)
    totals: dict[str, float] = {}
    updates = 0
    for _epoch in range(rl.epochs):
        for mini in micro_batches(order, per_mini):
            sums = {}
            if train_policy or shared_value_head(h) is not None:  # a shared head learns in the policy's step
                sums = policy_step(h, rollout, mini, params, check=rl.strict_on_policy and updates == 0, step=step,
                                   train_policy=train_policy)
            if h.critic is not None:  # a critic of its own steps apart ({} for a shared head)
                sums.update(h.critic.update([rollout.completions[i] for i in mini], [rollout.values[i] for i in mini],
                                            [rollout.returns[i] for i in mini], step))
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + value
            updates += 1
    return {key: value / updates for key, value in totals.items()}


def policy_step(h, rollout, indices: list[int], params: PolicyLossParams, check: bool, step: int,
                train_policy: bool = True) -> dict[str, float]:
    """One optimizer step of the policy loss over the rollout's completions `indices` (this rank's share).

    With a shared value head, of policy loss + value_coef x value loss; while the critic warms up
    (`train_policy` False) of the value loss alone, on the head alone: the backbone's features are
    detached, so the policy does not move, as with a separate critic."""
    rl, strategy, micro = h.cfg.rl, h.strategy, h.cfg.train.micro_batch_size_per_device
    lengths = [rollout.completions[i].num_sampled for i in indices]  # trained tokens per completion
    normaliser = strategy.all_reduce_sum(float(local_normaliser(pad_rows([torch.ones(n) for n in lengths], max(lengths)),
                                                                params.aggregation)))
    shared = h.critic if shared_value_head(h) is not None else None
    tokens = strategy.all_reduce_sum(float(sum(lengths))) if shared else None  # the value loss's normaliser
    sums: dict[str, float] = {}
    gap: dict[str, float] = {}  # engine/trainer mismatch sums, when this update supplies the old log-probs
    for mb in [indices[i : i + micro] for i in range(0, len(indices), micro)]:
        inp, value_inp, mb_gap = loss_input(h, rollout, mb, params, normaliser, check, tokens, head_only=not train_policy)
        loss, metrics = policy_loss(rl.policy_loss, inp, params) if train_policy else (0.0, {})
        if shared:
            critic_loss, critic_metrics = shared.loss(value_inp)  # (value_coef x the value loss)
            loss, metrics = loss + critic_loss, {**metrics, **critic_metrics}
        strategy.backward(loss)
        for target, values in ((sums, {"loss": loss.detach(), **metrics}), (gap, mb_gap)):
            for key, value in values.items():
                target[key] = target.get(key, 0.0) + float(value)
    sums = {key: strategy.all_reduce_sum(value) for key, value in sums.items()}  # shares of global means: add ranks
    if gap:
        mismatch = mismatch_metrics({key: strategy.all_reduce_sum(value) for key, value in gap.items()})
        if check:  # before the optimizer step: a refused update changes nothing
            check_on_policy(mismatch["logprob_mismatch/mean_abs"], rl.on_policy_tolerance)
        sums.update(mismatch)
    sums["grad_norm"] = strategy.step(loss=sums["loss"], step=step)  # skipped when either is inf/NaN
    return sums


def loss_input(h, rollout, mb: list[int], params: PolicyLossParams, normaliser: float, check: bool,
               value_normaliser: float | None = None,
               head_only: bool = False) -> tuple[PolicyLossInput, ValueLossInput | None, dict[str, float]]:
    """The policy loss's input for one micro-batch (a forward pass with grad), with a shared value head the value
    loss's input from the same forward (`head_only`: its gradient stops at the head), and the engine/trainer
    mismatch sums."""
    rl = h.cfg.rl
    # A group's completions share their prompt: it runs once where the policy reads continuations.
    batch = pack([completion_example(rollout.completions[i]) for i in mb],
                 share_prefixes=prefix_sharing(h.policy)).to(h.strategy.device)
    shared_head = shared_value_head(h)
    value_head = shared_head
    if shared_head is not None and head_only:
        value_head = lambda hidden: shared_head(hidden.detach())  # the backbone gets no gradient
    with h.strategy.autocast():
        logprobs, entropy, state_values, valid = policy_rows(h.policy, batch, rl.rollout.temperature or 1.0,
                                                             with_entropy=True, value_head=value_head)
    width, device = valid.shape[1], logprobs.device

    def rows(values: list[torch.Tensor]) -> torch.Tensor:
        return pad_rows([values[i] for i in mb], width).to(device)

    own_old = rollout.old_logprobs is None  # single on-policy update: pi_old is the policy right now
    behaviour = None  # the engine's own log-probs of its samples: for the mismatch sums and truncated IS
    if own_old or params.off_policy_correction != "none":
        behaviour = pad_rows([torch.tensor(rollout.completions[i].logprobs) for i in mb], width).to(device)
    gap = {}
    if own_old:
        old = logprobs.detach().float()
        gap = mismatch_sums(behaviour[valid], old[valid])
    else:
        old = rows(rollout.old_logprobs)
    if check and not own_old:  # with its own old log-probs the first ratio is 1 by construction
        ratio_gap = float(((logprobs.detach().float() - old).abs() * valid).max())
        if ratio_gap > rl.on_policy_tolerance:
            raise OffPolicyError(f"strict_on_policy: the first update's ratio is not 1 (max |log ratio| = {ratio_gap:.3g})")
    ref = rows(rollout.ref_logprobs) if rollout.ref_logprobs is not None and params.kl_coef > 0 else None
    inp = PolicyLossInput(
        logprobs=logprobs.float(), old_logprobs=old, advantages=rows(rollout.advantages), mask=valid,
        normaliser=normaliser, ref_logprobs=ref,
        entropy=entropy.float() if params.entropy_coef > 0 else entropy.detach().float(),
        behaviour_logprobs=behaviour if params.off_policy_correction != "none" else None,
    )
    value_inp = None
    if state_values is not None:
        value_inp = h.critic.loss_input(state_values.float(), rows(rollout.values), rows(rollout.returns), valid,
                                        value_normaliser)
    return inp, value_inp, gap


# ---- completions as training rows ---------------------------------------------------------------------------------


def completion_example(completion: Completion) -> Example:
    """Prompt + completion as one training example: the loss mask is on the sampled tokens only, and
    every context restart begins a new sequence (its first token, written by the environment, is untrained) with the
    images of that context (`Completion.context_vision`)."""
    ids = completion.prompt_ids + completion.completion_ids
    sampled = completion.loss_mask if completion.loss_mask is not None else [True] * len(completion.completion_ids)
    mask = [False] * len(completion.prompt_ids) + list(sampled)
    cuts = [0, *(len(completion.prompt_ids) + start for start in completion.context_starts), len(ids)]
    vision = [completion.vision, *(completion.context_vision or [None] * len(completion.context_starts))]
    return Example([Sequence(ids[a:b], mask[a:b], images) for a, b, images in zip(cuts, cuts[1:], vision)])


def completion_index(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [E, L] of each example's (completion's) trained tokens in the packed row, in order, and
    their mask [E, L]; an example of several sequences (a restarted context) gets one row."""
    mask_row = batch.loss_mask[0]
    positions = torch.nonzero(mask_row, as_tuple=True)[0]  # [N trained tokens], in row order
    owner = batch.seq_example[batch.seq_index[positions]]  # [N]
    counts = torch.bincount(owner, minlength=batch.num_examples)  # [E]
    width = int(counts.max()) if counts.numel() else 0
    starts = torch.cumsum(counts, 0) - counts  # [E]
    column = torch.arange(positions.numel(), device=positions.device) - starts[owner]
    index = torch.zeros(batch.num_examples, width, dtype=torch.long, device=positions.device)
    valid = torch.zeros(batch.num_examples, width, dtype=torch.bool, device=positions.device)
    index[owner, column] = positions
    valid[owner, column] = True
    return index, valid


def policy_rows(model, batch: PackedBatch, temperature: float, with_entropy: bool,
                value_head=None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """Log-probs [S, L] (and entropies; and with PPO's shared `value_head`, the values of the same forward)
    of each completion's trained (sampled) tokens, with the mask [S, L]: (logprobs, entropy, values, valid)."""
    index, valid = completion_index(batch)
    if value_head is not None:
        logprobs, entropy, values = token_logprobs(model, batch, temperature=temperature, with_entropy=with_entropy,
                                                   value_head=value_head)
    elif with_entropy:
        (logprobs, entropy), values = token_logprobs(model, batch, temperature=temperature, with_entropy=True), None
    else:
        logprobs, entropy, values = token_logprobs(model, batch, temperature=temperature), None, None

    def rows(per_token: torch.Tensor | None) -> torch.Tensor | None:  # [T] -> [S, L]
        return None if per_token is None else per_token[index] * valid

    return rows(logprobs), rows(entropy), rows(values), valid


def pad_rows(values: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(values), width)
    for row, value in enumerate(values):
        out[row, : value.numel()] = value
    return out


def score_logprobs(model, completions: list[Completion], micro_size: int, temperature: float) -> list[torch.Tensor]:
    """Per-completion token log-probs under `model` (packed micro-batches, no grad)."""
    return score_logprobs_and_values(model, completions, micro_size, temperature)[0]


@torch.no_grad()
def score_logprobs_and_values(model, completions: list[Completion], micro_size: int, temperature: float,
                              value_head=None) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per-completion token log-probs under `model` (packed micro-batches, no grad) and, with PPO's shared
    `value_head`, the values [len] of every sampled token's state from the same forward passes."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    logprob_rows: list[torch.Tensor] = []
    value_rows: list[torch.Tensor] = []
    for chunk in micro_batches(completions, micro_size):
        batch = pack([completion_example(c) for c in chunk], share_prefixes=prefix_sharing(model)).to(device)
        logprobs, _, values, valid = policy_rows(model, batch, temperature, False, value_head)
        logprob_rows.extend(row[mask].float().cpu() for row, mask in zip(logprobs, valid))
        if values is not None:
            value_rows.extend(row[mask].float().cpu() for row, mask in zip(values, valid))
    model.train(was_training)
    return logprob_rows, value_rows if value_head is not None else None


# ---- the engine/trainer mismatch ----------------------------------------------------------------------------------


class OffPolicyError(RuntimeError):
    """`strict_on_policy` found the samples were not drawn from the policy being trained."""


def sampled_logprobs(completions: list[Completion], trainer_logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Engine and trainer log-probs [N] of every sampled token, aligned. Both cover the sampled tokens only:
    environment-written tokens (multi-turn) have no engine log-prob and are never trained."""
    for completion, trainer in zip(completions, trainer_logprobs):
        if len(completion.logprobs) != trainer.numel():
            raise ValueError(f"the engine gave {len(completion.logprobs)} log-probs for a completion with "
                             f"{trainer.numel()} trained tokens")
    engine = [torch.tensor(c.logprobs, dtype=torch.float32) for c in completions]
    return (torch.cat(engine), torch.cat(trainer_logprobs).float()) if engine else (torch.zeros(0), torch.zeros(0))


def mismatch_sums(engine: torch.Tensor, trainer: torch.Tensor) -> dict[str, float]:
    """Additive sums over the given sampled tokens [N] (sum them over micro-batches and ranks)."""
    engine, trainer = engine.detach().float(), trainer.detach().float()
    return {"abs": float((engine - trainer).abs().sum()), "kl": float(k3(engine, trainer).sum()), "tokens": float(engine.numel())}


def mismatch_metrics(sums: dict[str, float]) -> dict[str, float]:
    tokens = max(sums["tokens"], 1.0)
    return {"logprob_mismatch/mean_abs": sums["abs"] / tokens, "logprob_mismatch/kl": sums["kl"] / tokens}


def check_on_policy(mean_abs_gap: float, tolerance: float) -> None:
    """Raise unless the engine sampled from the policy being trained."""
    if not mean_abs_gap <= tolerance:
        raise OffPolicyError(
            f"strict_on_policy: the rollout engine's log-probs differ from the trainer's by {mean_abs_gap:.3g} on "
            f"average (tolerance {tolerance}); the engine is sampling from stale or different weights"
        )
