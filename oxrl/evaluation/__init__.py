"""Evaluation without training: `oxrl eval` (run.py) and the numbers it reports (metrics.py), which the
RL loop's held-out evaluation computes with the same functions."""
