"""A setting that names another run's output (`runs/<name>/final`, a checkpoint) that has not been made here.

The examples chain: KD's teacher is the SFT example's `final/`, RLHF's reward model the `rm` example's. When that run
has not run, the error names the setting and the example config that writes it, instead of a hub lookup's failure.
Used by the preflight (oxrl/preflight.py) and by the reward model's own check (oxrl/rewards/reward_model_reward.py).
"""

from __future__ import annotations

from pathlib import Path


def missing_run_output(setting: str, path: str | None) -> str | None:
    """`<setting>: <path> does not exist: it is what run <name> writes (`oxrl train examples/<file>` makes it)` when
    `path` is a run's `final/` folder or checkpoint that does not exist; None otherwise."""
    folder = Path(path or "")
    if len(folder.parts) < 3 or folder.expanduser().exists():  # (`org/final` is a hub id, not <output_dir>/<run>/final)
        return None
    run = folder.parent if folder.name == "final" else folder.parent.parent if folder.parent.name == "checkpoints" else None
    if run is None or not run.name:
        return None
    made_by = _example_named(run.name)
    how = f"`oxrl train {made_by}` makes it" if made_by else f"train run `{run.name}` first, or set {setting}"
    return f"{setting}: {path} does not exist: it is what the run `{run.name}` writes, which has not run here ({how})"


def _example_named(run_name: str) -> str | None:
    """The example config (the source tree's examples/) whose run.name is `run_name`, as a path to type."""
    import yaml

    examples = Path(__file__).resolve().parents[2] / "examples"  # the source tree's
    for path in sorted(examples.glob("*.yaml")):
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if isinstance(tree, dict) and (tree.get("run") or {}).get("name") == run_name:
            return f"examples/{path.name}" if Path("examples", path.name).resolve() == path else str(path)
    return None
