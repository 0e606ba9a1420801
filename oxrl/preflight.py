"""What a config needs that this environment lacks, found before anything is loaded: one line, not a traceback
after the model loaded and sampled.

    check_dependencies(cfg)   # MissingDependencyError naming every missing package and the command installing it
    check_run_outputs(cfg)    # a model another run makes (`runs/<name>/final`), missing: the setting and its maker
"""

from __future__ import annotations

from pathlib import Path

from oxrl.config.load import ConfigError
from oxrl.config.names import DISTILLATION
from oxrl.config.rl_presets import is_rl
from oxrl.config.schema import Config
from oxrl.dependencies import REWARD_PACKAGES, MissingDependencyError, install_hint, installed


def missing_for(cfg: Config) -> list[str]:
    """What the run `cfg` (a Config) needs and this environment lacks: `<setting> needs <package> ...` each."""
    needs: list[tuple[str, str, str]] = []  # (module, package, needed for)
    if cfg.strategy.name == "deepspeed":
        needs.append(("deepspeed", "deepspeed", "strategy.name `deepspeed`"))
    if cfg.run.launcher == "ray":
        needs.append(("ray", "ray", "run.launcher `ray`"))
    for field, name in (("model.name_or_path", cfg.model.name_or_path), ("model.tokenizer", cfg.model.tokenizer)):
        if name and str(name).endswith(".gguf"):
            needs.append(("gguf", "gguf", f"{field} (a .gguf file)"))
    if cfg.vla is not None:  # robot environments (oxrl/vla/envs.py)
        needs.append(("gymnasium", "gymnasium", "a `vla` section"))
        package = {"pusht": "gym-pusht", "panda-push": "panda-gym", "panda-reach": "panda-gym"}.get(cfg.vla.env)
        needs += [(package.replace("-", "_"), package, f"vla.env `{cfg.vla.env}`")] if package else []
    if is_rl(cfg.algorithm.name) and cfg.vla is None:  # (a VLA's episodes reward themselves)
        from oxrl.loops.rl_setup import reward_specs  # (the rewards' modules: only a run that scores imports them)

        gym_task = cfg.rl.task not in (None, "arithmetic")
        if gym_task:
            needs.append(("reasoning_gym", "reasoning-gym", f"rl.task `{cfg.rl.task}` (a reasoning-gym dataset)"))
        # A reasoning-gym task's default reward is reasoning-gym's own scorer, named above already.
        if cfg.environment is None and (cfg.rl.rewards or not gym_task):
            for spec in reward_specs(cfg, cfg.rl):
                if spec.name in REWARD_PACKAGES:
                    module, package = REWARD_PACKAGES[spec.name]
                    needs.append((module, package, f"the `{spec.name}` reward"))
    missing = {}
    for module, package, needed_for in needs:
        if not installed(module):
            missing.setdefault(package, []).append(needed_for)
    return [f"{' and '.join(dict.fromkeys(uses))} needs {package}, which is not installed: {install_hint(package)}"
            for package, uses in missing.items()]


def check_run_outputs(cfg: Config) -> None:
    """A model setting that names another run's output that is not there (an example chained to another, run before
    it): one ConfigError naming the setting and the command that makes it. The reward model's `path` is checked by
    its own preflight (oxrl/rewards/reward_model_reward.py)."""
    settings = [("model.name_or_path", cfg.model.name_or_path), ("model.tokenizer", cfg.model.tokenizer)]
    if cfg.algorithm.name in DISTILLATION:
        settings.append(("preference.teacher", cfg.preference.teacher))
    for setting, path in settings:
        if path is None or Path(path).expanduser().exists():
            continue  # (a model that is there: the usual case, which needs none of the check)
        from oxrl.config.run_outputs import missing_run_output

        missing = missing_run_output(setting, path)
        if missing is not None:
            raise ConfigError(missing)


def check_dependencies(cfg: Config) -> None:
    """One MissingDependencyError naming every package the run needs and lacks, before anything is loaded."""
    missing = missing_for(cfg)
    if missing:
        raise MissingDependencyError("; ".join(missing))
