"""What the code sandbox costs: bubblewrap's overhead per program, and `code_reward` batch throughput.

    .venv/bin/python benchmarks/sandbox.py                                  # 30 runs per mode, a batch of 64
    .venv/bin/python benchmarks/sandbox.py --runs 3 --batch 8 --workers 1   # a quick check that it works

What is measured.

* Per program: the wall time of one trivial program (`pass`) through `run_python` with
  `isolation="bwrap"` (the default: namespaces, mounts, seccomp, rlimits, audit hook) and with
  `isolation="none"` (the same child script, limits and temporary directory, no bubblewrap), and
  of bare subprocesses of the same interpreter, `python -c pass` and `python -s -S -B -c pass` (the
  flags the sandbox uses). Each mode runs `--warmup` times untimed, then `--runs` times, the modes
  interleaved so that a change of machine load hits them alike; reported are the median and the
  10th/90th percentiles. The sandbox's overhead is bwrap's median minus the flagged bare
  subprocess's; the target is at most 50 ms.
* Throughput: `--batch` completions (a program that doubles its input, one stdin/stdout test
  each) scored by `code_reward` with `max_workers` 1, 2 and 4, one untimed batch first; programs
  per second and the mean wall time per program.
* Peak RSS of this process, which holds the thread pool and reads the outputs back (a sandboxed
  program's memory is its own, capped by `memory_mb`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/sandbox.py`: make `oxrl` and `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import format_bytes, machine_summary, peak_rss_bytes, print_table
from oxrl.rewards.code_reward import code_reward
from oxrl.rewards.sandbox import INTERPRETER_FLAGS, SandboxLimits, require_sandbox, run_python

TRIVIAL = "pass"
DOUBLER = "```python\nprint(int(input()) * 2)\n```"
ADDER = "```python\ndef add(a, b):\n    return a + b\n```"
ASSERTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert math.isclose(add(0.1, 0.2), 0.3)"]


def one_run(mode: str) -> float:
    """Seconds for one trivial program in `mode`."""
    start = time.perf_counter()
    if mode in ("bwrap", "none"):
        result = run_python(TRIVIAL, limits=SandboxLimits(isolation=mode))
        if not result.ok:
            raise RuntimeError(f"the trivial program failed under isolation={mode}: {result.stderr}")
    else:
        flags = INTERPRETER_FLAGS if mode == "python -s -S -B -c pass" else ()
        subprocess.run([sys.executable, *flags, "-c", TRIVIAL], check=True)
    return time.perf_counter() - start


def per_program(runs: int, warmup: int) -> dict[str, list[float]]:
    modes = ("bwrap", "none", "python -c pass", "python -s -S -B -c pass")
    for mode in modes:
        for _ in range(warmup):
            one_run(mode)
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(runs):
        for mode in modes:  # interleaved: load changes hit every mode alike
            seconds[mode].append(one_run(mode))
    return seconds


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def throughput(batch: int, workers: int, asserts: bool = False) -> float:
    """Seconds to score `batch` completions with `workers` threads (after one untimed batch): one stdin/stdout
    test each, or three assert-style tests each (the harness: a sandboxed run per test, one more to compare)."""
    completions = [ADDER if asserts else DOUBLER] * batch
    tests = [ASSERTS if asserts else {"inputs": [f"{i}\n"], "outputs": [f"{2 * i}\n"]} for i in range(batch)]
    for timed in (False, True):
        start = time.perf_counter()
        scores = code_reward(["p"] * batch, completions, tests=tests, max_workers=workers)
        elapsed = time.perf_counter() - start
        if scores != [1.0] * batch:
            raise RuntimeError(f"expected every program to pass, got {scores}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs per mode (at least 20 for the reported numbers)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()

    bwrap = require_sandbox()  # fails here, with what to install, where the sandbox cannot run
    print_table([{"key": key, "value": value} for key, value in {**machine_summary(), "bwrap": bwrap}.items()],
                title="Machine")

    seconds = per_program(args.runs, args.warmup)
    rows = [
        {"mode": mode, "median ms": f"{statistics.median(s) * 1e3:.1f}", "p10 ms": f"{percentile(s, 0.1) * 1e3:.1f}",
         "p90 ms": f"{percentile(s, 0.9) * 1e3:.1f}", "runs": str(len(s))}
        for mode, s in seconds.items()
    ]
    print_table(rows, title="One trivial program, wall time")
    bare = statistics.median(seconds["python -s -S -B -c pass"])
    print(f"\nsandbox overhead per program: {(statistics.median(seconds['bwrap']) - bare) * 1e3:.1f} ms over a bare "
          f"`python -s -S -B` subprocess, {(statistics.median(seconds['bwrap']) - statistics.median(seconds['none'])) * 1e3:.1f} "
          "ms over isolation=none (target: <= 50 ms)")

    rows = []
    for workers in args.workers:
        elapsed = throughput(args.batch, workers)
        rows.append({"max_workers": str(workers), "batch": str(args.batch), "seconds": f"{elapsed:.2f}",
                     "programs/s": f"{args.batch / elapsed:.1f}", "ms/program": f"{elapsed / args.batch * 1e3:.1f}"})
    print_table(rows, title="code_reward throughput (isolation=bwrap, one stdin/stdout test per program)")
    rows = []
    for workers in args.workers:
        elapsed = throughput(args.batch, workers, asserts=True)
        rows.append({"max_workers": str(workers), "batch": str(args.batch), "seconds": f"{elapsed:.2f}",
                     "programs/s": f"{args.batch / elapsed:.1f}", "ms/program": f"{elapsed / args.batch * 1e3:.1f}"})
    print_table(rows, title="code_reward throughput (isolation=bwrap, three assert-style tests per program: 4 runs)")
    print(f"\npeak RSS of this process: {format_bytes(peak_rss_bytes())}; "
          f"load avg now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
