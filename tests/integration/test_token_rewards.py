"""Per-token rewards: a reward that returns one float per completion token, combined with outcome rewards,
placed on the tokens, and learned from by the estimators."""

from __future__ import annotations

import pytest
import torch

from oxrl.rewards.base import RewardError
from oxrl.rewards.combine import build_reward_fn
from oxrl.rollout.base import Completion
from tests.integration.test_rl_loop import TARGET

SEVEN_TOKEN = TARGET  # TinyTokenizer decodes token id 7 as the word "7"


def sevens_per_token(prompt, completion, completion_ids):
    """+1 on every token that is 7: a process reward whose sum is the number of sevens."""
    return [1.0 if token == SEVEN_TOKEN else 0.0 for token in completion_ids]


def length_bonus(prompt, completion):
    return 0.5


def sees_fields(prompt, completion, **fields):
    assert "completion_ids" not in fields  # asked for by name only
    return 0.0


def wrong_length(prompt, completion, completion_ids):
    return [1.0] * (len(completion_ids) + 1)


def test_per_token_rewards_are_weighted_summed_and_kept_per_token():
    reward = build_reward_fn([{"name": "tests.integration.test_token_rewards:sevens_per_token", "weight": 2.0},
                              {"name": "tests.integration.test_token_rewards:length_bonus"},
                              {"name": "tests.integration.test_token_rewards:sees_fields"}])
    out = reward(["p", "p"], ["7 1 7", "1"], [{"answer": "x"}, {"answer": "y"}], None, [[7, 1, 7], [1]])
    # sample 1: 2 x (1 + 0 + 1) + 0.5 = 4.5; sample 2: 2 x 0 + 0.5 = 0.5
    assert out.totals == [4.5, 0.5]
    assert out.components["sevens_per_token"] == [2.0, 0.0]  # unweighted sums, for the metrics
    assert out.token_rewards == [[2.0, 0.0, 2.0], [0.0]]  # weighted, outcome rewards not included


def test_a_per_token_reward_must_give_one_value_per_token():
    reward = build_reward_fn([{"name": "tests.integration.test_token_rewards:wrong_length"}])
    with pytest.raises(RewardError, match="returned 3 per-token values for sample 1, but the completion has 2 tokens"):
        reward(["p"], ["1 2"], None, None, [[1, 2]])


def test_rollout_puts_the_outcome_on_the_last_token_and_per_token_rewards_on_theirs():
    from oxrl.loops.rl import Rollout

    completions = [Completion(0, [1], [7, 1, 7], [0.0] * 3, "eos", ""), Completion(0, [1], [3, 4], [0.0] * 2, "eos", "")]
    # totals 4.5 (4 of it per-token) and 0.5 (outcome only)
    rollout = Rollout.of(completions, torch.tensor([4.5, 0.5]), [[2.0, 0.0, 2.0], None])
    assert torch.equal(rollout.token_rewards[0], torch.tensor([2.0, 0.0, 2.5]))
    assert torch.equal(rollout.token_rewards[1], torch.tensor([0.0, 0.5]))
    assert torch.equal(rollout.rewards, torch.tensor([4.5, 0.5]))


@pytest.mark.parametrize("algorithm", ["dr_grpo", "ppo"])
def test_a_per_token_reward_is_learned(tmp_path, algorithm):
    from oxrl.data.types import RLPromptBatch
    from oxrl.loops.rl import train_rl
    from oxrl.rollout.hf import HFEngine
    from tests.conftest import make_tiny_critic, make_tiny_llama, rl_handles
    from tests.integration.test_rl_loop import prompts, rl_config
    from tests.integration.test_rollout_hf import TinyTokenizer

    cfg = rl_config(tmp_path, algorithm)
    torch.manual_seed(0)
    model = make_tiny_llama()
    reward = build_reward_fn([{"name": "tests.integration.test_token_rewards:sevens_per_token"}])
    critic = make_tiny_critic() if algorithm == "ppo" else None
    h = rl_handles(cfg, model, HFEngine(model, TinyTokenizer()), reward, critic_model=critic)
    result = train_rl(h, prompts(), RLPromptBatch([], [], [], []), tmp_path / algorithm)
    first, last = sum(result.rewards[:4]) / 4, sum(result.rewards[-4:]) / 4  # sevens per completion, of 4 tokens
    assert last > first + 0.8, result.rewards
