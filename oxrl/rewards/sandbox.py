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
  the program, a /proc of its own PID namespace and a minimal /dev. Not the repository, not the
  virtual environment, not /root, /home or /etc;
- no network: the new network namespace has only a loopback interface, and it is down;
- a seccomp filter (`sandbox_seccomp`): no new processes (with `max_processes=1`, the default), no
  new namespaces, no kernel keyrings, no ptrace, io_uring, bpf, mounts or module loading;
- resource limits (set by `sandbox_child.py` before the program runs): CPU seconds, address space,
  file size (which also caps stdout/stderr: they are files outside the sandbox, read back up to
  `max_output_bytes`), processes, open files, no core dumps;
- a wall-clock timeout: bwrap is killed, `--die-with-parent` kills the program, and with the PID
  namespace's init gone the kernel kills every process left in it, double-forked daemons included
  (within moments of `run_python` returning); if the trainer dies, the same chain runs;
- an environment built from scratch: PATH, LANG, LC_ALL, HOME, TMPDIR and PYTHONHASHSEED=0.

`sandbox_child.py` also installs a Python audit hook. It is defence in depth only: it lives in the
program's own interpreter, so a program can switch it off, and nothing above depends on it.

Fail closed. Without a usable bwrap (not installed, too old, or unable to create namespaces here)
every run raises `SandboxUnavailableError`, which says what to install and what the trial run
printed; the check runs once per process (`require_sandbox`). `isolation="none"` runs programs
without bwrap (a plain subprocess with the same limits, temporary directory, environment and audit
hook): UNSAFE for model-written code, meant only for trusted code on a machine without bwrap; it
logs a warning.

Limits, honestly. The sandbox shares the host's kernel, so a kernel exploit gets out of it (use a
VM or gVisor against adversaries who have one). When the trainer runs as root, uid 65534 inside
is root outside the namespaces: it has no capabilities, but it owns what root owns, which is why
/proc, /dev and every bind are read-only (a writable /proc/sys would let it set the host's
sysctls), and the kernel exempts it from RLIMIT_NPROC, which is why the seccomp filter refuses
new processes (a `max_processes` above 1 as root leaves a fork bomb bounded by the wall clock
only). Memory is capped per process (RLIMIT_AS); the tmpfs files count apart from it. The program
can read the host paths of what is bound (in /proc/self/mountinfo), not anything else there.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from oxrl.rewards.sandbox_seccomp import seccomp_program

logger = logging.getLogger(__name__)

BWRAP = "bwrap"  # the bubblewrap executable: a name looked up on PATH, or a path
MIN_BWRAP_VERSION = (0, 8)  # --disable-userns (0.8) and --size for tmpfs (0.7)
ISOLATIONS = ("bwrap", "none")
SANDBOX_ID = "65534"  # uid and gid inside the sandbox ("nobody")
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64")  # bound read-only (or re-created as the host's symlinks)
DEVICE_NODES = ("null", "zero", "full", "random", "urandom", "tty")  # what `bwrap --dev` binds from the host
CHILD_SCRIPT = Path(__file__).with_name("sandbox_child.py")
# Inside the sandbox: the program folder (child script and solution, read-only) and the working
# directory, which is the /tmp tmpfs itself.
INSIDE_PROGRAM, INSIDE_WORK = "/sandbox", "/tmp"
# -s: no user site-packages; -S: no `site` (no site-packages at all, no .pth hooks); -B: no bytecode
# files. Not -I: it implies -E, which would ignore the PYTHONHASHSEED we set for reproducible set/dict
# orders; the environment is built from scratch, so there are no other PYTHON* variables to ignore.
INTERPRETER_FLAGS = ("-s", "-S", "-B")
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`, Fedora/RHEL: `dnf install bubblewrap`)"
OPT_OUT_HINT = (
    "Only for trusted code: the code reward's `isolation: none` runs programs without the sandbox "
    "(UNSAFE for model-written code)."
)


class SandboxUnavailableError(RuntimeError):
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
    memory_mb: int = 512  # address space (RLIMIT_AS), interpreter included
    file_size_mb: int = 16  # largest file it may write, stdout and stderr included
    scratch_mb: int = 64  # size of each private tmpfs: /tmp (the working directory) and /dev/shm
    # Processes and threads, the program included (RLIMIT_NPROC; with 1 the seccomp filter also refuses
    # every new process, which binds even when the trainer runs as root).
    max_processes: int = 1
    open_files: int = 64
    max_output_bytes: int = 1 << 20  # how much of stdout/stderr we read back
    # "bwrap": the kernel sandbox (module docstring). "none": a plain subprocess with the same limits
    # and no isolation: UNSAFE for model-written code, only for trusted code where bwrap is missing.
    isolation: str = "bwrap"

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds", "memory_mb", "file_size_mb", "scratch_mb", "max_processes",
                     "open_files", "max_output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)}")
        check_isolation(self.isolation)


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


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as a program in the sandbox, feeding it `stdin`; thread-safe (no preexec_fn).

    Raises `SandboxUnavailableError` when `limits.isolation` is "bwrap" (the default) and bwrap cannot
    run here: a program is never run with less isolation than asked for.
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
    with tempfile.TemporaryDirectory(prefix="oxrl-sandbox-") as root:
        # program/ holds what the sandbox reads (bound read-only at /sandbox); the rest stays outside.
        program = Path(root, "program")
        program.mkdir()
        Path(program, "child.py").write_text(_child_source(), encoding="utf-8")
        Path(program, "solution.py").write_text(code, encoding="utf-8")
        stdin_path, stdout_path, stderr_path = (Path(root, name) for name in ("stdin", "stdout", "stderr"))
        stdin_path.write_text(stdin, encoding="utf-8")
        seccomp_fd = _seccomp_fd(limits) if bwrap else None
        try:
            if bwrap:
                command = bwrap_arguments(bwrap, program, limits, seccomp_fd)
                home = INSIDE_WORK
            else:
                home = str(Path(root, "work"))
                os.mkdir(home)
                command = [sys.executable, *INTERPRETER_FLAGS, str(program / "child.py"), home, str(program / "solution.py")]
            start = time.monotonic()
            with stdin_path.open("rb") as fin, stdout_path.open("wb") as fout, stderr_path.open("wb") as ferr:
                process = subprocess.Popen(
                    [*command, *_limit_arguments(limits)], stdin=fin, stdout=fout, stderr=ferr,
                    cwd=root if bwrap else home, env=_scrubbed_env(home), start_new_session=True,
                    close_fds=True, pass_fds=() if seccomp_fd is None else (seccomp_fd,),
                )
                timed_out = _wait_then_kill_group(process, limits.wall_seconds)
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        elapsed = time.monotonic() - start
        returncode = process.returncode
        if bwrap and 128 < returncode <= 128 + 64:
            returncode = 128 - returncode  # bwrap reports "killed by signal N" as 128 + N, like a shell
        return SandboxResult(
            returncode=returncode,
            stdout=_read_head(stdout_path, limits.max_output_bytes),
            stderr=_read_head(stderr_path, limits.max_output_bytes),
            timed_out=timed_out,
            elapsed_seconds=elapsed,
        )


@functools.lru_cache(maxsize=1)
def _child_source() -> str:
    # Copied next to each program rather than bound from the package, so the sandbox learns nothing
    # of where oxRL is installed.
    return CHILD_SCRIPT.read_text(encoding="utf-8")


def _limit_arguments(limits: SandboxLimits) -> list[str]:
    """The child script's last arguments: CPU MEMORY FILE_SIZE PROCESSES OPEN_FILES."""
    return [
        str(limits.cpu_seconds), str(limits.memory_mb << 20), str(limits.file_size_mb << 20),
        str(limits.max_processes), str(limits.open_files),
    ]


def bwrap_arguments(bwrap: str, program: Path, limits: SandboxLimits, seccomp_fd: int | None) -> list[str]:
    """The bwrap command line that runs `program`/solution.py, up to the child script's limit arguments."""
    python = interpreter_layout()
    scratch = str(limits.scratch_mb << 20)
    arguments = [
        bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", SANDBOX_ID, "--gid", SANDBOX_ID,
        "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv",
        # The program is the namespace's PID 1: no bwrap process shares the sandbox with it (whose
        # memory it could write through /proc, since both are the same user).
        "--as-pid-1",
    ]
    for key, value in _scrubbed_env(INSIDE_WORK).items():
        arguments += ["--setenv", key, value]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # e.g. /bin -> usr/bin on a merged-/usr system
            arguments += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            arguments += ["--ro-bind", path, path]
    for path in python.binds:
        arguments += ["--ro-bind", path, path]
    for path in python.hidden:
        arguments += ["--tmpfs", path, "--remount-ro", path]
    # Read-only: /proc (when the trainer is root, so is the program to the kernel's sysctl permission
    # checks), bwrap's device nodes (host inodes: a chmod would change the host's /dev/null), /dev and /.
    arguments += ["--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev"]
    for node in DEVICE_NODES:
        arguments += ["--remount-ro", f"/dev/{node}"]
    arguments += [
        "--size", scratch, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--size", scratch, "--tmpfs", INSIDE_WORK,
        "--ro-bind", str(program), INSIDE_PROGRAM, "--remount-ro", "/", "--chdir", INSIDE_WORK,
    ]
    if seccomp_fd is not None:
        arguments += ["--seccomp", str(seccomp_fd)]
    return [
        *arguments, "--", python.executable, *INTERPRETER_FLAGS,
        f"{INSIDE_PROGRAM}/child.py", INSIDE_WORK, f"{INSIDE_PROGRAM}/solution.py",
    ]


@dataclass(frozen=True)
class InterpreterLayout:
    executable: str  # the real interpreter, not a virtual environment's link to it
    binds: tuple[str, ...]  # bound read-only at the same paths inside (beyond SYSTEM_DIRS)
    hidden: tuple[str, ...]  # the base installation's site-packages inside those, covered by an empty tmpfs


@functools.lru_cache(maxsize=1)
def interpreter_layout() -> InterpreterLayout:
    """What the sandbox binds so that the running Python (a venv's base interpreter) starts with its stdlib.

    The interpreter finds its standard library relative to its real path; a shared libpython, and the
    libraries that its extension modules link, sit in the base prefix's `lib` (pyenv, conda, uv).
    """
    executable = os.path.realpath(sys.executable)
    base = os.path.realpath(sys.base_prefix)
    paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    wanted = [executable, os.path.join(base, "lib"), paths["stdlib"], paths["platstdlib"]]
    covered = [os.path.realpath(path) for path in SYSTEM_DIRS if os.path.isdir(path)]
    binds: list[str] = []
    for path in sorted({os.path.realpath(p) for p in wanted if os.path.exists(p)}, key=len):
        if not _inside(path, covered + binds):
            binds.append(path)
    hidden = sorted({
        os.path.realpath(paths[key]) for key in ("purelib", "platlib")
        if os.path.isdir(paths[key]) and _inside(os.path.realpath(paths[key]), covered + binds)
    })
    return InterpreterLayout(executable, tuple(binds), tuple(hidden))


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _seccomp_fd(limits: SandboxLimits) -> int | None:
    """A pipe's read end holding the seccomp program (bwrap reads it to the end), or None where there is none."""
    program = seccomp_program(allow_new_processes=limits.max_processes > 1)
    if program is None:
        return None
    read_fd, write_fd = os.pipe()  # the program is a few hundred bytes: far below the pipe's buffer
    try:
        os.write(write_fd, program)
    finally:
        os.close(write_fd)
    return read_fd


def _scrubbed_env(home: str) -> dict[str, str]:
    # A fixed hash seed: the same program prints its sets in the same order, so it gets the same reward.
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": home, "TMPDIR": home, "PYTHONHASHSEED": "0"}


def _wait_then_kill_group(process: subprocess.Popen, timeout: float) -> bool:
    """Wait up to `timeout` s for the program, then SIGKILL its process group; True when it timed out.

    `waitid(WNOWAIT)` sees the exit without reaping the process: until it is reaped its pid, hence
    its process group id, cannot be reused, so `killpg` can only hit processes it started. Under
    bwrap the group holds bwrap alone (the program runs in a session of its own): bwrap's death sends
    the program SIGKILL (`--die-with-parent`), and the death of the program, the PID namespace's
    init, makes the kernel kill everything else in the namespace, whatever session it moved to.
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


def sandbox_protections(binary: str | None = None) -> list[str]:
    """What guards a program here, for `oxrl doctor`; raises `SandboxUnavailableError` where the sandbox cannot run."""
    path = require_sandbox(binary)
    layout = interpreter_layout()
    seccomp = seccomp_program(allow_new_processes=False) is not None
    return [
        f"bubblewrap {'.'.join(map(str, _bwrap_version(path) or ('?',)))} at {path}: new user, PID, IPC, network, "
        "UTS, cgroup and mount namespaces",
        f"uid/gid {SANDBOX_ID}, no capabilities, no nested user namespaces, new session",
        f"read-only {', '.join(SYSTEM_DIRS)}, {layout.executable} and its stdlib; private /tmp and /dev/shm; own /proc",
        "seccomp: no new processes, keyrings, ptrace, io_uring, bpf, mounts" if seccomp
        else f"no seccomp filter: {platform.machine()} is not described in sandbox_seccomp",
        "rlimits: CPU, address space, file size, processes, open files; the wall-clock timeout kills the namespace",
        "trainer is root: uid 65534 is root outside its namespace; RLIMIT_NPROC does not bind, the seccomp filter does"
        if os.geteuid() == 0 else "trainer is unprivileged: RLIMIT_NPROC binds as well",
    ]
