"""What pipelined RL (`rl.max_staleness` = k) buys, and what it costs, on the demo's GRPO task and model
(SmolLM2-135M-Instruct, arithmetic, 8 prompts x 4 completions of up to 64 tokens, CPU, fp32).

    .venv/bin/python benchmarks/async_rl.py speed                 # Ray: k = 0, 1, 2; 1 warm-up + 5 timed steps each
    .venv/bin/python benchmarks/async_rl.py accuracy --seeds 0 1 2 --jobs 2
    .venv/bin/python benchmarks/async_rl.py speed model.name_or_path=DIR --steps 2 --k 0 1   # demo overrides first
    .venv/bin/python benchmarks/async_rl.py workers --workers 1 2 3

`speed`: under Ray with one trainer rank and one rollout worker, each on a core of its own (Ray's cluster is given 2
logical CPUs, every actor runs torch with 1 thread), in this process. Reported per k over the timed steps: steps per
minute, and the mean (min..max) of the step, the wait for samples (`time/generate`: all of the sampling at k = 0, the
part the update did not hide at k >= 1) and the update with the weight sync (`time/train`). The ideal speed-up is
(generate + train) / max(generate, train) from the k = 0 run. Every run takes the same prompts and seeds; from step 2
on, k >= 1 trains on other (older) samples, so completion lengths, hence times, differ a little.

`workers`: several rollout workers, each sampling a whole step of its own (`ray.rollout_split: steps`): for each N of
`--workers`, N workers at rl.max_staleness max(1, N - 1) (so N steps can be in flight), against k = 0 with one worker.
The ideal speed-up of N workers is (generate + train) / max(train, generate / N) from the k = 0 run, reached only
where each worker has a core (or a GPU) of its own: the cores this machine has are printed beside it. Every actor runs
torch with 1 thread; Ray is given one logical CPU per actor.

`accuracy`: the demo's whole run (16 steps, held-out greedy accuracy on 64 prompts before and after) at k = 0 and
k = 1 (decoupled PPO, cap 4) for each seed, in one process each (the schedule, hence what is learnt, is the one
Ray runs; the samples differ only in how they are seeded). `--jobs 2` runs two at a time with one thread each:
accuracy does not depend on timing, so it may share the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

if __package__ in (None, ""):  # run as `python benchmarks/async_rl.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ray_overhead import REPO, demo_tree, summary  # noqa: E402

PIPELINED = {"off_policy_correction": "decoupled", "off_policy_cap": 4.0}


def demo_config(out: Path, name: str, k: int, seed: int, steps: int | None, ray: bool, overrides: list[str],
                workers: int = 1) -> dict:
    cfg = demo_tree(overrides)
    cfg["run"].update({"name": name, "output_dir": str(out), "device": "cpu", "seed": seed,
                       "launcher": "ray" if ray else "local"})
    cfg["rl"].update({"max_staleness": k, **(PIPELINED if k else {})})
    if steps is not None:  # speed: steps only
        cfg["train"]["max_steps"] = steps
        cfg["rl"].update({"validation_every": None, "validation_size": 0})
    if ray:
        cfg["ray"] = {"trainers": {"count": 1, "cpus": 1}, "rollout": {"count": workers, "cpus": 1},
                      "rollout_split": "steps" if workers > 1 else "prompts"}
    cfg["checkpoint"] = {"every": None, "save_final": False}
    cfg["logging"] = {"progress_bar": False, "plot": False}
    return cfg


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def ray_rows(configs: dict, cpus: int) -> dict:
    """Each config's run under Ray (`cpus` logical CPUs, one per actor, each actor's torch on 1 thread): the rows of
    its timed steps (the first, a warm-up, dropped)."""
    import ray

    from oxrl.config.schema import Config
    from oxrl.runner import run as run_config

    # address="local": a cluster of its own, never one another process on this machine started (its CPUs are not ours)
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}})
    try:
        return {key: rows_of(run_config(Config.model_validate(cfg)).run_dir)[1:] for key, cfg in configs.items()}
    finally:
        ray.shutdown()


def speed(steps: int, ks: list[int], overrides: list[str]) -> None:
    out = Path(tempfile.mkdtemp(prefix="oxrl-async-speed-"))
    # the trainer and the worker own a core each
    rows = ray_rows({k: demo_config(out, f"k{k}", k, 0, steps, True, overrides) for k in ks}, cpus=2)
    from benchmarks.common import print_table

    per_minute = {k: 60 / statistics.mean(row["time/step"] for row in rows[k]) for k in ks}
    table = [{"metric": key, **{f"k = {k}": summary(rows[k], key) for k in ks}}
             for key in ("time/step", "time/generate", "time/train", "time/weight_sync")]
    table.append({"metric": "steps/min", **{f"k = {k}": f"{per_minute[k]:.3f}" for k in ks}})
    print_table(table, title=f"demo GRPO step under Ray, 1 trainer + 1 rollout worker on a core each, {steps - 1} timed "
                             "steps per k (mean, min..max)")
    if 0 in ks:  # (the ideal needs the synchronous run's halves)
        generate = statistics.mean(row["time/generate"] for row in rows[0])
        train = statistics.mean(row["time/train"] for row in rows[0])
        ideal = (generate + train) / max(generate, train)
        print(f"\nideal speed-up (generate + train) / max(generate, train) at k = 0: {ideal:.2f}x")
    for k in ks[1:]:
        print(f"k = {k}: {per_minute[k] / per_minute[ks[0]]:.2f}x the steps per minute of k = {ks[0]}; version lag "
              f"{sorted({row.get('off_policy/version_lag', 0.0) for row in rows[k]})}")


def several_workers(steps: int, counts: list[int], overrides: list[str]) -> None:
    import os

    from benchmarks.common import print_table

    out = Path(tempfile.mkdtemp(prefix="oxrl-async-workers-"))
    configs = {"k = 0, 1 worker": demo_config(out, "sync", 0, 0, steps, True, overrides)}
    staleness = {n: max(1, n - 1) for n in counts}
    configs.update({f"k = {staleness[n]}, {n} worker{'s' * (n > 1)}":
                    demo_config(out, f"w{n}", staleness[n], 0, steps, True, overrides, workers=n) for n in counts})
    rows = ray_rows(configs, cpus=1 + max(counts))
    base = rows["k = 0, 1 worker"]
    generate = statistics.mean(row["time/generate"] for row in base)
    train = statistics.mean(row["time/train"] for row in base)
    per_minute = {key: 60 / statistics.mean(row["time/step"] for row in rows[key]) for key in rows}
    table = [{"metric": key, **{name: summary(rows[name], key) for name in rows}}
             for key in ("time/step", "time/generate", "time/train")]
    table.append({"metric": "steps/min", **{name: f"{per_minute[name]:.3f}" for name in rows}})
    table.append({"metric": "speed-up", **{name: f"{per_minute[name] / per_minute['k = 0, 1 worker']:.2f}x"
                                          for name in rows}})
    ideal = {"k = 0, 1 worker": "1.00x"}
    ideal.update({name: f"{(generate + train) / max(train, generate / n):.2f}x"
                  for name, n in zip(list(rows)[1:], counts)})
    table.append({"metric": "ideal (a core each)", **ideal})
    print_table(table, title=f"GRPO step under Ray, 1 trainer + N rollout workers taking whole steps (ray.rollout_split: "
                             f"steps), {steps - 1} timed steps each (mean, min..max); {os.cpu_count()} cores here")
    print(f"\nat k = 0: generate {generate:.2f} s, train {train:.2f} s a step")


def accuracy(seeds: list[int], jobs: int, overrides: list[str]) -> None:
    out = Path(tempfile.mkdtemp(prefix="oxrl-async-accuracy-"))

    def one(seed_k: tuple[int, int]) -> tuple[int, int, float, float]:
        seed, k = seed_k
        name = f"seed{seed}_k{k}"
        path = out / f"{name}.yaml"
        path.write_text(yaml.safe_dump(demo_config(out, name, k, seed, None, False, overrides)))
        threads = {"OMP_NUM_THREADS": "1"} if jobs > 1 else {}
        import os

        subprocess.run([sys.executable, "-m", "oxrl", "train", str(path)], check=True, env={**os.environ, **threads},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows = [row for row in rows_of(out / name) if "val/accuracy" in row]
        return seed, k, rows[0]["val/accuracy"], rows[-1]["val/accuracy"]

    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(one, [(seed, k) for seed in seeds for k in (0, 1)]))
    print(f"\nheld-out greedy accuracy (64 prompts) before -> after the demo's 16 steps; runs in {out}")
    print(f"{'seed':>6}{'k = 0':>20}{'k = 1 (decoupled)':>22}")
    for seed in seeds:
        cells = {k: f"{before:.3f} -> {after:.3f}" for s, k, before, after in results if s == seed}
        print(f"{seed:>6}{cells[0]:>20}{cells[1]:>22}")
    for k in (0, 1):
        after = [a for _, kk, _, a in results if kk == k]
        print(f"k = {k}: after {statistics.mean(after):.3f} (min {min(after):.3f}, max {max(after):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    fast = sub.add_parser("speed")
    fast.add_argument("--steps", type=int, default=6, help="steps per k; the first is a warm-up")
    fast.add_argument("--k", type=int, nargs="+", default=[0, 1, 2])
    several = sub.add_parser("workers")
    several.add_argument("--steps", type=int, default=6, help="steps per layout; the first is a warm-up")
    several.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    learnt = sub.add_parser("accuracy")
    learnt.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    learnt.add_argument("--jobs", type=int, default=1, help="runs at a time (each with one thread when > 1)")
    for command in (fast, several, learnt):
        command.add_argument("overrides", nargs="*", help="dotted overrides of the demo's config (model.name_or_path=DIR)")
    args = parser.parse_args()
    if args.what in ("speed", "workers") and args.steps < 2:
        parser.error("--steps must be at least 2: the first is a warm-up")
    if args.what == "speed":
        speed(args.steps, args.k, args.overrides)
    elif args.what == "workers":
        several_workers(args.steps, args.workers, args.overrides)
    else:
        accuracy(args.seeds, args.jobs, args.overrides)


if __name__ == "__main__":
    main()
