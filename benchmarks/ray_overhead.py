"""What the Ray launcher costs per RL step: the demo's GRPO run (`make demo`'s config,
examples/grpo_smollm2_arithmetic.yaml: SmolLM2-135M-Instruct, CPU, fp32) in one process against the same run under
`run.launcher: ray` with one trainer rank and one rollout worker (hf engine), side by side in this process.

    .venv/bin/python benchmarks/ray_overhead.py               # 1 warm-up + 5 timed steps per layout
    .venv/bin/python benchmarks/ray_overhead.py --steps 8
    .venv/bin/python benchmarks/ray_overhead.py --steps 2 model.name_or_path=DIR rl.rollout.n=2   # demo overrides

Both runs sample the same prompts with the same settings; their samples differ (the Ray worker seeds each
step), so completion lengths and step times differ a little. What is reported per layout, over the timed
steps (mean and min..max): the step, its generation (under Ray: dispatch to the worker, sampling there, the
completions back), its update (the weight sync included), and under Ray the weight sync alone (gather on the trainer, the bucketed broadcast,
the worker's copy and the probe on both sides). The overhead is Ray's step minus the single process's, and
the sync's share of Ray's step. Ray's private cluster here is given 4 logical CPUs so that each actor runs
torch with 2 threads, as the single process does: the trainer and the worker take turns, they do not overlap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as `python benchmarks/ray_overhead.py`: make `oxrl` and `benchmarks` importable
    sys.path.insert(0, str(REPO))
DEMO = REPO / "examples" / "grpo_smollm2_arithmetic.yaml"
KEYS = ("time/step", "time/generate", "time/train", "time/weight_sync")


def demo_tree(overrides: list[str]) -> dict:
    """The demo's config as a tree, with dotted `section.key=value` overrides (`oxrl train`'s) applied."""
    from oxrl.config.load import apply_override, parse_override

    cfg = yaml.safe_load(DEMO.read_text())
    for override in overrides:
        apply_override(cfg, *parse_override(override))
    return cfg


def config(out: Path, steps: int, launcher: str, overrides: list[str]) -> dict:
    cfg = demo_tree(overrides)
    cfg["run"].update({"name": launcher, "output_dir": str(out), "device": "cpu", "launcher": launcher})
    cfg["rl"]["validation_every"] = None  # steps only
    cfg["rl"]["validation_size"] = 0
    cfg["train"]["max_steps"] = steps
    cfg["checkpoint"] = {"every": None, "save_final": False}
    cfg["logging"] = {"progress_bar": False, "plot": False}
    if launcher == "ray":
        cfg["ray"] = {"trainers": {"count": 1, "cpus": 2}, "rollout": {"count": 1, "cpus": 2}}
    return cfg


def run(out: Path, steps: int, launcher: str, overrides: list[str]) -> list[dict]:
    """The layout's metrics rows. The single process runs as a child (its memory is gone before Ray's run starts);
    the Ray driver runs here, on the cluster this process started."""
    cfg = config(out, steps, launcher, overrides)
    if launcher == "local":
        path = out / "local.yaml"
        path.write_text(yaml.safe_dump(cfg))
        subprocess.run([sys.executable, "-m", "oxrl", "train", str(path)], check=True)
        run_dir = out / "local"
    else:
        from oxrl.config.schema import Config
        from oxrl.runner import run as run_config

        run_dir = run_config(Config.model_validate(cfg)).run_dir
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summary(rows: list[dict], key: str, unit: str = " s") -> str:
    values = [row[key] for row in rows if key in row]
    if not values:
        return "-"
    return f"{statistics.mean(values):.2f}{unit} ({min(values):.2f}..{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="steps per layout; the first is a warm-up")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the demo's config (e.g. model.name_or_path=DIR)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first is a warm-up")
    import ray

    out = Path(tempfile.mkdtemp(prefix="oxrl-ray-bench-"))
    local = run(out, args.steps, "local", args.overrides)[1:]
    # address="local": a cluster of its own, never one another process on this machine started (its CPUs are not ours)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "2"}})
    try:
        remote = run(out, args.steps, "ray", args.overrides)[1:]
    finally:
        ray.shutdown()
    from benchmarks.common import print_table

    print_table([{"metric": key, "one process": summary(local, key), "Ray: 1 trainer + 1 worker": summary(remote, key)}
                 for key in KEYS], title=f"demo GRPO step, {len(local)} timed steps per layout (mean, min..max)")
    step_local = statistics.mean(row["time/step"] for row in local)
    step_ray = statistics.mean(row["time/step"] for row in remote)
    sync = statistics.mean(row["time/weight_sync"] for row in remote)
    print(f"\nRay overhead per step: {step_ray - step_local:+.2f} s ({100 * (step_ray - step_local) / step_local:+.1f}% of "
          f"the single-process step); the weight sync is {100 * sync / step_ray:.1f}% of Ray's step")


if __name__ == "__main__":
    main()
