"""Run untrusted Python (model-generated code) inside a bubblewrap sandbox: a kernel boundary that fails closed.

Model output never runs in the trainer's process. `run_python(code, stdin, limits)` runs it as

    bwrap <namespaces, mounts, seccomp> -- <real python> -s -S -B /sandbox/child.py /tmp /sandbox/solution.py <limits>

The boundary is the kernel's, set up by bubblewrap (`bwrap` >= 0.8, Debian/Fedora package `bubblewrap`):

- new user, PID, IPC, network, UTS, cgroup and mount namespaces. Inside, the program is uid/gid
  65534 ("nobody") with no capabilities, cannot create further user namespaces, runs in a new
  session (no terminal to push input into), and is the namespace's PID 1: no other process, the
  trainer least of all, exists in its world;
- a file system of its own, built from nothing and read-only except two private, size-limited
  tmpfs (`scratch_mb`): /tmp, which is the working directory, HOME and TMPDIR, and /dev/shm. It
  holds /usr (and /bin, /lib, /lib64 as the host has them), the real interpreter and its standard
  library at their host paths (the base installation's site-packages covered by an empty tmpfs),
  the program, and a /dev of its own: null, zero, full, random and urandom, for reading and
  writing, and stdin (the input, read-only). Not the repository, not the virtual environment, not
  /root, /home or /etc, and neither /proc nor /sys (below). Every mount is `nosuid`;
- no network: the new network namespace has only a loopback interface, and it is down; sockets of
  any family but AF_UNIX cannot even be created;
- a seccomp filter (`sandbox_seccomp`): no new processes (with `max_processes=1`, the default), no
  new namespaces, no SysV IPC, POSIX message queues or memfd, no clearing of the parent-death
  signal, no making itself dumpable again (core dumps are off, through a piped `core_pattern`
  too), no sockets but AF_UNIX, no kernel keyrings or kernel log, no file leases or `flock`, no
  ptrace, io_uring, bpf, mounts or module loading;
- resource limits (set by `sandbox_child.py` before the program runs): CPU seconds, address space
  (`memory_mb`), file size, tasks (RLIMIT_NPROC = `max_tasks`), open files, no core dumps;
- stdin, stdout and stderr are pipes (`sandbox_pipes`), never descriptors of the trainer's files,
  which the program could `fchmod` or lock: the trainer feeds the input, keeps the first
  `max_output_bytes` of each output and closes its end after `file_size_mb` (writes then fail);
- a cgroup per call (`sandbox_cgroup`), where the trainer can create them (root, or a delegated
  cgroup): at most `max_tasks` processes and threads together, and at most `memory_mb` + 2 x
  `scratch_mb` + 32 MiB of memory for all of them, tmpfs, shared-memory and kernel memory included
  (the 32 MiB are for the kernel's objects: page tables, socket buffers, file metadata);
- a life no longer than the call (`sandbox_launch`). bwrap holds the program until it has been
  moved into its cgroups. At the wall-clock timeout, and at the end of every call, the program,
  the PID namespace's init, is killed through a pidfd; the kernel then kills everything else in
  the namespace, threads and double-forked daemons included, before bwrap returns; whatever is
  still in the cgroup is killed, and the cgroup removed. If the trainer dies, bwrap dies with it
  and the program with bwrap (`--die-with-parent`): the program cannot clear that parent-death
  signal, since the filter refuses `prctl(PR_SET_PDEATHSIG)`, the mounts are `nosuid` (no
  set-uid exec) and changing its credentials needs capabilities it lacks. The next trainer
  empties and removes the cgroups of trainers that died;
- an environment built from scratch: PATH, LANG, LC_ALL, HOME, TMPDIR and PYTHONHASHSEED=0.

Where a controller's cgroup cannot be used (no write access to the trainer's cgroup, or
`OXRL_SANDBOX_CGROUP=none`; `oxrl doctor` says which and why), its bound falls back to another:

- tasks: RLIMIT_NPROC, which the kernel counts per user namespace, when the trainer is not root.
  When it is root (RLIMIT_NPROC does not bind uid 0), the seccomp filter refuses every `clone`:
  the program gets no threads, and `max_processes` above 1 raises `SandboxUnavailableError`;
- memory: RLIMIT_AS per process, the tmpfs sizes, and the refusal of SysV IPC, message queues and
  memfd, which RLIMIT_AS would not count. Kernel memory (tmpfs inodes, pipe and socket buffers) is
  then bounded only through the CPU limit and the open-files limit.

The seccomp filter describes x86-64 and aarch64 only. Elsewhere nothing would refuse SysV shared
memory, memfd or (as root) threads, so without a memory cgroup (and, as root, a pids cgroup) every
run raises `SandboxUnavailableError`; with them, a program there can still clear its parent-death
signal, so if the trainer dies it lives until the next trainer empties its cgroup.

Device nodes. When the trainer is root, uid 65534 inside owns what root owns outside: the host's
/dev/null bound writable could be chmod-ed by the program (and bwrap's read-only binds are
`nodev`, so unusable). Each call gets private nodes instead, made with mknod in its temporary
folder; a chmod of those harms nobody. That needs a temporary folder on a file system that allows
device nodes (not mounted `nodev`); where it is not, the sandbox has no device nodes and `oxrl
doctor` says so. When the trainer is not root, the host's nodes are bound: the program does not
own them.

No /proc. A /proc, even one of its own PID namespace, would show the program the host paths of
every bind (mountinfo), the kernel command line and, when the trainer is root, the host's
root-only files (/proc/slabinfo, timer_list, vmallocinfo, keys, whose owner uid it has); masking
them one by one would leave every file nobody listed. CPython and its standard library run
without it (`os.cpu_count()` falls back to the scheduler's CPU mask; subprocess closes descriptors
with close_range). What needs it does not work: /dev/fd, /dev/stdout, /proc/self/...

`sandbox_child.py` also installs a Python audit hook. It is defence in depth only: it lives in the
program's own interpreter, so a program can switch it off, and nothing above depends on it.

Fail closed. Without a usable bwrap (not installed, too old, or unable to create namespaces here)
every run raises `SandboxUnavailableError`, which says what to install and what the trial run
printed; the check runs once per process (`require_sandbox`). `isolation="none"` runs programs
without bwrap (a plain subprocess with the same rlimits, temporary directory, environment and
audit hook, but no namespaces, filter or cgroup): UNSAFE for model-written code, meant only for
trusted code on a machine without bwrap; it logs a warning.

Limits, honestly. The sandbox shares the host's kernel, so a kernel exploit gets out of it (use a
VM or gVisor against adversaries who have one). When the trainer runs as root, uid 65534 inside
is root outside the namespaces: it has no capabilities, but it owns what root owns, which is why
every bind is read-only, the device nodes are private and there is no /proc (a writable
/proc/sys would let it set the host's sysctls).
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from oxrl.errors import UserError
from oxrl.rewards.sandbox_cgroup import CGROUP_ENV, CallCgroup, CgroupSetup, cgroup_setup
from oxrl.rewards.sandbox_launch import Launched, launch_bwrap, wait_then_kill
from oxrl.rewards.sandbox_mounts import (
    INSIDE_PROGRAM, INSIDE_WORK, SYSTEM_DIRS, device_problem, interpreter_layout, mount_arguments, private_devices,
)
from oxrl.rewards.sandbox_pipes import PipedStdio
from oxrl.rewards.sandbox_seccomp import seccomp_program

logger = logging.getLogger(__name__)

BWRAP = "bwrap"  # the bubblewrap executable: a name looked up on PATH, or a path
MIN_BWRAP_VERSION = (0, 8)  # --disable-userns (0.8) and --size for tmpfs (0.7)
ISOLATIONS = ("bwrap", "none")
SANDBOX_ID = "65534"  # uid and gid inside the sandbox ("nobody")
KERNEL_SLACK_MB = 32  # the memory cgroup's allowance beyond memory_mb and the tmpfs: page tables, sockets, slab
CHILD_SCRIPT = Path(__file__).with_name("sandbox_child.py")
# -s: no user site-packages; -S: no `site` (no site-packages at all, no .pth hooks); -B: no bytecode
# files. Not -I: it implies -E, which would ignore the PYTHONHASHSEED we set for reproducible set/dict
# orders; the environment is built from scratch, so there are no other PYTHON* variables to ignore.
INTERPRETER_FLAGS = ("-s", "-S", "-B")
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`, Fedora/RHEL: `dnf install bubblewrap`)"
OPT_OUT_HINT = (
    "Only for trusted code: the code reward's `isolation: none` runs programs without the sandbox "
    "(UNSAFE for model-written code)."
)


class SandboxUnavailableError(UserError, RuntimeError):
    """The code sandbox cannot run on this machine (bwrap missing or unable to create namespaces); nothing ran."""


def check_isolation(isolation: str) -> None:
    if isolation not in ISOLATIONS:
        raise ValueError(
            f"isolation must be one of {list(ISOLATIONS)}, got {isolation!r} "
            "('bwrap': the kernel sandbox; 'none': no sandbox, UNSAFE for model-written code)"
        )


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 5
    wall_seconds: float = 10.0  # also bounds programs that sleep or block without using CPU
    # Address space of each process (RLIMIT_AS), interpreter included. With a memory cgroup, also the
    # memory of all its processes together with its tmpfs files: memory_mb + 2 * scratch_mb + 32 MiB.
    memory_mb: int = 512
    file_size_mb: int = 16  # largest file it may write, stdout and stderr included
    scratch_mb: int = 64  # size of each private tmpfs: /tmp (the working directory) and /dev/shm
    # 1: the program alone (the seccomp filter refuses new processes; threads are tasks, see max_tasks).
    # Above 1: it may start processes, counted with its threads in max_tasks (the kernel keeps no
    # separate count of processes).
    max_processes: int = 1
    # Processes and threads together, the program included: the call's pids cgroup and RLIMIT_NPROC
    # (module docstring: where neither binds, a root trainer's sandbox gets no threads at all).
    max_tasks: int = 32
    open_files: int = 64
    max_output_bytes: int = 1 << 20  # how much of stdout/stderr we read back
    # "bwrap": the kernel sandbox (module docstring). "none": a plain subprocess with the same limits
    # and no isolation: UNSAFE for model-written code, only for trusted code where bwrap is missing.
    isolation: str = "bwrap"

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds", "memory_mb", "file_size_mb", "scratch_mb", "max_processes",
                     "max_tasks", "open_files", "max_output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)}")
        if self.max_processes > self.max_tasks:
            raise ValueError(
                f"SandboxLimits.max_processes ({self.max_processes}) cannot exceed max_tasks ({self.max_tasks}), "
                "which counts the program's processes and threads together"
            )
        check_isolation(self.isolation)

    @property
    def cgroup_memory_bytes(self) -> int:
        return (self.memory_mb + 2 * self.scratch_mb + KERNEL_SLACK_MB) << 20


@dataclass
class SandboxResult:
    returncode: int  # negative: killed by that signal (e.g. -9 for the wall-clock timeout, -24 at the CPU limit)
    stdout: str
    stderr: str
    timed_out: bool
    elapsed_seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@dataclass(frozen=True)
class KernelBounds:
    """What bounds a program's tasks and memory on this machine (module docstring, the fallbacks)."""

    cgroups: CgroupSetup
    trainer_is_root: bool  # RLIMIT_NPROC does not bind the sandbox's uid, which is root outside
    seccomp: bool = True  # whether this architecture has the filter (sandbox_seccomp)

    @property
    def threads_allowed(self) -> bool:
        """Whether the kernel bounds the number of tasks; if not, the seccomp filter refuses every clone."""
        return self.cgroups.bounds("pids") or not self.trainer_is_root

    def check(self, limits: SandboxLimits) -> None:
        """`SandboxUnavailableError` where nothing here would bound what `limits` allows."""
        fix = f"run the trainer with write access to its cgroup, or point {CGROUP_ENV} at a delegated cgroup v2 folder"
        if not self.seccomp:
            # Without the filter, SysV shared memory and memfd escape RLIMIT_AS, and threads RLIMIT_NPROC as root.
            missing = [name for name in ("pids", "memory") if not self.cgroups.bounds(name)
                       and (name == "memory" or self.trainer_is_root)]
            if missing:
                raise SandboxUnavailableError(
                    f"the code sandbox has no seccomp filter for {platform.machine()} (sandbox_seccomp describes "
                    f"x86_64 and aarch64), so only cgroups could bound a program's "
                    f"{' and '.join('tasks' if name == 'pids' else name for name in missing)}, and there are none: "
                    f"{self.cgroups.describe()}. To fix: {fix}"
                )
        if limits.max_processes > 1 and not self.threads_allowed:
            raise SandboxUnavailableError(
                f"SandboxLimits(max_processes={limits.max_processes}) needs a pids cgroup when the trainer runs as "
                f"root, which RLIMIT_NPROC does not bind, and there is none here ({self.cgroups.problems['pids']}). "
                f"To fix: {fix}, or keep max_processes=1"
            )


def kernel_bounds() -> KernelBounds:
    return KernelBounds(cgroup_setup(), os.getuid() == 0, seccomp_program(allow_new_processes=False) is not None)


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as a program in the sandbox, feeding it `stdin`; thread-safe (no preexec_fn).

    Raises `SandboxUnavailableError` when `limits.isolation` is "bwrap" (the default) and bwrap cannot
    run here, or cannot bound what the limits allow: a program is never run with less isolation
    than asked for.
    """
    limits = limits or SandboxLimits()
    if limits.isolation == "none":
        _warn_unsandboxed()
        return _run(code, stdin, limits, bwrap=None)
    return _run(code, stdin, limits, bwrap=require_sandbox())


def require_sandbox(binary: str | None = None) -> str:
    """The path of a bwrap that passed a trial run (once per process and binary), else `SandboxUnavailableError`."""
    path, problem = _probe(binary or BWRAP)
    if problem is not None:
        raise SandboxUnavailableError(problem)
    return path
@functools.lru_cache(maxsize=None)
def _probe(binary: str) -> tuple[str, str | None]:
    """(path, None) when a trivial program runs in the sandbox, else (binary, why not)."""
    path = shutil.which(binary)
    if path is None:
        return binary, f"the code sandbox needs bubblewrap, and `{binary}` is not installed or not on PATH: {INSTALL_HINT}. {OPT_OUT_HINT}"
    version = _bwrap_version(path)
    if version is not None and version < MIN_BWRAP_VERSION:
        return binary, (
            f"`{path}` is bubblewrap {'.'.join(map(str, version))}, too old for the code sandbox, which needs "
            f">= {'.'.join(map(str, MIN_BWRAP_VERSION))}: {INSTALL_HINT} from a newer release. {OPT_OUT_HINT}"
        )
    expected = "sandbox ok"
    try:
        result = _run(f"print({expected!r})", "", SandboxLimits(cpu_seconds=10, wall_seconds=30.0), bwrap=path)
    except OSError as error:
        return binary, f"the code sandbox cannot start `{path}`: {error}. Reinstall it: {INSTALL_HINT}. {OPT_OUT_HINT}"
    if result.ok and result.stdout.strip() == expected:
        return path, None
    said = result.stderr.strip()[-600:] or result.stdout.strip()[-600:] or "(nothing)"
    return binary, (
        f"the code sandbox cannot run here: a trial run of `{path}` failed (exit {result.returncode}"
        f"{', timed out' if result.timed_out else ''}) and said: {said}\n"
        "bwrap needs user namespaces: check `sysctl user.max_user_namespaces` (> 0), "
        "`kernel.unprivileged_userns_clone` (1, where it exists) and, on Ubuntu, "
        "`kernel.apparmor_restrict_unprivileged_userns`; a container must allow creating namespaces. "
        f"If bwrap itself is broken: {INSTALL_HINT}. {OPT_OUT_HINT}"
    )


def _bwrap_version(path: str) -> tuple[int, ...] | None:
    """(0, 8, 0) from `bwrap --version` ("bubblewrap 0.8.0"), or None when it says something else."""
    try:
        said = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None  # the trial run will fail and say why
    words = said.split()
    if len(words) != 2 or words[0] != "bubblewrap":
        return None
    try:
        return tuple(int(part) for part in words[1].split("."))
    except ValueError:
        return None


@functools.lru_cache(maxsize=1)
def _warn_unsandboxed() -> None:
    logger.warning(
        "code sandbox: isolation='none': programs run WITHOUT the bubblewrap sandbox (only rlimits, a "
        "temporary directory and a Python audit hook, which a program can switch off); this is UNSAFE "
        "for model-written code"
    )


def _run(code: str, stdin: str, limits: SandboxLimits, bwrap: str | None) -> SandboxResult:
    with tempfile.TemporaryDirectory(prefix="oxrl-sandbox-") as folder:
        # program/ holds what the sandbox reads (bound read-only at /sandbox); the rest stays outside.
        root = Path(folder)
        program = root / "program"
        program.mkdir()
        (program / "child.py").write_text(_child_source(), encoding="utf-8")
        (program / "solution.py").write_text(code, encoding="utf-8")
        (root / "stdin").write_text(stdin, encoding="utf-8")  # what /dev/stdin shows, read-only
        stdio = PipedStdio(stdin.encode("utf-8"), limits.max_output_bytes, limits.file_size_mb << 20)
        start = time.monotonic()
        if bwrap:
            returncode, timed_out = _run_sandboxed(bwrap, root, limits, stdio)
        else:
            returncode, timed_out = _run_unsandboxed(root, limits, stdio)
        stdout, stderr = stdio.finish()
        return SandboxResult(returncode, stdout, stderr, timed_out, elapsed_seconds=time.monotonic() - start)


def _run_sandboxed(bwrap: str, root: Path, limits: SandboxLimits, stdio: PipedStdio) -> tuple[int, bool]:
    """(exit status, timed out) of the program in `root`/program, run under bwrap in its own cgroups."""
    start = time.monotonic()
    bounds = kernel_bounds()
    bounds.check(limits)
    seccomp_fd = _seccomp_fd(limits, bounds)
    try:
        command = bwrap_arguments(bwrap, root, limits, seccomp_fd)
        with CallCgroup(bounds.cgroups, limits.max_tasks, limits.cgroup_memory_bytes) as cgroup:
            launched = launch_bwrap(
                [*command, *_limit_arguments(limits)], cgroup.attach, limits.wall_seconds, **stdio.popen, cwd=root,
                env=_scrubbed_env(INSIDE_WORK), pass_fds=() if seccomp_fd is None else (seccomp_fd,),
            )
            stdio.start(launched.process)
            timed_out = wait_then_kill(launched, limits.wall_seconds - (time.monotonic() - start))
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
    returncode = launched.process.returncode
    if 128 < returncode <= 128 + 64:
        returncode = 128 - returncode  # bwrap reports "killed by signal N" as 128 + N, like a shell
    return returncode, timed_out


def _run_unsandboxed(root: Path, limits: SandboxLimits, stdio: PipedStdio) -> tuple[int, bool]:
    """(exit status, timed out) of the program as a plain subprocess: isolation "none"."""
    home, program = root / "work", root / "program"
    home.mkdir()
    process = subprocess.Popen(
        [sys.executable, *INTERPRETER_FLAGS, str(program / "child.py"), str(home), str(program / "solution.py"),
         *_limit_arguments(limits)],
        **stdio.popen, cwd=home, env=_scrubbed_env(str(home)), start_new_session=True, close_fds=True,
    )
    stdio.start(process)
    timed_out = wait_then_kill(Launched(process), limits.wall_seconds)
    return process.returncode, timed_out


@functools.lru_cache(maxsize=1)
def _child_source() -> str:
    # Copied next to each program rather than bound from the package, so the sandbox learns nothing
    # of where oxRL is installed.
    return CHILD_SCRIPT.read_text(encoding="utf-8")


def _limit_arguments(limits: SandboxLimits) -> list[str]:
    """The child script's last arguments: CPU MEMORY FILE_SIZE PROCESSES OPEN_FILES (PROCESSES: RLIMIT_NPROC)."""
    return [
        str(limits.cpu_seconds), str(limits.memory_mb << 20), str(limits.file_size_mb << 20),
        str(limits.max_tasks), str(limits.open_files),
    ]


def bwrap_arguments(bwrap: str, root: Path, limits: SandboxLimits, seccomp_fd: int | None) -> list[str]:
    """The bwrap command line that runs `root`/program/solution.py, up to the child script's limit arguments."""
    arguments = [
        bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", SANDBOX_ID, "--gid", SANDBOX_ID,
        "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv",
        # The program is the namespace's PID 1: no bwrap process shares the sandbox with it (whose
        # memory it could write, since both are the same user), and its death ends the namespace.
        "--as-pid-1",
    ]
    for key, value in _scrubbed_env(INSIDE_WORK).items():
        arguments += ["--setenv", key, value]
    arguments += mount_arguments(root, limits.scratch_mb << 20)
    if seccomp_fd is not None:
        arguments += ["--seccomp", str(seccomp_fd)]
    return [
        *arguments, "--", interpreter_layout().executable, *INTERPRETER_FLAGS,
        f"{INSIDE_PROGRAM}/child.py", INSIDE_WORK, f"{INSIDE_PROGRAM}/solution.py",
    ]


def _seccomp_fd(limits: SandboxLimits, bounds: KernelBounds) -> int | None:
    """A pipe's read end holding the seccomp program (bwrap reads it to the end), or None where there is none."""
    program = seccomp_program(allow_new_processes=limits.max_processes > 1, allow_threads=bounds.threads_allowed)
    if program is None:
        return None
    read_fd, write_fd = os.pipe()  # the program is under a kilobyte: far below the pipe's buffer
    try:
        os.write(write_fd, program)
    finally:
        os.close(write_fd)
    return read_fd


def _scrubbed_env(home: str) -> dict[str, str]:
    # A fixed hash seed: the same program prints its sets in the same order, so it gets the same reward.
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": home, "TMPDIR": home, "PYTHONHASHSEED": "0"}


def sandbox_protections(binary: str | None = None) -> list[str]:
    """What guards a program here, for `oxrl doctor`; raises `SandboxUnavailableError` where the sandbox cannot run."""
    path = require_sandbox(binary)
    layout = interpreter_layout()
    bounds = kernel_bounds()
    bounds.check(SandboxLimits())
    seccomp = seccomp_program(allow_new_processes=False) is not None
    return [
        f"bubblewrap {'.'.join(map(str, _bwrap_version(path) or ('?',)))} at {path}: new user, PID, IPC, network, "
        "UTS, cgroup and mount namespaces",
        f"uid/gid {SANDBOX_ID}, no capabilities, no nested user namespaces, new session",
        f"read-only {', '.join(SYSTEM_DIRS)}, {layout.executable} and its stdlib; private /tmp and /dev/shm; "
        "no /proc, no /sys",
        _devices_line(),
        "seccomp: no new processes, SysV IPC, message queues, memfd, keyrings, kernel log, leases, flock, ptrace, "
        "io_uring, bpf, mounts; "
        "sockets AF_UNIX only; the parent-death signal stays" if seccomp
        else f"no seccomp filter: {platform.machine()} is not described in sandbox_seccomp",
        "rlimits: CPU, address space, file size, tasks, open files",
        *_bounds_lines(bounds),
        "lifetime: the wall-clock timeout, the end of the call and the trainer's death kill the PID namespace",
    ]


def _devices_line() -> str:
    if not private_devices():
        return "/dev/null, zero, full, random, urandom: the host's (the trainer does not own them)"
    problem = device_problem()
    if problem is None:
        return "/dev/null, zero, full, random, urandom: private nodes per call (the trainer owns the host's)"
    return f"/dev/null, zero, full, random, urandom: NONE, programs that open them fail: {problem}"


def _bounds_lines(bounds: KernelBounds) -> list[str]:
    """How tasks and memory are bounded: a cgroup per call, or which fallback applies (module docstring)."""
    cgroups = bounds.cgroups
    if cgroups.bounds("pids"):
        tasks = "tasks: a pids cgroup per call (max_tasks)"
    elif bounds.trainer_is_root:
        tasks = (f"tasks: NO pids cgroup ({cgroups.problems['pids']}) and the trainer is root, which RLIMIT_NPROC "
                 "does not bind: the seccomp filter refuses every thread and process (max_processes > 1 is refused)")
    else:
        tasks = f"tasks: RLIMIT_NPROC (max_tasks; no pids cgroup: {cgroups.problems['pids']})"
    if cgroups.bounds("memory"):
        memory = "memory: a memory cgroup per call (memory_mb + 2 x scratch_mb + 32 MiB, all processes and tmpfs)"
    else:
        memory = (f"memory: RLIMIT_AS per process and the tmpfs sizes (no memory cgroup: {cgroups.problems['memory']}); "
                  "kernel memory is bounded only through CPU time and open files")
    return [tasks, memory]
