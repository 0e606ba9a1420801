"""Shared measuring tools for oxRL's benchmarks: matmul peak, model FLOPs, MFU, peak RSS, tables.

MFU (model FLOPs utilisation) = the FLOPs the model *needs* per second of training, divided by
the peak FLOP/s of this machine measured on the spot with large fp32 matmuls (not a datasheet
number: on a shared 2-core VM the datasheet peak is never reachable, and a measured one keeps
the ratio honest across machines).

Model FLOPs follow the PaLM convention (Chowdhery et al. 2022, arXiv:2204.02311, appendix B),
which Chinchilla (arXiv:2203.15556) also uses, for one forward + backward pass:

    FLOPs(token in a sequence of length s) = 6 * N_matmul + 12 * n_layers * d_attn * s

* `N_matmul` is every parameter that takes part in a matmul: the non-embedding parameters plus
  the lm_head (vocab x d_model), counted even when it is tied to the input embedding, because
  the output projection is a real matmul while the input embedding is a table lookup. We count
  it as the weights of the model's `nn.Linear` modules (norm gains, ~0.03% of SmolLM2, do no
  matmul and are left out). 6 = 2 (multiply-add) x 3 (forward, input grad, weight grad).
* `12 * n_layers * d_attn * s` is the attention scores QK^T and the weighted sum AV (2 matmuls
  of s x d_attn per token, x2 for multiply-add, x3 for forward + backward), with
  `d_attn = n_heads * head_dim` (grouped-query attention shares K/V heads but still computes a
  score per query head). PaLM counts the full s x s square, not the causal half, and so do we.
  In a packed (padding-free) row each sequence attends only within itself, so `s` is that
  sequence's own length, not the row's.

Work a library skips (e.g. projecting only the trained positions through the lm_head) still
counts as model FLOPs: MFU measures useful model work per second, not executed FLOPs.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import resource
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

SpecT = TypeVar("SpecT")
ResultT = TypeVar("ResultT")

PEAK_MATMUL_SIZES = (512, 1024, 2048)
MODEL = "smollm2-135m-instruct"  # the bundled alias: what the CPU benchmarks measure unless --model says otherwise


def add_model_argument(parser) -> None:
    """`--model`: the bundled SmolLM2 by default; a local HF folder also works, so that
    tests/system/test_benchmarks.py can run every script on a tiny random model (no hub)."""
    parser.add_argument("--model", default=MODEL,
                        help=f"the measured model: a bundled alias (default {MODEL}) or a local HF folder")


@dataclass
class MatmulPeak:
    flops_per_s: float  # best over sizes and repeats
    size: int  # the square size that reached it
    threads: int


def measure_matmul_peak(sizes: tuple[int, ...] = PEAK_MATMUL_SIZES, repeats: int = 5,
                        dtype: torch.dtype = torch.float32) -> MatmulPeak:
    """Best FLOP/s of square `n x n @ n x n` matmuls on the CPU with torch's current thread count.

    Best-of (not mean) because other processes steal time on a shared machine: the fastest run
    is the closest to what the hardware can do. One untimed call per size warms caches and the
    thread pool.
    """
    best = MatmulPeak(0.0, 0, torch.get_num_threads())
    for n in sizes:
        a = torch.randn(n, n, dtype=dtype)
        b = torch.randn(n, n, dtype=dtype)
        out = torch.empty(n, n, dtype=dtype)
        torch.mm(a, b, out=out)
        for _ in range(repeats):
            started = time.perf_counter()
            torch.mm(a, b, out=out)
            elapsed = time.perf_counter() - started
            flops = 2.0 * n**3 / elapsed
            if flops > best.flops_per_s:
                best = MatmulPeak(flops, n, torch.get_num_threads())
    return best


@dataclass
class DecoderShape:
    """What the FLOP count needs to know about a decoder-only transformer."""

    matmul_params: int  # N_matmul: non-embedding parameters in matmuls + the lm_head
    n_layers: int
    attn_width: int  # n_heads * head_dim

    @classmethod
    def of(cls, model: torch.nn.Module) -> "DecoderShape":
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # nn.Linear weights are exactly the matmul parameters (q/k/v/o, MLP, lm_head, LoRA A/B);
        # an lm_head tied to the embedding is one Linear module, so it is counted once here.
        matmul_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        return cls(matmul_params, config.num_hidden_layers, config.num_attention_heads * head_dim)


def training_flops(shape: DecoderShape, sequence_lengths: list[int]) -> float:
    """Model FLOPs of one forward + backward pass over sequences of these lengths (see module doc)."""
    return float(sum(s * (6 * shape.matmul_params + 12 * shape.n_layers * shape.attn_width * s) for s in sequence_lengths))


def forward_flops(shape: DecoderShape, sequence_lengths: list[int]) -> float:
    """Forward-only model FLOPs (a third of `training_flops`): reference models, scoring."""
    return training_flops(shape, sequence_lengths) / 3.0


def mfu(model_flops: float, seconds: float, peak: MatmulPeak) -> float:
    return model_flops / seconds / peak.flops_per_s


def current_rss_bytes() -> int:
    """Resident memory of this process now (VmRSS; Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def peak_rss_bytes() -> int:
    """Peak resident memory of THIS process so far (getrusage ru_maxrss).

    Per process and never reset: a number taken after two trainers ran in one process is the max
    of both, and child processes are not included. Run each measured trainer in its own process
    to get its own peak.
    """
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024  # macOS reports bytes, Linux KiB


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """Cores this process may run on (respects taskset/cgroup affinity, unlike os.cpu_count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def load_average() -> str:
    """1/5/15-minute load averages: other processes' load, which the numbers are only as good as."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def machine_summary() -> dict[str, str]:
    return {
        "cpu": cpu_model(),
        "usable cores": str(usable_cores()),
        "torch": torch.__version__,
        "torch threads": str(torch.get_num_threads()),
        "python": platform.python_version(),
        # Other processes' load: on a shared machine the numbers are only as good as this is low.
        "load avg 1/5/15 min": load_average(),
    }


# --precision: what oxRL's `train.mixed_precision` is set to; TRL gets `bf16=True` for "bf16". Both keep fp32 weights
# and optimizer state and run the forward/backward under CPU bf16 autocast.
PRECISIONS = {"fp32": "no", "bf16": "bf16"}


def add_precision_argument(parser) -> None:
    parser.add_argument("--precision", choices=tuple(PRECISIONS), default="fp32",
                        help="fp32, or bf16 autocast on both sides (oxRL train.mixed_precision=bf16, TRL bf16=True)")


def spread(values: list[float], digits: int = 2) -> str:
    """'median (min..max)' of the timed steps: one number hides how much a shared machine moved them."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def format_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def print_table(rows: list[dict[str, str]], title: str | None = None) -> None:
    """Rows of equal keys as an aligned plain-text table (also valid Markdown)."""
    if not rows:
        return
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    if title:
        print(f"\n{title}")
    print("| " + " | ".join(c.ljust(widths[c]) for c in columns) + " |")
    print("|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|")
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns) + " |")


def in_fresh_process(fn: Callable[[SpecT], ResultT], spec: SpecT) -> ResultT:
    """Run `fn(spec)` in a new spawned process and return its result.

    One process per measured trainer: its ru_maxrss is its own, and it inherits no allocator
    state, warm caches or imported patches from a trainer that ran before it. `fn` must be a
    module-level function and `spec`/the result picklable; the calling script needs a
    `__main__` guard (spawn re-imports it).
    """
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, spec).result()


def quiet_child(threads: int) -> None:
    """Set a benchmark child's torch threads; silence progress bars that would interleave with the report."""
    import datasets
    import transformers

    torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


def trainer_step_clock():
    """A transformers `TrainerCallback` whose `.step_seconds` are the seconds between consecutive
    optimizer-step ends (the first from the start of training), and `.step_cpu_seconds` the process
    CPU time (all threads) over the same spans: less moved by other processes than wall time.

    End-to-end per step on purpose: `Trainer` fetches and collates a step's batches *before*
    `on_step_begin`, so begin-to-end timing would leave the library's data loading out, while a
    hand-written loop timed end to end pays for it.
    """
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.step_seconds: list[float] = []
            self.step_cpu_seconds: list[float] = []
            self.last = self.last_cpu = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.last, self.last_cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            now, now_cpu = time.perf_counter(), time.process_time()
            self.step_seconds.append(now - self.last)
            self.step_cpu_seconds.append(now_cpu - self.last_cpu)
            self.last, self.last_cpu = now, now_cpu

    return StepClock()


def score_episodes(env, seeds: list[int], policy: Callable[[str], Callable], max_steps: int) -> dict:
    """Episodes of a robot environment (`oxrl.vla.envs.RobotEnv`) from each reset seed, each under a fresh
    `policy(task)` (observation, info -> action), until `max_steps` actions, success or the episode's end: the mean of
    each episode's best reward (PushT: LeRobot's coverage score) and the success rate, as `oxrl eval` scores a VLA
    run."""
    best, successes = [], 0
    for seed in seeds:
        observation, task = env.reset(seed)
        act, rewards, success = policy(task), [], False
        for step in range(max_steps):
            transition = env.step(act(observation, env.info), f"seed {seed}, step {step}")
            observation, success = transition.observation, success or transition.success
            rewards.append(transition.reward)
            if transition.done or success:
                break
        best.append(max(rewards))
        successes += success
    return {"score": sum(best) / len(seeds), "success": successes / len(seeds)}
