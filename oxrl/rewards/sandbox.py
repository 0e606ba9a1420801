"""Run untrusted Python (model-generated code) in a separate, limited, network-less process.

Model output never runs in the trainer's process. `run_python(code, stdin, limits)` runs it as

    [unshare --net --] python -s -S -B sandbox_child.py WORK_DIR SOLUTION <limits>

Protections, outermost first:

- a separate process in its own session/process group; a wall-clock timeout kills the whole group
  (SIGKILL), and so does the end of every run, so nothing it started outlives it;
- a fresh temporary directory as working directory, HOME and TMPDIR, deleted afterwards; the program,
  its stdin and its stdout/stderr files live beside it, not in it;
- a scrubbed environment, built from scratch: PATH, LANG, LC_ALL, HOME, TMPDIR and PYTHONHASHSEED=0
  (no inherited tokens or keys); `-s -S` skip the user's and all site-packages (the program gets
  the standard library only), `-B` writes no bytecode;
- no network: a new network namespace (`unshare --net` as root, `unshare --map-root-user --net`
  otherwise, probed once per process) where not even loopback is up; without unshare (or without
  unprivileged user namespaces) only the audit hook below blocks sockets, and a warning is logged;
- resource limits in the child before the program runs (see `sandbox_child.py`): CPU seconds,
  address space, file size (which also caps its output: stdout/stderr are files), processes, open
  files, no core dumps;
- a Python audit hook in the child: no new processes, sockets, ctypes, signals to other processes or
  limit changes; no writes outside the working directory; no reads outside it and the standard
  library (so not `/proc/<trainer pid>/environ`, nor `~/.cache/huggingface/token`).

Limits, honestly: this is not a container. The audit hook is a Python-level guard, and a
determined program that reaches interpreter internals can get around it; RLIMIT_NPROC does not
bind root; when oxRL runs as root, so does the child (inside its network namespace); file size is
capped per file, not in total, so a program could fill the temp file system until its time runs
out. For hostile code at scale, run the trainer as an unprivileged user, or in a container/VM
(gVisor, nsjail, bubblewrap). What the sandbox reliably stops is what RL policies actually do:
infinite loops, memory and fork bombs, huge outputs, stray file writes, reading the environment,
network access.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

CHILD_SCRIPT = Path(__file__).with_name("sandbox_child.py")
# -s: no user site-packages; -S: no `site` (no site-packages at all, no .pth hooks); -B: no bytecode
# files. Not -I: it implies -E, which would ignore the PYTHONHASHSEED we set for reproducible set/dict
# orders; the environment is built from scratch, so there are no other PYTHON* variables to ignore.
INTERPRETER_FLAGS = ("-s", "-S", "-B")


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 5
    wall_seconds: float = 10.0  # also bounds programs that sleep or block without using CPU
    memory_mb: int = 512  # address space (RLIMIT_AS), interpreter included
    file_size_mb: int = 16  # largest file it may write, stdout and stderr included
    # RLIMIT_NPROC counts every process and thread of the user, so any small value means "none".
    max_processes: int = 1
    open_files: int = 64
    max_output_bytes: int = 1 << 20  # how much of stdout/stderr we read back

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds", "memory_mb", "file_size_mb", "open_files", "max_output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)}")


@dataclass
class SandboxResult:
    returncode: int  # negative: killed by that signal (e.g. -9 for the wall-clock timeout)
    stdout: str
    stderr: str
    timed_out: bool
    elapsed_seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as a program in the sandbox, feeding it `stdin`; thread-safe (no preexec_fn)."""
    limits = limits or SandboxLimits()
    with tempfile.TemporaryDirectory(prefix="oxrl-sandbox-") as root:
        work = Path(root, "work")
        work.mkdir()
        solution, stdin_path, stdout_path, stderr_path = (Path(root, n) for n in ("solution.py", "stdin", "stdout", "stderr"))
        solution.write_text(code, encoding="utf-8")
        stdin_path.write_text(stdin, encoding="utf-8")
        command = [
            *network_isolation_prefix(),
            sys.executable, *INTERPRETER_FLAGS, str(CHILD_SCRIPT), str(work), str(solution),
            str(limits.cpu_seconds), str(limits.memory_mb << 20), str(limits.file_size_mb << 20),
            str(limits.max_processes), str(limits.open_files),
        ]
        start = time.monotonic()
        with stdin_path.open("rb") as fin, stdout_path.open("wb") as fout, stderr_path.open("wb") as ferr:
            process = subprocess.Popen(
                command, stdin=fin, stdout=fout, stderr=ferr, cwd=work, env=_scrubbed_env(work),
                start_new_session=True, close_fds=True,
            )
            timed_out = _wait_then_kill_group(process, limits.wall_seconds)
        elapsed = time.monotonic() - start
        return SandboxResult(
            returncode=process.returncode,
            stdout=_read_head(stdout_path, limits.max_output_bytes),
            stderr=_read_head(stderr_path, limits.max_output_bytes),
            timed_out=timed_out,
            elapsed_seconds=elapsed,
        )


def _scrubbed_env(work: Path) -> dict[str, str]:
    # A fixed hash seed: the same program prints its sets in the same order, so it gets the same reward.
    return {
        "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": str(work), "TMPDIR": str(work),
        "PYTHONHASHSEED": "0",
    }


def _wait_then_kill_group(process: subprocess.Popen, timeout: float) -> bool:
    """Wait up to `timeout` s for the program, then SIGKILL its process group; True when it timed out.

    `waitid(WNOWAIT)` sees the exit without reaping the process: until it is reaped its pid, hence
    its process group id, cannot be reused, so `killpg` can only hit processes it started.
    """
    deadline = time.monotonic() + timeout
    delay = 0.0005
    timed_out = False
    while os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.02)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is already empty: nothing left to kill
    process.wait()
    return timed_out


def _read_head(path: Path, limit: int) -> str:
    with path.open("rb") as handle:
        return handle.read(limit).decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=1)
def network_isolation_prefix() -> tuple[str, ...]:
    """The command prefix that puts the child in a new network namespace, or () when none works here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        logger.warning("sandbox: `unshare` not found; network access is blocked only by the Python audit hook")
        return ()
    candidates = [(unshare, "--net", "--"), (unshare, "--map-root-user", "--net", "--")]
    if os.geteuid() != 0:
        candidates.reverse()  # without root only a user namespace can create a network namespace
    failures = []
    for prefix in candidates:
        probe = subprocess.run(
            [*prefix, sys.executable, *INTERPRETER_FLAGS, "-c", "pass"],
            capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"}, check=False,
        )
        if probe.returncode == 0:
            logger.debug("sandbox: network namespace via %s", " ".join(prefix))
            return prefix
        failures.append(f"{' '.join(prefix[1:])}: {probe.stderr.strip()[:200]}")
    logger.warning(
        "sandbox: cannot create a network namespace (%s); network access is blocked only by the Python audit hook",
        "; ".join(failures),
    )
    return ()


def sandbox_protections() -> list[str]:
    """What the sandbox uses on this machine, for `oxrl doctor` and logs."""
    prefix = network_isolation_prefix()
    network = f"network namespace ({' '.join(prefix[1:-1])})" if prefix else "no network namespace (audit hook only)"
    return [
        "separate process group, killed on timeout and at exit",
        "temporary working directory, deleted afterwards",
        "scrubbed environment; python -s -S -B, standard library only",
        network,
        "rlimits: CPU, address space, file size, processes, open files, no core",
        "audit hook: no processes, sockets, ctypes, writes or reads outside the sandbox",
        "running as root: RLIMIT_NPROC does not apply" if os.geteuid() == 0 else "running unprivileged",
    ]
