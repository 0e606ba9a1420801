"""Stage 4 of an RL step: `rl.epochs` x `rl.mini_batches` optimizer steps on the step's rollout.

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
"""

from __future__ import annotations

import math

import torch

from oxrl.algorithms.policy_loss import PolicyLossInput, PolicyLossParams, local_normaliser, policy_loss
from oxrl.algorithms.value_loss import ValueLossInput, value_loss
from oxrl.data.sampler import micro_batches
from oxrl.data.types import pack
from oxrl.models.packed_attention import prefix_sharing
from oxrl.loops.mismatch import OffPolicyError, check_on_policy, mismatch_metrics, mismatch_sums
from oxrl.loops.rl_batch import completion_example, pad_rows, policy_rows
from oxrl.loops.rl_stages import shared_value_head
from oxrl.loops.params import loss_params


def update(h, rollout, step: int, train_policy: bool = True) -> dict[str, float]:
    """The step's optimizer steps; returns their metrics averaged over them. `step` names the step in messages."""
    rl = h.cfg.rl
    params = loss_params(rl)
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
            critic_loss, critic_metrics = value_loss(value_inp, clip_eps=shared.value_clip)
            loss, metrics = loss + shared.value_coef * critic_loss, {**metrics, **critic_metrics}
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
        value_inp = ValueLossInput(state_values.float(), rows(rollout.values), rows(rollout.returns), valid,
                                   value_normaliser)
    return inp, value_inp, gap
