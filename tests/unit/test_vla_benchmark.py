"""benchmarks/vla_simulators.py's first-action diagnostic, against bins counted by hand."""

import numpy as np

from benchmarks.vla_simulators import bins_off
from oxrl.vla.action_tokens import ActionTokenizer


def test_the_first_action_is_scored_in_bins_against_the_median_and_the_agents_own_position():
    tokens = ActionTokenizer.uniform(np.zeros(2), np.full(2, 80.0), bins=8, first_id=100, chunk=2)  # 10 px a bin
    expert = np.array([[1, 2], [3, 2], [5, 6]])  # the expert's first action's bins; its median [3, 2] is off 2, 0, 6
    predicted = np.array([[1, 3], [3, 2], [7, 6]])  # off by 1, 0 and 2 bins in all: 3 / 6 entries
    # the agent at (15, 25), (31, 29), (65, 20) px: bins (1, 2), (3, 2), (6, 2), off by 0, 0 and 1 + 4: 5 / 6
    states = np.array([[15.0, 25.0, 0.5], [31.0, 29.0, 0.5], [65.0, 20.0, 0.5]])
    assert bins_off(tokens, predicted, expert, states) == {"model": 0.5, "median": 1.333, "agent_position": 0.833}
    assert bins_off(tokens, expert, expert) == {"model": 0.0, "median": 1.333}  # no states: no agent-position baseline
