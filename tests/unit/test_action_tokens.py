"""Action tokens (oxrl/vla/action_tokens.py): bin edges and centres worked by hand, the half-bin round trip,
quantile bins holding equal shares, chunk order, the errors for ids that are not a chunk of action tokens, and the
state written as its bins."""

from __future__ import annotations

import numpy as np
import pytest

from oxrl.vla.action_tokens import ActionTokenError, ActionTokenizer, StateBins, last_vocabulary_ids

FIRST = 1000


def test_uniform_edges_and_centres_by_hand():
    tokens = ActionTokenizer.uniform(-1.0, 1.0, 4, FIRST)
    assert tokens.edges.tolist() == [[-1.0, -0.5, 0.0, 0.5, 1.0]]
    # bins are [left, right): -0.5 opens bin 1; the top edge and anything beyond belong to the last bin
    values = [-3.0, -1.0, -0.75, -0.5, -0.01, 0.0, 0.49, 0.5, 1.0, 7.0]
    assert [tokens.encode([v])[0] - FIRST for v in values] == [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
    assert [float(tokens.decode([FIRST + b])[0, 0]) for b in range(4)] == [-0.75, -0.25, 0.25, 0.75]


def test_every_in_range_value_returns_within_half_its_bin():
    rng = np.random.default_rng(0)
    low, high = np.array([-1.0, 0.0, 10.0]), np.array([1.0, 512.0, 10.5])
    tokens = ActionTokenizer.uniform(low, high, 256, FIRST)
    for action in rng.uniform(low, high, size=(500, 3)):
        back = tokens.decode(tokens.encode(action))[0]
        bins = np.asarray(tokens.encode(action)) - FIRST
        limit = tokens.half_widths()[np.arange(3), bins]
        assert np.all(np.abs(back - action) <= limit + 1e-12)


def test_quantile_bins_hold_equal_shares_and_stay_increasing():
    actions = np.arange(9, dtype=np.float64)[:, None]  # 0..8: the quartiles are 0, 2, 4, 6, 8
    tokens = ActionTokenizer.quantile(actions, 4, FIRST)
    assert tokens.edges.tolist() == [[0.0, 2.0, 4.0, 6.0, 8.0]]
    skewed = np.random.default_rng(1).exponential(size=(4000, 1))
    tokens = ActionTokenizer.quantile(skewed, 8, FIRST)
    counts = np.bincount([tokens.encode(a)[0] - FIRST for a in skewed], minlength=8)
    assert counts.min() >= 490 and counts.max() <= 510  # 4000 / 8 each, up to the edge values themselves
    held_still = np.zeros((100, 1))  # a dimension the expert never moves: equal quantiles, nudged apart
    edges = ActionTokenizer.quantile(held_still, 4, FIRST).edges[0]
    assert np.all(np.diff(edges) > 0)


def test_percentile_bounds_ignore_outliers():
    actions = np.concatenate([np.linspace(-1.0, 1.0, 999), [50.0]])[:, None]  # one wild action among 1,000
    tokens = ActionTokenizer.uniform_q99(actions, 4, FIRST)
    low, high = np.quantile(actions, 0.01), np.quantile(actions, 0.99)
    assert np.allclose(tokens.edges[0], np.linspace(low, high, 5)) and high < 1.0
    assert tokens.encode([50.0])[0] - FIRST == 3 and tokens.encode([-7.0])[0] == FIRST  # clipped into the end bins
    still = ActionTokenizer.uniform_q99(np.zeros((10, 1)), 4, FIRST)  # a joint that never moves still gets bins
    assert np.all(np.diff(still.edges[0]) > 0)


def test_a_chunk_is_time_major_and_decodes_back():
    tokens = ActionTokenizer.uniform([-1, -1], [1, 1], 4, FIRST, chunk=2)
    chunk = [[-0.9, 0.9], [0.1, -0.4]]  # bins (0, 3) then (2, 1)
    ids = tokens.encode(chunk)
    assert [i - FIRST for i in ids] == [0, 3, 2, 1]
    assert tokens.decode(ids).tolist() == [[-0.75, 0.75], [0.25, -0.25]]
    assert tokens.token_ids == [FIRST, FIRST + 1, FIRST + 2, FIRST + 3] and tokens.tokens_per_chunk == 4


def test_ids_that_are_not_a_chunk_of_action_tokens_are_refused_by_position():
    tokens = ActionTokenizer.uniform([-1, -1], [1, 1], 4, FIRST, chunk=1)
    with pytest.raises(ActionTokenError, match="an action chunk is 2 tokens"):
        tokens.decode([FIRST])
    with pytest.raises(ActionTokenError, match="token 17 at position 1 of the chunk is not an action token"):
        tokens.decode([FIRST, 17])
    with pytest.raises(ActionTokenError, match="action dimension 1 is nan"):
        tokens.encode([0.0, float("nan")])
    with pytest.raises(ActionTokenError, match="a chunk is 1 action"):
        tokens.encode([[0.0, 0.0], [0.0, 0.0]])
    with pytest.raises(ActionTokenError, match="low < high"):
        ActionTokenizer.uniform([0.0], [0.0], 4, FIRST)


def test_the_last_vocabulary_ids_are_checked_against_special_tokens(smollm2_tokenizer):
    first = last_vocabulary_ids(smollm2_tokenizer, 256)
    assert first == smollm2_tokenizer.vocab_size - 256
    assert not set(range(first, first + 256)) & set(smollm2_tokenizer.all_special_ids)
    with pytest.raises(ActionTokenError, match="include the special token"):
        last_vocabulary_ids(smollm2_tokenizer, smollm2_tokenizer.vocab_size - 1)  # ids 1.. hold <|im_start|>
    with pytest.raises(ActionTokenError, match="do not fit a vocabulary"):
        last_vocabulary_ids(smollm2_tokenizer, smollm2_tokenizer.vocab_size + 1)


def test_the_state_is_written_as_zero_padded_bins_between_its_percentiles():
    states = np.stack([np.linspace(0.0, 100.0, 101), np.linspace(-1.0, 1.0, 101)], axis=1)
    bins = StateBins.from_states(states, 10)
    assert bins.low.tolist() == [1.0, -0.98] and np.allclose(bins.high, [99.0, 0.98])  # the 1st and 99th percentiles
    # bin = floor((x - low) / (high - low) * 10): 1 -> 0, 50 -> 5 (49 / 98 * 10 = 5.0), 98.9 -> 9; beyond: the end bins
    assert bins.text(np.array([1.0, 0.0])) == "0 5"
    assert bins.text(np.array([98.9, -0.99])) == "9 0" and bins.text(np.array([500.0, 3.0])) == "9 9"
    wide = StateBins.checked([0.0], [1.0], 100)  # two digits each, the same places in every prompt
    assert [wide.text(np.array([x])) for x in (0.0, 0.05, 0.999)] == ["00", "05", "99"]
    still = StateBins.from_states(np.ones((5, 1)), 4)  # a joint that never moves still gets bounds
    assert still.high[0] > still.low[0] and still.text(np.array([1.0])) == "0"
    with pytest.raises(ActionTokenError, match="a state of 3 dimensions, but the state bins have 2"):
        bins.text(np.zeros(3))
    with pytest.raises(ActionTokenError, match="low < high"):
        StateBins.checked([1.0], [0.0], 4)
    with pytest.raises(ActionTokenError, match="at least 2 states"):
        StateBins.from_states(np.zeros((1, 2)), 4)
