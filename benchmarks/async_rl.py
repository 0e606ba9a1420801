"""What pipelined RL (`rl.max_staleness` = k) buys, and what it costs, on the demo's GRPO task and model
(SmolLM2-135M-Instruct, arithmetic, 8 prompts x 4 completions of up to 64 tokens, CPU, fp32).

    .venv/bin/python benchmarks/async_rl.py speed                 # Ray: k = 0, 1, 2; 1 warm-up + 5 timed steps each
    .venv/bin/python benchmarks/async_rl.py curves --jobs 2 --plot docs/images/pipelined_rl_curves.png
    .venv/bin/python benchmarks/async_rl.py speed model.name_or_path=DIR --steps 2 --k 0 1   # demo overrides first
    .venv/bin/python benchmarks/async_rl.py workers --workers 1 2 3
    .venv/bin/python benchmarks/async_rl.py curves rl.prompts_per_step=4 rl.rollout.max_batch_size=4 --k 1 \
        --launch ray interruptible   # interruptible generation against the default, sampling the slower half

`speed`: under Ray with one trainer rank and one rollout worker, each on a core of its own (Ray's cluster is given 2
logical CPUs, every actor runs torch with 1 thread), in this process. Reported per k over the timed steps: steps per
minute, and the mean (min..max) of the step, the wait for samples (`time/generate`: all of the sampling at k = 0, the
part the update did not hide at k >= 1) and the update with the weight sync (`time/train`). The ideal speed-up is
(generate + train) / max(generate, train) from the k = 0 run. Every run takes the same prompts and seeds; from step 2
on, k >= 1 trains on other (older) samples, so completion lengths, hence times, differ a little.

`speed --interruptible` runs each k >= 1 a second time with `ray.interruptible` (oxrl/cluster/interruptible.py): the
weight sync reaches the worker while it samples the step ahead rather than after it, and the tokens it samples after
the sync are the new version's (`off_policy/fresher_tokens`: their share; `off_policy/token_version_lag`: the
tokens' mean lag behind the version trained on them, against the step's scheduled lag k).

`workers`: several rollout workers, each sampling a whole step of its own (`ray.rollout_split: steps`): for each N of
`--workers`, N workers at rl.max_staleness max(1, N - 1) (so N steps can be in flight), against k = 0 with one worker.
The ideal speed-up of N workers is (generate + train) / max(train, generate / N) from the k = 0 run, reached only
where each worker has a core (or a GPU) of its own: the cores this machine has are printed beside it. Every actor runs
torch with 1 thread; Ray is given one logical CPU per actor.

`curves`: held-out greedy accuracy (the demo's 64 prompts, every `--every` steps) against steps and against
wall-clock, for k = 0 and each k >= 1 with each `--corrections`, over `--seeds`, each run in a process of its own
(the schedule, hence what is learnt, is the one Ray runs; the samples differ in how they are seeded and, on a CPU
with native bf16, in what samples them: one process's bf16 copy, the trained weights on Ray's workers). The k = 0
runs make the demo's 16 steps, the pipelined ones 24 (about what they make in the same time). The wall-clock is
modelled from each run's own measured halves (`pipelined_minutes`: a trainer and a rollout worker on a device each),
since on this 2-core machine runs that share the cores cannot be timed as they would run apart. `--jobs 2` runs two
at a time with one thread each: accuracy does not depend on timing, and every run's halves are timed alike. It also
prints the training reward by the policy version that sampled each step: progress per update, fresh or stale; the
minutes each run took to first validate at each `--reach` accuracy; and the samples' token entropy by step.
With `--out DIR` the runs stay in DIR, and a later invocation with the same DIR and overrides reads the finished runs
there rather than running them again: more settings (`--k 1 --corrections tis mask`) or seeds join the tables and the
plot of the first, and a killed invocation goes on where it stopped.

`curves --launch` says how each setting runs: `local` (the default: one process, its minutes modelled), `ray` (under
Ray, a trainer and a rollout worker on a core each, one run at a time after the local ones; its minutes are its own
measured steps, `time/step` with validation not counted, the layout the local runs' minutes are modelled for) and
`interruptible` (each k >= 1 setting under Ray with `ray.interruptible`: its weight syncs reach the worker mid-step,
so what it samples depends on timing and its accuracy is measured, not derived; its table of tokens sampled by the
newer weights, `off_policy/fresher_tokens` and `off_policy/token_version_lag`, is printed beside). Interruptible
runs are compared with `ray` runs of the same settings: a one-process run takes another path from step 1 (above).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import accumulate
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


def speed(steps: int, ks: list[int], overrides: list[str], interruptible: bool = False) -> None:
    out = Path(tempfile.mkdtemp(prefix="oxrl-async-speed-"))
    configs = {f"k = {k}": demo_config(out, f"k{k}", k, 0, steps, True, overrides) for k in ks}
    if interruptible:  # each k >= 1 again with its sync reaching the worker mid-step (`ray.interruptible`)
        for k in [k for k in ks if k]:
            cfg = configs[f"k = {k}, interruptible"] = demo_config(out, f"k{k}i", k, 0, steps, True, overrides)
            cfg["ray"]["interruptible"] = True
    rows = ray_rows(configs, cpus=2)  # the trainer and the worker own a core each
    from benchmarks.common import print_table

    per_minute = {key: 60 / statistics.mean(row["time/step"] for row in rows[key]) for key in rows}
    table = [{"metric": key, **{name: summary(rows[name], key) for name in rows}}
             for key in ("time/step", "time/generate", "time/train", "time/weight_sync")]
    for key in ("off_policy/fresher_tokens", "off_policy/token_version_lag"):  # (interruptible runs log them)
        if any(key in row for group in rows.values() for row in group):
            table.append({"metric": key, **{name: summary(rows[name], key, unit="") for name in rows}})
    table.append({"metric": "steps/min", **{name: f"{per_minute[name]:.3f}" for name in rows}})
    print_table(table, title=f"demo GRPO step under Ray, 1 trainer + 1 rollout worker on a core each, {steps - 1} timed "
                             "steps per setting (mean, min..max)")
    if 0 in ks:  # (the ideal needs the synchronous run's halves)
        generate = statistics.mean(row["time/generate"] for row in rows["k = 0"])
        train = statistics.mean(row["time/train"] for row in rows["k = 0"])
        ideal = (generate + train) / max(generate, train)
        print(f"\nideal speed-up (generate + train) / max(generate, train) at k = 0: {ideal:.2f}x")
    first = f"k = {ks[0]}"
    for name in [name for name in rows if name != first]:
        print(f"{name}: {per_minute[name] / per_minute[first]:.2f}x the steps per minute of {first}; version lag "
              f"{sorted({row.get('off_policy/version_lag', 0.0) for row in rows[name]})}")


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


def pipelined_minutes(rows: list[dict], k: int) -> list[float]:
    """The wall-clock (minutes) at the end of each step of a run whose sampling (`time/generate`) and update with its
    sync (`time/train`) were measured one after the other in one process, had a trainer and one rollout worker each
    had a device of its own: the worker samples step s once it is free and version s - 1 - k has been synced, the
    trainer updates step s once it has its samples and has finished step s - 1. At k = 0 this is the sum of both
    halves; at k >= 1 sampling hides behind the update (the `speed` table measures 1.54x where this says 1.58x)."""
    sampled, updated = [0.0], [0.0]  # the end of step s's sampling and of its update; index 0 = before step 1
    for s, row in enumerate(rows, start=1):
        sampled.append(max(sampled[-1], updated[max(0, s - 1 - k)]) + row["time/generate"])
        updated.append(max(updated[-1], sampled[-1]) + row["time/train"])
    return [t / 60 for t in updated[1:]]


@dataclass
class Curve:
    """One run's held-out accuracy at each validation: the step, the modelled wall-clock minutes at that step; and
    each trained step's mean training reward with the policy version that sampled it (step - 1 - its lag)."""

    setting: str
    seed: int
    steps: list[int]
    minutes: list[float]
    accuracy: list[float]
    sampled_by: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    entropy: list[float | None] = field(default_factory=list)  # each trained step's samples' mean token entropy
    fresher: list[float] = field(default_factory=list)  # interruptible: each step's share of newer-weights tokens
    token_lag: list[float] = field(default_factory=list)  # interruptible: each step's tokens' mean lag (updates)

    def reward_by_version(self, first: int, last: int) -> float | None:
        """The mean training reward of the steps sampled by versions first..last (None: no such step)."""
        rewards = [r for version, r in zip(self.sampled_by, self.reward) if first <= version <= last]
        return statistics.mean(rewards) if rewards else None

    def at_minutes(self, limit: float) -> tuple[int, float]:
        """The last validation at or before `limit` minutes: (its step, its accuracy)."""
        index = max(i for i, t in enumerate(self.minutes) if t <= limit + 1e-9)
        return self.steps[index], self.accuracy[index]

    def entropy_over(self, first: int, last: int) -> list[float]:
        """The samples' mean token entropy of each trained step first..last that logged one (step 1 is entropy[0])."""
        return [value for step, value in enumerate(self.entropy, start=1)
                if first <= step <= last and value is not None]

    def minutes_to(self, target: float) -> float | None:
        """The minutes at the first validation at or above `target` accuracy (None: never reached)."""
        return next((t for t, accuracy in zip(self.minutes, self.accuracy) if accuracy >= target), None)


def setting_name(k: int, correction: str, launch: str = "local") -> str:
    name = "k = 0" if k == 0 else f"k = {k}, {correction}"
    return name + {"local": "", "ray": ", Ray", "interruptible": ", interruptible"}[launch]


def curve_of(run_dir: Path, setting: str, seed: int, k: int, measured: bool = False) -> Curve:
    """A run's curve; its minutes modelled from its halves (`pipelined_minutes`), or where it ran under Ray on the
    layout they are modelled for (`measured`), its own steps' minutes."""
    rows = rows_of(run_dir)
    trained = [row for row in rows if row["step"] > 0]
    ends = accumulate(row["time/step"] / 60 for row in trained) if measured else pipelined_minutes(trained, k)
    minutes = [0.0, *ends]
    validated = [row for row in rows if "val/accuracy" in row]
    return Curve(setting, seed, [row["step"] for row in validated], [minutes[row["step"]] for row in validated],
                 [row["val/accuracy"] for row in validated],
                 [row["step"] - 1 - round(row.get("off_policy/version_lag", 0)) for row in trained],
                 [row["reward/mean"] for row in trained], [row.get("entropy") for row in trained],
                 [row["off_policy/fresher_tokens"] for row in trained if "off_policy/fresher_tokens" in row],
                 [row["off_policy/token_version_lag"] for row in trained if "off_policy/token_version_lag" in row])


def mean_of(values: list[float | None]) -> str:
    """The mean of the values that exist, to 3 places; `-` where none does."""
    present = [value for value in values if value is not None]
    return f"{statistics.mean(present):.3f}" if present else "-"


def spread(values: list[float]) -> str:
    return f"{100 * statistics.mean(values):.1f}% ({100 * min(values):.1f}..{100 * max(values):.1f})"


def finished(out: Path, name: str, config: str) -> bool:
    """Whether `out` holds a finished run `name` of this very config (to read again rather than run); an unfinished
    one (killed, crashed) is run afresh; a finished one of another config is refused: its numbers would be mixed in."""
    written = out / f"{name}.yaml"
    if not (out / name / "summary.json").is_file():
        return False
    if not written.is_file() or written.read_text() != config:
        raise SystemExit(f"{out / name} holds a finished run of another config than this invocation's (see {written}):"
                         " give another --out, or the same overrides and step counts as the run that made it")
    return True


def curves(seeds: list[int], ks: list[int], corrections: list[str], steps: int, sync_steps: int, every: int,
           jobs: int, overrides: list[str], plot: Path | None, out: Path | None = None,
           reach: tuple[float, ...] = (), launches: tuple[str, ...] = ("local",)) -> None:
    """Held-out accuracy against steps and against wall-clock for each setting over `seeds`, the runs in `out` (a new
    temporary folder by default); the finished runs already there with the same configs are read again. Each
    setting runs as each of `launches` says (the module's docstring); the Ray runs one at a time, after the others."""
    import os

    from benchmarks.common import print_table

    if out is None:
        out = Path(tempfile.mkdtemp(prefix="oxrl-async-curves-"))
    out.mkdir(parents=True, exist_ok=True)
    settings = {}  # each setting's (k, correction, launch)
    for k in ks:
        for correction in corrections if k else ["-"]:
            for launch in launches:
                if k or launch != "interruptible":  # (at k = 0 no step is in flight at a sync)
                    settings[setting_name(k, correction, launch)] = (k, correction, launch)

    def config_of(setting: str, seed: int) -> tuple[str, str]:
        k, correction, launch = settings[setting]
        name = f"seed{seed}_k{k}_{correction}".replace("-", "none") + ("" if launch == "local" else f"_{launch}")
        cfg = demo_config(out, name, k, seed, None, launch != "local", overrides)
        if launch == "interruptible":
            cfg["ray"]["interruptible"] = True
        cfg["train"]["max_steps"] = steps if k else sync_steps  # at equal time a pipelined run makes more steps
        cfg["rl"]["validation_every"] = every
        if k:
            cfg["rl"]["off_policy_correction"] = correction
        return name, yaml.safe_dump(cfg)

    jobs_of = {(setting, seed): config_of(setting, seed) for seed in seeds for setting in settings}
    done = {job for job, (name, config) in jobs_of.items() if finished(out, name, config)}  # (refused before any run)

    def one(job: tuple[str, int]) -> Curve:
        (setting, seed), (name, config) = job, jobs_of[job]
        k, _, launch = settings[setting]
        if job not in done:
            path = out / f"{name}.yaml"
            path.write_text(config)
            again = ["run.overwrite=true"] if (out / name).exists() else []  # an unfinished run: killed or crashed
            # (a Ray run's actors take one thread each, as a second local job does)
            threads = {"OMP_NUM_THREADS": "1"} if jobs > 1 or launch != "local" else {}
            subprocess.run([sys.executable, "-m", "oxrl", "train", str(path), *again], check=True,
                           env={**os.environ, **threads}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return curve_of(out / name, setting, seed, k, measured=launch != "local")

    local = [job for job in jobs_of if settings[job[0]][2] == "local"]
    with ThreadPoolExecutor(jobs) as pool:
        done_locally = dict(zip(local, pool.map(one, local)))
    # the Ray runs after: each takes both cores, its trainer and its rollout worker one each
    runs = [done_locally[job] if job in done_locally else one(job) for job in jobs_of]
    if done:
        print(f"read again from {out}: {len(done)} finished run(s) of the same configs")
    (out / "curves.json").write_text(json.dumps([dataclasses.asdict(run) for run in runs], indent=1))
    of = {setting: [run for run in runs if run.setting == setting] for setting in settings}

    validated = sorted({step for run in runs for step in run.steps})
    print_table([{"setting": setting, **{f"step {step}": spread([run.accuracy[run.steps.index(step)] for run in group])
                                         if all(step in run.steps for run in group) else "-" for step in validated}}
                 for setting, group in of.items()],
                title=f"held-out greedy accuracy against steps, mean (min..max) over seeds {seeds}; runs in {out}")
    # Progress per update: the training reward against the version that sampled it. Where the stale runs' rewards
    # match k = 0's version for version, an update from one-step-old samples improves the policy as much as a fresh one.
    versions = max(max(run.sampled_by) for run in runs) + 1
    blocks = [(first, min(first + every, versions) - 1) for first in range(0, versions, every)]
    print_table([{"setting": setting, **{f"versions {a}..{b}": mean_of([run.reward_by_version(a, b) for run in group])
                                         for a, b in blocks}} for setting, group in of.items()],
                title="training reward (reward/mean) by the policy version that sampled it, mean over the seeds")
    synchronous = {run.seed: run.minutes[-1] for run in of.get("k = 0", [])}
    if synchronous:  # each run at the time its seed's synchronous run took for all its steps
        table = []
        for setting, group in of.items():
            reached = [run.at_minutes(synchronous[run.seed]) for run in group]
            table.append({"setting": setting, "steps done": ", ".join(str(step) for step, _ in reached),
                          "accuracy": spread([accuracy for _, accuracy in reached])})
        times = ", ".join(f"{minutes:.1f}" for minutes in synchronous.values())
        print_table(table, title=f"held-out greedy accuracy at the wall-clock of the same seed's k = 0 run ({times} "
                                 f"min for {sync_steps} steps, a trainer and a rollout worker on a device each), the last "
                                 f"validation by then; {jobs} run(s) at a time on {os.cpu_count()} cores")
    for target in reach:  # time to an accuracy: what pipelining buys where the settings end level
        table = []
        for setting, group in of.items():
            reached = [run.minutes_to(target) for run in group]
            table.append({"setting": setting,
                          "minutes, per seed": ", ".join("-" if t is None else f"{t:.1f}" for t in reached),
                          "mean of those reached": mean_of(reached)})
        print_table(table, title=f"minutes to the first validation at {100 * target:g}% held-out accuracy or more "
                                 "(a trainer and a rollout worker on a device each; -: not reached)")
    # the samples' mean token entropy by step: near 0, most groups answer alike and carry no advantage
    spans = [(first, min(first + every - 1, steps)) for first in range(1, steps + 1, every)]
    print_table([{"setting": setting,
                  **{f"steps {a}..{b}": mean_of([value for run in group for value in run.entropy_over(a, b)])
                     for a, b in spans}} for setting, group in of.items()],
                title="the samples' mean token entropy (`entropy`) by step, mean over the seeds' steps")
    mid_step = [setting for setting, group in of.items() if any(run.fresher for run in group)]
    if mid_step:  # how much of each step the newer weights sampled, and how far behind the tokens were
        print_table([{"setting": setting,
                      "fresher tokens": spread([statistics.mean(run.fresher) for run in of[setting]]),
                      "token lag (updates)": mean_of([statistics.mean(run.token_lag) for run in of[setting]]),
                      "scheduled lag": str(settings[setting][0])} for setting in mid_step],
                    title="interruptible runs: the share of tokens sampled by weights newer than their request's "
                          "(each run's mean over its steps; mean (min..max) over seeds) and the tokens' mean lag")
    if plot is not None:
        draw_curves(of, plot, overrides)
        print(f"\nplot: {plot}")


def draw_curves(of: dict[str, list[Curve]], path: Path, overrides: list[str]) -> None:
    """Accuracy against steps and against minutes, one line (the seeds' mean) per setting, min..max shaded; the
    title names the overrides of the demo's task (a harder task is one of them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained", sharey=True)
    for colour, (setting, group) in zip((f"C{i}" for i in range(10)), of.items()):
        length = min(len(run.steps) for run in group)  # (every seed of a setting validates at the same steps)
        accuracy = [[run.accuracy[i] for run in group] for i in range(length)]
        mean = [statistics.mean(values) for values in accuracy]
        low, high = [min(values) for values in accuracy], [max(values) for values in accuracy]
        steps = group[0].steps[:length]
        minutes = [statistics.mean(run.minutes[i] for run in group) for i in range(length)]
        for ax, x in ((axes[0], steps), (axes[1], minutes)):
            ax.plot(x, mean, color=colour, marker="o", markersize=3, label=f"{setting} ({len(group)} seeds)")
            ax.fill_between(x, low, high, color=colour, alpha=0.15)
    axes[0].set_xlabel("optimizer step")
    axes[1].set_xlabel("minutes (a trainer and a rollout worker on a device each; mean over seeds)")
    axes[0].set_ylabel("held-out greedy accuracy")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    task = "the demo's task" + (f" with {' '.join(overrides)}" if overrides else "")
    fig.suptitle(f"Pipelined RL (rl.max_staleness = k) on {task}: seeds' mean, min..max shaded", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    fast = sub.add_parser("speed")
    fast.add_argument("--steps", type=int, default=6, help="steps per k; the first is a warm-up")
    fast.add_argument("--k", type=int, nargs="+", default=[0, 1, 2])
    fast.add_argument("--interruptible", action="store_true",
                      help="also run each k >= 1 with ray.interruptible (syncs reach the worker mid-step)")
    several = sub.add_parser("workers")
    several.add_argument("--steps", type=int, default=6, help="steps per layout; the first is a warm-up")
    several.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    learnt = sub.add_parser("curves")
    learnt.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    learnt.add_argument("--k", type=int, nargs="+", default=[0, 1, 2])
    learnt.add_argument("--corrections", nargs="+", default=["decoupled"], choices=["tis", "decoupled", "mask"],
                        help="rl.off_policy_correction of the k >= 1 runs (one setting each)")
    learnt.add_argument("--steps", type=int, default=24, help="steps of the pipelined (k >= 1) runs")
    learnt.add_argument("--sync-steps", type=int, default=16, help="steps of the k = 0 runs (the demo's)")
    learnt.add_argument("--every", type=int, default=4, help="validate every this many steps (greedy: draws nothing)")
    learnt.add_argument("--jobs", type=int, default=1, help="runs at a time (each with one thread when > 1)")
    learnt.add_argument("--plot", type=Path, default=None, help="write the curves to this PNG")
    learnt.add_argument("--reach", type=float, nargs="+", default=[0.5, 0.6],
                        help="held-out accuracies (fractions) whose time to reach is tabled per run")
    learnt.add_argument("--launch", nargs="+", default=["local"], choices=["local", "ray", "interruptible"],
                        help="how each setting runs: in one process (its minutes modelled), under Ray, or (k >= 1) "
                             "under Ray with ray.interruptible; the Ray runs one at a time, their minutes measured")
    learnt.add_argument("--out", type=Path, default=None,
                        help="the runs' folder (default: a new temporary one); its finished runs of the same configs "
                             "are read, not run again: a second invocation adds seeds or settings to a first's")
    for command in (fast, several, learnt):
        command.add_argument("overrides", nargs="*", help="dotted overrides of the demo's config (model.name_or_path=DIR)")
    args = parser.parse_args()
    if args.what in ("speed", "workers") and args.steps < 2:
        parser.error("--steps must be at least 2: the first is a warm-up")
    if args.what == "speed":
        speed(args.steps, args.k, args.overrides, args.interruptible)
    elif args.what == "workers":
        several_workers(args.steps, args.workers, args.overrides)
    else:
        if not all(0 < target <= 1 for target in args.reach):
            parser.error(f"--reach takes accuracies as fractions in (0, 1], got {args.reach}")
        if not any(args.k) and set(args.launch) == {"interruptible"}:
            parser.error("--launch interruptible runs only k >= 1 settings (at k = 0 no step is in flight at a sync): "
                         f"with --k {' '.join(map(str, args.k))} nothing would run; add a k >= 1, or local or ray")
        if args.steps % args.every or args.sync_steps % args.every:
            parser.error(f"--steps ({args.steps}) and --sync-steps ({args.sync_steps}) must be multiples of --every "
                         f"({args.every}): every run validates at the same steps")
        curves(args.seeds, args.k, args.corrections, args.steps, args.sync_steps, args.every, args.jobs, args.overrides,
               args.plot, args.out, args.reach, tuple(args.launch))


if __name__ == "__main__":
    main()
