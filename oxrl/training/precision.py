"""Which compute precision `train.mixed_precision` means on this machine: the one home of the rule.

    no    fp32 compute
    bf16  bf16 autocast over fp32 master weights and optimizer state (FSDP2: a bf16 parameter policy)
    auto  bf16 on a GPU; fp32 on a CPU

On a CPU that multiplies bf16 natively (x86 AVX512-BF16 or AMX, Arm's BF16 extension) `bf16` is the faster
choice (SmolLM2-135M forward+backward on 2,048 tokens: 13-15 s against 21-26 s in fp32 on 2 cores), and the
run's log and `oxrl doctor` say so. `auto` does not choose it on a CPU: a config that leaves the precision unset
would then compute differently depending on the CPU's flags, and whether bf16 costs the GRPO demo learning is not
settled: over three seeds its trained models scored 49-66% on a common set of 256 held-out prompts against 62-65%
in fp32, with gradients that agree closely (docs/benchmarks.md, "the demo over three seeds").

It is also the home of the `hf` rollout engine's precision rule (`rl.rollout.precision`): sampling from a bf16 copy
did not cost the demo its learning, so `auto` samples from one on such CPUs while training stays fp32.
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


def uses_bf16(mixed_precision: str, device_type: str) -> bool:
    """Whether `train.mixed_precision` computes in bf16 on a device of `device_type` ("cuda", "cpu", ...)."""
    if mixed_precision != "auto":
        return mixed_precision == "bf16"
    return device_type == "cuda"


def describe(mixed_precision: str, device_type: str) -> str:
    """One line for the run's log and `oxrl doctor`."""
    bf16 = uses_bf16(mixed_precision, device_type)
    why = "set" if mixed_precision != "auto" else "a GPU" if device_type == "cuda" else f"auto on {device_type}"
    line = f"train.mixed_precision={mixed_precision}: {'bf16 autocast, fp32 master weights' if bf16 else 'fp32'} ({why})"
    if device_type == "cpu" and not bf16 and cpu_has_native_bf16():
        line += "; this CPU has native bf16: train.mixed_precision=bf16 computes about 1.6x faster"
    return line


def samples_from_bf16_copy(rollout_precision: str, device_type: str, shards_parameters: bool) -> bool:
    """Whether the `hf` rollout engine samples from a bf16 copy of the policy (`rl.rollout.precision`; `auto`: on a
    CPU with native bf16, weights not sharded). Training keeps fp32 there: the GRPO demo learned as well sampling from
    the copy (64.1% held-out in fp32, against 67.2% sampling from the fp32 weights) and worse training in bf16 (54.7%)."""
    if rollout_precision == "auto":
        return device_type == "cpu" and cpu_has_native_bf16() and not shards_parameters
    return rollout_precision == "bf16"


def autocast_for(mixed_precision: str, device_type: str):
    """A context factory: bf16 autocast where `uses_bf16`, else nothing."""
    if uses_bf16(mixed_precision, device_type):
        return functools.partial(torch.autocast, device_type=device_type, dtype=torch.bfloat16)
    return nullcontext
