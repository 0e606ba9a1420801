"""What pipelined RL (`rl.max_staleness`) buys under Ray: the demo's GRPO run (SmolLM2-135M-Instruct, 4 prompts x 8
completions of up to 64 tokens, CPU, fp32) with one trainer rank and one rollout worker, each holding one core of
its own (torch with 1 thread), synchronous (k = 0) against pipelined (k = 1, decoupled PPO), in this process.

    .venv/bin/python benchmarks/async_rl.py               # 1 warm-up + 5 timed steps per setting
    .venv/bin/python benchmarks/async_rl.py --steps 8 --k 2

k = 0: the worker samples while the trainer waits, then the trainer updates while the worker waits. k = 1: the worker
samples step t + 1 while the trainer updates step t; the trainer waits only for what the update did not hide
(`time/generate` is that wait) and for the sync, which follows the sampling in flight on the worker. Reported per
setting over the timed steps (mean, min..max): the step, the wait for samples, the update with the sync, the sync.
Both runs take the same prompts and seeds; k = 1 trains on other samples (one version older) from step 2 on, so
completion lengths, hence times, differ a little.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/async_rl.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ray_overhead import REPO, config, summary  # noqa: E402

KEYS = ("time/step", "time/generate", "time/train", "time/weight_sync")


def run(out: Path, steps: int, k: int) -> list[dict]:
    import json

    from oxrl.config.schema import Config
    from oxrl.runner import run as run_config

    cfg = config(out, steps, "ray")
    cfg["run"]["name"] = f"k{k}"
    cfg["ray"] = {"trainers": {"count": 1, "cpus": 1}, "rollout": {"count": 1, "cpus": 1}}
    if k:
        cfg["rl"].update({"max_staleness": k, "off_policy_correction": "decoupled", "off_policy_cap": 4.0})
    run_dir = run_config(Config.model_validate(cfg)).run_dir
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="steps per setting; the first is a warm-up")
    parser.add_argument("--k", type=int, default=1, help="rl.max_staleness of the pipelined run")
    args = parser.parse_args()
    import ray

    out = Path(tempfile.mkdtemp(prefix="oxrl-async-bench-"))
    # 2 logical CPUs, one per actor, each actor's torch on 1 thread: the trainer and the worker own a core each.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}})
    try:
        rows = {k: run(out, args.steps, k)[1:] for k in (0, args.k)}
    finally:
        ray.shutdown()
    sync, piped = rows[0], rows[args.k]
    print(f"\ndemo GRPO step under Ray, 1 trainer + 1 rollout worker on a core each, {len(sync)} timed steps "
          "(mean, min..max)")
    print(f"{'':22}{'k = 0 (synchronous)':>30}{f'k = {args.k} (pipelined)':>32}")
    for key in KEYS:
        print(f"{key:22}{summary(sync, key):>30}{summary(piped, key):>32}")
    step_sync = statistics.mean(row["time/step"] for row in sync)
    step_piped = statistics.mean(row["time/step"] for row in piped)
    print(f"\nspeed-up of the step: {step_sync / step_piped:.2f}x ({step_sync:.2f} s -> {step_piped:.2f} s); version lag "
          f"{[row.get('off_policy/version_lag', 0.0) for row in piped]}")


if __name__ == "__main__":
    main()
