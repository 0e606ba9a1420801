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

import logging

import torch

from oxrl.algorithms.advantages import gae, place_outcome_reward, whiten
from oxrl.algorithms.value_loss import ValueLossInput, value_loss
from oxrl.config.schema import RLConfig
from oxrl.data.sampler import micro_batches
from oxrl.training.nonfinite import NonFiniteGuard, is_finite
from oxrl.data.types import pack
from oxrl.loops.rl_batch import completion_example, completion_index, pad_rows
from oxrl.rollout.base import Completion

logger = logging.getLogger(__name__)


class _KeyReportFilter(logging.Filter):
    """Drops transformers' key report: 5.x's "<Model> LOAD REPORT" table, 4.x's "Some weights of ..." lines.
    Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return "LOAD REPORT" not in message and not message.startswith("Some weights of")


def load_critic(path: str, device: torch.device, trust_remote_code: bool = False):
    """The checkpoint at `path` as a one-output token classifier: its backbone, and a new value head
    (scaled to start near V = 0) unless the checkpoint already has one.

    Loading a causal LM this way leaves its LM head unused and the value head missing, which is the
    point, so transformers' table of missing/unexpected keys is not shown for it: a logging filter
    holds that one record back during the call, and the keys come back through the documented
    `output_loading_info=True` instead, where any other missing or unused key is logged as a warning.
    """
    from transformers import AutoModelForTokenClassification

    report = logging.getLogger("transformers.modeling_utils")  # where from_pretrained logs its key report
    hold_back = _KeyReportFilter()
    report.addFilter(hold_back)
    try:
        critic, info = AutoModelForTokenClassification.from_pretrained(
            path, num_labels=1, dtype=torch.float32, trust_remote_code=trust_remote_code, output_loading_info=True)
    finally:
        report.removeFilter(hold_back)
    backbone = critic.base_model_prefix + "."
    head = {name for name, _ in critic.named_parameters() if not name.startswith(backbone)}
    missing, unused = set(info["missing_keys"]), set(info["unexpected_keys"])
    strays = sorted(missing - head) + sorted(key for key in unused if key.startswith(backbone))
    if strays:
        logger.warning("critic %s: %d backbone weight(s) missing from or unused in the checkpoint: %s", path,
                       len(strays), ", ".join(strays[:10]) + (" ..." if len(strays) > 10 else ""))
    new_head = sorted(missing & head)
    if new_head:
        with torch.no_grad():  # start near V = 0 so early advantages are the rewards themselves
            for name, parameter in critic.named_parameters():
                if name in new_head and name.endswith("weight"):
                    parameter.mul_(0.01)
        logger.info("critic: %s with a new value head (%s), initialised near 0", path, ", ".join(new_head))
    else:
        logger.info("critic: %s with its own value head", path)
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
    A non-finite loss or gradient norm skips the update, counted by `guard` (see oxrl/training/nonfinite.py)."""
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
