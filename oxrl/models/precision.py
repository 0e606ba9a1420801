"""Which compute precision `train.mixed_precision` means on this machine: the one home of the rule.

    no    fp32 compute
    bf16  bf16 autocast over fp32 master weights and optimizer state (FSDP2: a bf16 parameter policy)
    auto  bf16 on a GPU and on a CPU that multiplies bf16 natively (x86 AVX512-BF16 or AMX, Arm's BF16
          extension); fp32 on any other CPU

On such a CPU bf16 is the faster choice (SmolLM2-135M forward+backward on 2,048 tokens: 13-15 s against 21-26 s
in fp32 on 2 cores), a short run's loss curve stays within 2% of fp32's (tests/integration/test_precision.py), and the GRPO
demo learns as much: over six seeds its trained models average 55.8% on a common set of 256 held-out prompts
against 56.1% in fp32 (each scored in its own precision; scoring in bf16 reads ~1.5 points higher), while the
seed moves either by over 20 points (docs/benchmarks.md, "bf16 by default on CPUs with native bf16"). The
run's log and `oxrl doctor` say which precision `auto` chose and why; `no` keeps fp32 everywhere.

It is also the home of the `hf` rollout engine's precision rule (`rl.rollout.precision`): on such CPUs `auto`
samples from a bf16 copy of the policy, which decodes faster than autocast does.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from pathlib import Path

import torch

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # /proc/cpuinfo: x86 `flags`, Arm `Features`


@functools.cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has bf16 instructions, from the kernel's CPU flags (False where they cannot be read)."""
    path = Path(cpuinfo)
    if not path.is_file():
        return False
    for line in path.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return bool(NATIVE_BF16_FLAGS & set(value.split()))
    return False


def native_bf16_cpu(device_type: str) -> bool:
    """Whether a device of `device_type` is a CPU with bf16 instructions: where `auto` computes and samples in bf16."""
    return device_type == "cpu" and cpu_has_native_bf16()


def uses_bf16(mixed_precision: str, device_type: str) -> bool:
    """Whether `train.mixed_precision` computes in bf16 on a device of `device_type` ("cuda", "cpu", ...)."""
    if mixed_precision != "auto":
        return mixed_precision == "bf16"
    return device_type == "cuda" or native_bf16_cpu(device_type)


def describe(mixed_precision: str, device_type: str) -> str:
    """One line for the run's log and `oxrl doctor`."""
    bf16 = uses_bf16(mixed_precision, device_type)
    native = native_bf16_cpu(device_type)
    if mixed_precision != "auto":
        why = "set"
    elif device_type == "cuda":
        why = "a GPU"
    elif device_type == "cpu":
        why = f"auto: this CPU {'has' if native else 'has no'} native bf16"
    else:
        why = f"auto on {device_type}"
    line = f"train.mixed_precision={mixed_precision}: {'bf16 autocast, fp32 master weights' if bf16 else 'fp32'} ({why})"
    if native and not bf16:
        line += "; this CPU has native bf16: train.mixed_precision=bf16 computes about 1.6x faster"
    return line


def samples_from_bf16_copy(rollout_precision: str, device_type: str, shards_parameters: bool) -> bool:
    """Whether the `hf` rollout engine samples from a bf16 copy of the policy (`rl.rollout.precision`; `auto`: on a
    CPU with native bf16, weights not sharded): 1.85x the speed of fp32 decoding at the demo's batch of 32, and
    faster than decoding under autocast, which re-casts every weight at every token."""
    if rollout_precision == "auto":
        return native_bf16_cpu(device_type) and not shards_parameters
    return rollout_precision == "bf16"


def autocast_for(mixed_precision: str, device_type: str):
    """A context factory: bf16 autocast where `uses_bf16`, else nothing."""
    if uses_bf16(mixed_precision, device_type):
        return functools.partial(torch.autocast, device_type=device_type, dtype=torch.bfloat16)
    return nullcontext
