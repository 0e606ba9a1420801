"""Advantage estimators: outcome (group) baselines on scalar rewards, and GAE on token rewards.

Every estimator the RL loop can name has ONE signature, `ADVANTAGES[name](RolloutRewards,
AdvantageParams) -> Advantages`: token rewards [B, T] (an outcome reward sits on the last sampled
token; a per-token or process reward on its own tokens; a KL penalty on every token), the mask of
trained tokens, the group ids and, for GAE, the critic's values. The group estimators see a
completion's reward as the sum of its token rewards (its undiscounted return) and give every
trained token that sequence's advantage; GAE credits each token by its discounted future rewards.

The group estimators themselves take one scalar reward per completion, `rewards [B]`, and
`group_ids [B]`: completions of the same prompt share an id. Groups may appear in any
order and interleaved; sizes are counted per group, so unequal sizes are handled too.
They return one advantage per completion, `[B]`; `broadcast_to_tokens` then gives
every trained token of the completion that same advantage (the original oxRL put it
on the last token only; don't).

Standard deviations are UNBIASED (Bessel, divide by n - 1), as `torch.std` does and as
TRL and verl use for GRPO; set `AdvantageParams.unbiased_std=False` for the population
std (divide by n). A group of equal rewards carries no learning signal: its advantage
is exactly 0 (no NaN, no 1e-12 noise), with or without std normalisation. A group of
one completion has no baseline to compare with: grpo, dr_grpo and rloo give it 0.

Dispatch: `estimate_advantages(name, RolloutRewards, AdvantageParams)`, which names the valid
estimators on a typo; `outcome_advantages(name, rewards [B], group_ids [B])` for the scalar form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor


@dataclass(frozen=True)
class AdvantageInput:
    rewards: Tensor  # [B] one scalar reward per completion (any real dtype)
    group_ids: Tensor  # [B] integer id of the prompt each completion answers


@dataclass(frozen=True)
class AdvantageParams:
    eps: float = 1e-6  # added to the std before dividing
    std_normalise: bool = True  # grpo only: divide by the group std (False = Dr. GRPO numerator)
    unbiased_std: bool = True  # Bessel-corrected std (n - 1), like torch.std / TRL / verl
    group_baseline: bool = True  # reinforce_pp only: subtract the group mean before batch whitening
    gamma: float = 1.0  # gae only: discount
    lam: float = 0.95  # gae only: lambda of the lambda-return
    whiten_advantages: bool = True  # gae only: whiten the advantages over the batch's trained tokens
    advantage_params: dict = field(default_factory=dict)  # an extension's own parameters (rl.advantage_params)


@dataclass(frozen=True)
class RolloutRewards:
    """What every estimator reads: one row per completion, one column per trained position."""

    token_rewards: Tensor  # [B, T] reward credited to each token (0 off-mask)
    mask: Tensor  # [B, T] 1 on trained (sampled) tokens
    group_ids: Tensor  # [B] integer id of the prompt each completion answers
    values: Tensor | None = None  # [B, T] critic value of the state before each token (gae only)


@dataclass(frozen=True)
class Advantages:
    advantages: Tensor  # [B, T], 0 off-mask
    returns: Tensor | None = None  # [B, T] the critic's regression targets (gae only)


# ----------------------------------------------------------------------------- group statistics


def _group_stats(rewards: Tensor, group_ids: Tensor, unbiased: bool) -> tuple[Tensor, ...]:
    """Per-completion views of its group's statistics, each [B]: mean, std, size, all-equal flag."""
    _, group_index = torch.unique(group_ids, return_inverse=True)  # [B] in 0..G-1
    num_groups = int(group_index.max()) + 1 if group_index.numel() else 0

    def per_group(reduce: str, values: Tensor) -> Tensor:  # [G]
        init = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
        return init.scatter_reduce(0, group_index, values, reduce=reduce, include_self=False)

    size = per_group("sum", torch.ones_like(rewards))[group_index]  # [B]
    mean = per_group("sum", rewards)[group_index] / size
    # Two-pass variance: sum of squared deviations, not E[x^2] - E[x]^2 (cancellation).
    squared_dev = per_group("sum", (rewards - mean).square())[group_index]
    dof = (size - 1).clamp(min=1) if unbiased else size
    std = (squared_dev / dof).sqrt()
    # Equal rewards -> exactly 0 advantage. Tested on max == min, because mean() of
    # equal floats may differ from them in the last bit (3 * 0.1 / 3 != 0.1).
    all_equal = per_group("amax", rewards)[group_index] == per_group("amin", rewards)[group_index]
    return mean, std, size, all_equal


def _as_float(rewards: Tensor) -> Tensor:
    return rewards if rewards.is_floating_point() else rewards.float()


def _check(inp: AdvantageInput) -> Tensor:
    if inp.rewards.dim() != 1 or inp.rewards.shape != inp.group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must both be [B]; got {tuple(inp.rewards.shape)} "
            f"and {tuple(inp.group_ids.shape)}"
        )
    return _as_float(inp.rewards)


# ----------------------------------------------------------------------------- outcome estimators


def grpo(inp: AdvantageInput, params: AdvantageParams = AdvantageParams()) -> Tensor:
    """GRPO outcome advantage (Shao et al., DeepSeekMath, arXiv:2402.03300, sec. 4.1.2):

        A_i = (r_i - mean_{j in g(i)} r_j) / (std_{j in g(i)} r_j + eps)

    `params.std_normalise=False` drops the division (that is `dr_grpo`). Equal-reward
    groups and groups of one completion get A = 0.
    """
    rewards = _check(inp)
    mean, std, _, all_equal = _group_stats(rewards, inp.group_ids, params.unbiased_std)
    centred = rewards - mean
    advantages = centred / (std + params.eps) if params.std_normalise else centred
    return torch.where(all_equal, torch.zeros_like(advantages), advantages)


def dr_grpo(inp: AdvantageInput, params: AdvantageParams = AdvantageParams()) -> Tensor:
    """Dr. GRPO outcome advantage (Liu et al., "Understanding R1-Zero-Like Training",
    arXiv:2503.20783, sec. 3.2): A_i = r_i - mean_{j in g(i)} r_j.

    No std division: dividing by the group std up-weights prompts that are nearly
    always solved or always failed (a difficulty bias). oxRL's default estimator.
    """
    no_std = AdvantageParams(eps=params.eps, std_normalise=False, unbiased_std=params.unbiased_std)
    return grpo(inp, no_std)


def rloo(inp: AdvantageInput, params: AdvantageParams = AdvantageParams()) -> Tensor:
    """REINFORCE Leave-One-Out (Ahmadian et al., arXiv:2402.14740, eq. 6; Kool et al. 2019):

        A_i = r_i - 1/(n-1) sum_{j in g(i), j != i} r_j  =  n/(n-1) (r_i - mean_{g(i)} r)

    The baseline excludes the sample itself, so it is independent of it and the
    estimator unbiased. n is the size of i's group; n = 1 has no other sample: A = 0.
    """
    rewards = _check(inp)
    mean, _, size, all_equal = _group_stats(rewards, inp.group_ids, params.unbiased_std)
    advantages = size / (size - 1).clamp(min=1) * (rewards - mean)
    return torch.where(all_equal | (size < 2), torch.zeros_like(advantages), advantages)


def reinforce_pp(inp: AdvantageInput, params: AdvantageParams = AdvantageParams()) -> Tensor:
    """REINFORCE++ (Hu et al., arXiv:2501.03262, sec. 3), outcome-reward form:

        b_i = mean_{g(i)} r  if params.group_baseline ("REINFORCE++-baseline") else 0
        A_i = r_i - b_i;     A_i <- (A_i - mean_batch A) / (std_batch A + eps)

    The batch statistics are over everything passed in: pass the GLOBAL batch (gather
    the rewards across data-parallel ranks) for the paper's global normalisation.
    The paper (and OpenRLHF) whitens over TOKENS, which weighs each completion by its
    length; this per-completion form weighs completions equally. For the token-weighted
    form broadcast the un-whitened advantages and call `whiten(adv_tokens, mask)`.
    A batch whose centred advantages are all equal gets 0.
    """
    rewards = _check(inp)
    advantages = dr_grpo(inp, params) if params.group_baseline else rewards
    everyone = torch.zeros_like(inp.group_ids)  # one group = the whole batch
    mean, std, _, all_equal = _group_stats(advantages, everyone, params.unbiased_std)
    whitened = (advantages - mean) / (std + params.eps)
    return torch.where(all_equal, torch.zeros_like(whitened), whitened)


OutcomeEstimator = Callable[[AdvantageInput, AdvantageParams], Tensor]
OUTCOME_ESTIMATORS: dict[str, OutcomeEstimator] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
}


def outcome_advantages(
    name: str, rewards: Tensor, group_ids: Tensor, params: AdvantageParams = AdvantageParams()
) -> Tensor:
    """`OUTCOME_ESTIMATORS[name]` on (rewards [B], group_ids [B]) -> [B]; unknown names raise listing the valid ones."""
    if name not in OUTCOME_ESTIMATORS:
        raise ValueError(f"unknown outcome advantage estimator {name!r}; valid: {sorted(OUTCOME_ESTIMATORS)}")
    return OUTCOME_ESTIMATORS[name](AdvantageInput(rewards=rewards, group_ids=group_ids), params)


# ----------------------------------------------------------------------------- token helpers


def broadcast_to_tokens(advantages: Tensor, mask: Tensor) -> Tensor:
    """Give every trained token of row b the advantage of completion b: [B] x [B, T] -> [B, T].

    Untrained positions (mask 0: prompt, padding, tool output) get exactly 0.
    """
    advantages = _as_float(advantages)
    per_token = advantages[:, None].expand(-1, mask.shape[1])  # [B, T]
    return torch.where(mask.bool(), per_token, torch.zeros_like(per_token))


def place_outcome_reward(rewards: Tensor, mask: Tensor) -> Tensor:
    """Put each scalar reward on the LAST trained token of its row: [B] x [B, T] -> [B, T].

    "Last trained token" is the last 1 in the mask, so a response truncated at the
    maximum length is rewarded on its final kept token. A row whose mask is all 0 gets
    no reward anywhere (there is no token to credit).
    """
    rewards = _as_float(rewards)
    trained = mask.bool()  # [B, T]
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(trained)
    last = torch.where(trained, positions, -1).max(dim=1).values  # [B]; -1 if no trained token
    token_rewards = torch.zeros(trained.shape, dtype=rewards.dtype, device=rewards.device)
    has_token = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has_token]
    token_rewards[rows, last[has_token]] = rewards[has_token]
    return token_rewards


def gae(
    token_rewards: Tensor,  # [B, T]
    values: Tensor,  # [B, T] critic value of the state before each token
    mask: Tensor,  # [B, T] 1 on trained (response) tokens
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al., arXiv:1506.02438, eq. 16):

        delta_t = r_t + gamma V(s_{t+1}) - V(s_t)
        A_t     = sum_{l>=0} (gamma lam)^l delta_{t+l}  =  delta_t + gamma lam A_{t+1}
        R_t     = A_t + V(s_t)   (the critic's regression target, the lam-return)

    over each row's trained tokens only, in order: untrained positions (padding after
    the end, or tokens inside the row that were not generated, e.g. tool output) are
    skipped, so "t+1" is the next trained token. After the last trained token the
    episode has ended: V = 0 and A = 0 (terminal). A reverse scan over time,
    vectorised over the batch. Returns (advantages, returns), both [B, T], 0 off-mask;
    values are detached (these are targets).
    """
    trained = mask.bool()
    values = values.detach().to(token_rewards.dtype)
    zeros_row = torch.zeros_like(token_rewards[:, 0])  # [B]
    next_value, next_advantage = zeros_row, zeros_row  # state after the last token: terminal
    advantages = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantage_t = delta + gamma * lam * next_advantage
        is_trained = trained[:, t]
        advantages[:, t] = torch.where(is_trained, advantage_t, 0.0)
        # An untrained position passes the next trained token's value/advantage through.
        next_value = torch.where(is_trained, values[:, t], next_value)
        next_advantage = torch.where(is_trained, advantage_t, next_advantage)
    returns = torch.where(trained, advantages + values, 0.0)
    return advantages, returns


def whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / (std + eps) over the trained tokens of the whole tensor; 0 off-mask.

    Used on PPO/GAE advantages (as in OpenAI's lm-human-preferences and most PPO
    libraries) and for REINFORCE++'s token-level form. Unbiased (n - 1) std, like the
    outcome estimators. `shift_mean=False` only rescales, which keeps every sign.
    With no spread (fewer than 2 trained tokens, or all equal) there is nothing to
    rescale by: centred values are exactly 0, uncentred ones are returned as they are.
    """
    trained = mask.bool()
    selected = x[trained]  # [N] trained tokens only
    if selected.numel() < 2 or bool(selected.max() == selected.min()):
        out = torch.zeros_like(x) if shift_mean else x
    else:
        scale = selected.std() + eps
        out = (x - selected.mean()) / scale if shift_mean else x / scale
    return torch.where(trained, out, torch.zeros_like(out))


# ----------------------------------------------------------------------------- one signature for all


def outcome_on_tokens(estimator: OutcomeEstimator) -> Callable[[RolloutRewards, AdvantageParams], Advantages]:
    """`estimator`, which scores each completion by its reward ([B] -> [B]), as an estimator over token rewards."""

    def on_tokens(inp: RolloutRewards, params: AdvantageParams = AdvantageParams(), *own) -> Advantages:
        # `own`: the parameters of an estimator an extension registers with a class of its own
        returns = (_as_float(inp.token_rewards) * inp.mask).sum(dim=1)  # [B] each completion's return
        scalar = estimator(AdvantageInput(rewards=returns, group_ids=inp.group_ids), params, *own)
        return Advantages(broadcast_to_tokens(scalar, inp.mask))

    on_tokens.__doc__ = f"`{estimator.__name__}` on each completion's summed token rewards, given to all its tokens."
    return on_tokens


def gae_advantages(inp: RolloutRewards, params: AdvantageParams = AdvantageParams()) -> Advantages:
    """GAE (arXiv:1506.02438) on the token rewards and the critic's values, whitened over the batch's
    trained tokens when `params.whiten_advantages` (PPO for LMs, arXiv:2203.02155); the returns are
    the critic's targets and are never whitened."""
    if inp.values is None:
        raise ValueError("gae needs the critic's values (RolloutRewards.values)")
    advantages, returns = gae(_as_float(inp.token_rewards), inp.values, inp.mask, params.gamma, params.lam)
    if params.whiten_advantages:
        advantages = whiten(advantages, inp.mask)
    return Advantages(advantages, returns)


AdvantageEstimator = Callable[[RolloutRewards, AdvantageParams], Advantages]
ADVANTAGES: dict[str, AdvantageEstimator] = {
    **{name: outcome_on_tokens(estimator) for name, estimator in OUTCOME_ESTIMATORS.items()},
    "gae": gae_advantages,
}


def estimate_advantages(name: str, inp: RolloutRewards, params: AdvantageParams = AdvantageParams()) -> Advantages:
    """`ADVANTAGES[name]`; unknown names raise listing the valid ones."""
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGES)}")
    return ADVANTAGES[name](inp, params)
