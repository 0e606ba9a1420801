"""What a config with a `vla` section (or robot demonstrations) must hold together, checked by the config's
validation (oxrl/config/schema.py) only where there is a robot."""

from __future__ import annotations

import os

from oxrl.config.names import RL_ALGORITHMS, ROBOT_ENVIRONMENTS, ROBOT_FORMATS


def check_vla_layout(cfg) -> None:
    """The `vla` section is read by behaviour cloning (`sft` on LeRobot datasets) and by RL in its simulator, nothing
    else; a LeRobot dataset needs it (its action tokens). A ValueError naming the settings that do not fit."""
    name, vla = cfg.algorithm.name, cfg.vla
    robot = [f"data.{part}[{i}]" for part in ("train", "validation")
             for i, spec in enumerate(getattr(cfg.data, part)) if spec.format in ROBOT_FORMATS]
    if vla is None:
        raise ValueError(f"{robot[0]} is a LeRobot dataset, which needs a `vla` section (its action tokens)")
    if name not in ("sft", *RL_ALGORITHMS):
        raise ValueError(f"the `vla` section is read by `sft` (behaviour cloning) and the RL algorithms "
                         f"({', '.join(RL_ALGORITHMS)}), not by `{name}`")
    if vla.env is not None and vla.env not in ROBOT_ENVIRONMENTS and ":" not in vla.env:
        raise ValueError(f"vla.env {vla.env!r} is not a built-in environment ({', '.join(ROBOT_ENVIRONMENTS)}) nor a "
                         "`module:factory` / `file.py:factory` reference")
    # A model a vla run saved carries its bins (oxrl/vla/build.py): no demonstrations are needed to make them.
    saved_bins = os.path.isfile(os.path.join(cfg.model.name_or_path, "action_tokens.json"))
    if vla.binning != "uniform" and not (vla.stats is not None or (name == "sft" and robot) or saved_bins):
        raise ValueError(f"vla.binning `{vla.binning}` takes its bins from demonstrations: set vla.stats to a LeRobot "
                         "dataset folder, or start from a model a vla run saved (it holds its action_tokens.json)")
    if vla.state_bins is not None and not vla.state:
        raise ValueError(f"vla.state_bins = {vla.state_bins} writes the state, which vla.state false leaves out: unset "
                         "one of them")
    if vla.state_bins is not None and not (vla.stats is not None or (name == "sft" and robot) or saved_bins):
        raise ValueError(f"vla.state_bins = {vla.state_bins} takes the state's bounds from demonstrations: set "
                         "vla.stats to a LeRobot dataset folder, or start from a model a vla run saved with them")
    if vla.execute is not None and vla.execute > vla.chunk:
        raise ValueError(f"vla.execute = {vla.execute}: a chunk holds vla.chunk = {vla.chunk} actions to execute")
    if name == "sft":
        other = [f"data.{part}[{i}]" for part in ("train", "validation")
                 for i, spec in enumerate(getattr(cfg.data, part)) if spec.format not in ROBOT_FORMATS]
        if other or not robot:
            raise ValueError(f"`sft` with a `vla` section trains on robot demonstrations: every dataset needs "
                             f"format `lerobot` ({other[0] if other else 'data.train is empty'})")
        return
    if vla.env is None:
        raise ValueError(f"`{name}` with a `vla` section runs episodes in a simulator: set vla.env (`reach`, `pusht` "
                         "or `module:factory`)")
    if cfg.rl.max_staleness or cfg.run.launcher != "local":
        raise ValueError("a `vla` run samples its episodes in one local process, synchronously, for now: leave "
                         "rl.max_staleness 0 and run.launcher local")
