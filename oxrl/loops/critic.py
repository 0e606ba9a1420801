"""The PPO critic: a separate value model, its GAE targets and its updates.

The critic is a causal LM backbone with a one-output token-classification head
(`AutoModelForTokenClassification`, num_labels=1), initialised from the policy's weights (or
`rl.critic_model`). The value of the state before completion token t is the head's output at
position t - 1, the same position whose logits predict token t (see `oxrl.algorithms.logprobs`).
The outcome reward sits on the last token actually generated (truncated completions included).
In a multi-turn episode the trajectory is its sampled tokens in order; environment-written tokens are
context, with no value, advantage or loss of their own.
"""

from __future__ import annotations

import torch

from oxrl.algorithms.advantages import gae, place_outcome_reward, whiten
from oxrl.algorithms.value_loss import ValueLossInput, value_loss
from oxrl.config.schema import RLConfig
from oxrl.data.sampler import micro_batches
from oxrl.engine.nonfinite import NonFiniteGuard, is_finite
from oxrl.data.types import pack
from oxrl.loops.rl_batch import completion_example, completion_index, pad_rows
from oxrl.rollout.base import Completion


def load_critic(path: str, device: torch.device, trust_remote_code: bool = False):
    from transformers import AutoModelForTokenClassification

    critic = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=torch.float32,
                                                             trust_remote_code=trust_remote_code)
    with torch.no_grad():  # start near V = 0 so early advantages are the rewards themselves
        head = critic.get_output_embeddings() if critic.get_output_embeddings() is not None else critic.score
        head.weight.mul_(0.01)
    return critic.to(device)


def value_rows(critic, completions: list[Completion], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Critic values [S, L] of the state before each completion token, and the mask [S, L]."""
    batch = pack([completion_example(c) for c in completions]).to(device)
    out = critic(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    values = out.logits[0, :, 0]  # [T]
    index, valid = completion_index(batch)
    return values[(index - 1).clamp(min=0)] * valid, valid


@torch.no_grad()
def score_values(critic, completions: list[Completion], micro_size: int) -> list[torch.Tensor]:
    critic.eval()
    device = next(critic.parameters()).device
    out = []
    for chunk in micro_batches(completions, micro_size):
        values, valid = value_rows(critic, chunk, device)
        out.extend(row[mask].float().cpu() for row, mask in zip(values, valid))
    critic.train()
    return out


def gae_advantages(rl: RLConfig, completions: list[Completion], rewards: torch.Tensor, values: list[torch.Tensor],
                   kl_per_token: list[torch.Tensor] | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-token advantages and lambda-returns; a KL penalty, when given, is a per-token reward."""
    width = max(c.num_sampled for c in completions)  # trained (sampled) tokens; env-written ones are skipped
    mask = pad_rows([torch.ones(c.num_sampled) for c in completions], width).bool()
    token_rewards = place_outcome_reward(rewards, mask)
    if kl_per_token is not None:
        token_rewards = token_rewards - rl.kl_coef * pad_rows(kl_per_token, width)
    advantages, returns = gae(token_rewards, pad_rows(values, width), mask, rl.gamma, rl.lam)
    if rl.whiten_advantages:
        advantages = whiten(advantages, mask)
    return [a[m] for a, m in zip(advantages, mask)], [r[m] for r, m in zip(returns, mask)]


def critic_step(rl: RLConfig, critic, optimizer, completions: list[Completion], old_values: list[torch.Tensor],
                returns: list[torch.Tensor], micro_size: int, guard: NonFiniteGuard | None = None,
                step: int | None = None) -> dict[str, float]:
    """One optimizer step of the critic over the given completions (token-mean over all of them).
    A non-finite loss or gradient norm skips the update, counted by `guard` (see oxrl/engine/nonfinite.py)."""
    guard = guard if guard is not None else NonFiniteGuard(subject="critic")
    device = next(critic.parameters()).device
    normaliser = float(sum(c.num_sampled for c in completions))
    sums: dict[str, float] = {}
    for start in range(0, len(completions), micro_size):
        chunk = slice(start, start + micro_size)
        values, valid = value_rows(critic, completions[chunk], device)
        width = valid.shape[1]
        loss, metrics = value_loss(ValueLossInput(values.float(), pad_rows(old_values[chunk], width).to(device),
                                                  pad_rows(returns[chunk], width).to(device), valid, normaliser),
                                   clip_eps=rl.value_clip)
        loss.backward()
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + float(value)
    norm = float(torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0))
    loss = sums.get("critic/loss")
    if guard.allow(is_finite(loss) and is_finite(norm), loss, norm, step):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {**sums, "critic/grad_norm": norm}
