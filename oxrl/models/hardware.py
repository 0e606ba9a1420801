"""How much memory the devices training will run on have: detected here, or described as `8x80GB`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

GB = 1000**3  # GPU makers' GB: an "80GB" H100 reports about 79.2 GiB


class HardwareSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Devices:
    kind: str  # "cuda" or "cpu"
    count: int
    total: int  # bytes per device
    name: str

    def describe(self) -> str:
        size = f"{self.total / 1024**3:.1f} GiB"
        return f"{self.count} x {self.name} ({size} each)" if self.kind == "cuda" else f"CPU, {size} RAM"


def available_memory(cpu: bool = False) -> Devices:
    """This machine's GPUs (their total memory) or, without one or with `cpu`, its RAM (what is available now)."""
    import torch

    if torch.cuda.is_available() and not cpu:
        count = torch.cuda.device_count()
        return Devices("cuda", count, torch.cuda.get_device_properties(0).total_memory, torch.cuda.get_device_name(0))
    return Devices("cpu", 1, _available_ram(), "CPU")


def device_memory(device) -> Devices:
    """The memory of one torch device: a GPU's total, or the RAM available now for the CPU."""
    import torch

    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return Devices("cuda", 1, torch.cuda.get_device_properties(index).total_memory, torch.cuda.get_device_name(index))
    return Devices("cpu", 1, _available_ram(), "CPU")


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass  # not Linux: the total below is the best there is
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


SPEC = re.compile(r"^(?:(\d+)\s*[x*]\s*)?(\d+(?:\.\d+)?)\s*(GB|GiB|G)$", re.IGNORECASE)


def parse_devices(spec: str) -> Devices:
    """`8x80GB`, `1x24GB`, `80GB` (one GPU), or `cpu` (this machine's RAM)."""
    if spec.strip().lower() == "cpu":
        return Devices("cpu", 1, _available_ram(), "CPU")
    match = SPEC.match(spec.strip())
    if match is None:
        raise HardwareSpecError(f"--gpus `{spec}`: expected COUNTxSIZE such as 8x80GB or 1x24GB, or `cpu`")
    count, size, unit = int(match.group(1) or 1), float(match.group(2)), match.group(3).lower()
    if count < 1 or size <= 0:
        raise HardwareSpecError(f"--gpus `{spec}`: the count and the size must be positive")
    per_device = int(size * (1024**3 if unit == "gib" else GB))
    return Devices("cuda", count, per_device, f"{size:g}{match.group(3)} GPU")
