"""What a `run.launcher: ray` config must hold together (the `ray` section against the run), checked by the
config's validation (oxrl/config/schema.py) for Ray runs only."""

from __future__ import annotations

from oxrl.config.names import SAMPLING_ALGORITHMS


def check_ray_layout(cfg) -> None:
    """The `ray` section is read by `run.launcher: ray` only, which runs the sampling loop only: a ValueError naming
    the settings that do not fit."""
    ray, name = cfg.ray, cfg.algorithm.name
    if name not in SAMPLING_ALGORITHMS:
        raise ValueError(f"run.launcher `ray` runs the RL loop (RL and online algorithms); `{name}` trains offline: "
                         "use run.launcher local (torchrun for several processes)")
    if ray.trainers.count < 1 or ray.rollout.count < 1:
        raise ValueError(f"run.launcher `ray` needs at least one trainer and one rollout worker (ray.trainers.count "
                         f"= {ray.trainers.count}, ray.rollout.count = {ray.rollout.count})")
    if ray.layout == "colocated" and ray.rollout.count > ray.trainers.count:
        raise ValueError(f"ray.layout `colocated` puts rollout worker i beside trainer i: ray.rollout.count "
                         f"({ray.rollout.count}) must be <= ray.trainers.count ({ray.trainers.count})")
    k = cfg.rl.max_staleness
    if ray.rollout_split == "steps" and k < 1:
        raise ValueError("ray.rollout_split `steps` gives each rollout worker a step of its own, sampled ahead of the "
                         "update: set rl.max_staleness >= 1 (at 0 one step is sampled at a time), or use `prompts`")
    if ray.rollout_split == "steps" and ray.rollout.count > k + 1:
        raise ValueError(f"ray.rollout_split `steps` with rl.max_staleness {k}: at most {k + 1} steps are sampled at "
                         f"once, so {ray.rollout.count - k - 1} of the ray.rollout.count = {ray.rollout.count} workers "
                         f"would sit idle: lower the count to {k + 1} or raise rl.max_staleness")
    if ray.interruptible and (k < 1 or ray.rollout_split != "prompts" or cfg.rl.rollout.engine != "hf"):
        raise ValueError(f"ray.interruptible hands new weights to rollout workers sampling a step ahead: it needs "
                         f"rl.max_staleness >= 1 (it is {k}), ray.rollout_split `prompts` (it is "
                         f"`{ray.rollout_split}`) and rl.rollout.engine `hf` (it is `{cfg.rl.rollout.engine}`)")
    if cfg.rl.rollout.engine == "hf" and cfg.rl.rollout.precision == "bf16":
        raise ValueError("rl.rollout.precision `bf16` (a bf16 copy to sample from) is for one process: Ray's rollout "
                         "workers decode from the model itself in the trainers' precision, each weight sync checked "
                         "against the trainers' log-probs, which a bf16 copy's miss beyond the check's tolerance: use "
                         "`auto` (under Ray: `trainer`) or `trainer`")
    if cfg.rl.env is not None:
        raise ValueError("rl.env (multi-turn episodes) runs with run.launcher local for now: under `ray` every "
                         "trainer rank would step the environment")
    if name == "spin":
        raise ValueError("`spin` runs in one local process for now: its opponent, not the policy, is what the "
                         "rollout workers must sample from")
    if cfg.rl.prompts_per_step % ray.trainers.count:
        raise ValueError(f"rl.prompts_per_step ({cfg.rl.prompts_per_step}) must be a multiple of ray.trainers.count "
                         f"({ray.trainers.count}): each trainer rank trains whole groups")
