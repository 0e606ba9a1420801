"""Moved to oxrl.config.rl_presets (presets, resolution) and oxrl.loops.params (loss_params, advantage_params).

Re-exports PRESETS, DEFAULTS, is_rl, resolve, loss_params and advantage_params only until the RL loop,
the runner and their tests import them from there; then this module goes.
"""

from oxrl.loops.params import advantage_params, loss_params  # noqa: F401
from oxrl.config.rl_presets import DEFAULTS, PRESETS, is_rl, resolve  # noqa: F401
