"""`run.keep_freed_memory`: a large CPU tensor allocated again and again stops faulting its pages in afresh."""

import json
import platform
import subprocess
import sys

import pytest

TENSOR_PAGES = 16 * 2**20 * 4 // 4096  # a 64 MiB fp32 tensor (above glibc's largest mmap threshold, 32 MiB)
PROBE = f"""
import json, resource, sys, torch
if sys.argv[1] == "keep":
    from oxrl.training.allocator import keep_freed_memory
    assert keep_freed_memory()
def faults_of_a_fresh_tensor():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tensor = torch.ones(16 * 2**20)  # written in full: every page touched
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del tensor
    return faults
print(json.dumps([faults_of_a_fresh_tensor() for _ in range(16)]))
"""


def page_faults(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_memory_is_reused_without_page_faults():
    default = page_faults("default")
    kept = page_faults("keep")
    # by default every allocation is a fresh mmap: all its pages are faulted in again, every time
    assert all(faults >= TENSOR_PAGES for faults in default), default
    # kept: the heap grows for the first few allocations (glibc's aligned allocations leave freed blocks a little too
    # small at first), then a freed block is reused and nothing is faulted in any more
    assert all(faults < TENSOR_PAGES // 100 for faults in kept[-4:]), kept
