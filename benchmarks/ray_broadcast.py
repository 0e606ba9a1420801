"""What a weight sync of `run.launcher: ray` costs: trainer rank 0 broadcasting the policy in buckets to the rollout
workers over the weight group (oxrl/cluster/weight_channel.py: gloo on CPU), per parameter and per receiver.

    .venv/bin/python benchmarks/ray_broadcast.py                                   # 4M and 16M fp32 parameters, 1 and 3 receivers
    .venv/bin/python benchmarks/ray_broadcast.py --params 1e6 --receivers 1 2 --repeats 2

Each receiver is its own process joining the group over TCP (a node of the cluster, on this machine's loopback:
no network between them), as a rollout worker does; it receives every bucket into a fresh buffer, as
`WeightChannel.receive` does. Ray itself is not in the measured path (it is the control plane only). What is
reported per setting: the best of `--repeats` broadcasts (seconds), nanoseconds per parameter, and the rate each
receiver got (MB/s). The machine's load average is printed with the table: a busy machine's figures are slower.
docs/ray.md ("Scale on paper") derives what the figures imply for large models and clusters.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as `python benchmarks/ray_broadcast.py`: make `oxrl` and `benchmarks` importable
    sys.path.insert(0, str(REPO))


def _state(params: int):
    """A policy-shaped state dict of `params` fp32 parameters: square-ish matrices of 1M parameters and a remainder."""
    import torch

    sizes = [2**20] * (params // 2**20) + ([params % 2**20] if params % 2**20 else [])
    return {f"layer{i}.weight": torch.randn(size) for i, size in enumerate(sizes)}


def _receive(port: int, rank: int, world: int, specs, bucket_bytes: int, repeats: int) -> None:
    from oxrl.cluster.weight_channel import GroupAddress, WeightChannel

    channel = WeightChannel(GroupAddress("127.0.0.1", port, world, 1, 120.0, "gloo"), rank)
    for _ in range(repeats):
        for _name, _tensor in channel.receive(specs, bucket_bytes):
            pass


def measure(params: int, receivers: int, bucket_mb: float, repeats: int) -> float:
    """The best of `repeats` broadcasts of `params` fp32 parameters to `receivers` processes, in seconds."""
    from oxrl.cluster.weight_channel import GroupAddress, WeightChannel, free_port, specs_of

    state = _state(params)
    specs, bucket_bytes, port = specs_of(state), int(bucket_mb * 2**20), free_port()
    context = multiprocessing.get_context("spawn")
    members = [context.Process(target=_receive, args=(port, rank, receivers + 1, specs, bucket_bytes, repeats))
               for rank in range(1, receivers + 1)]
    for member in members:
        member.start()
    try:
        channel = WeightChannel(GroupAddress("127.0.0.1", port, receivers + 1, 1, 120.0, "gloo"), 0)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            channel.send(state, specs, bucket_bytes)
            times.append(time.perf_counter() - started)
    finally:
        for member in members:
            member.join(timeout=120)
    failed = [m.exitcode for m in members if m.exitcode != 0]
    if failed:
        raise RuntimeError(f"a receiver failed (exit codes {failed})")
    return min(times)


def main(argv: list[str] | None = None) -> None:
    from benchmarks.common import print_table

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, nargs="+", default=[4e6, 16e6], help="fp32 parameters broadcast")
    parser.add_argument("--receivers", type=int, nargs="+", default=[1, 3], help="rollout workers (processes)")
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="ray.sync_bucket_mb")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    for params in (int(p) for p in args.params):
        for receivers in args.receivers:
            seconds = measure(params, receivers, args.bucket_mb, args.repeats)
            rows.append({"parameters": f"{params / 1e6:g}M", "receivers": str(receivers), "bucket MB": f"{args.bucket_mb:g}",
                         "seconds": f"{seconds:.3f}", "ns / parameter": f"{seconds / params * 1e9:.2f}",
                         "MB/s per receiver": f"{params * 4 / 2**20 / seconds:.0f}"})
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print_table(rows, f"weight broadcast, gloo over loopback TCP, fp32 ({os.cpu_count()} CPUs, load average {load})")


if __name__ == "__main__":
    main()
