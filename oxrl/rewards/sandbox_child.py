"""The first code that runs inside the sandbox process; it then runs the untrusted program.

Not imported by oxRL: `oxrl.rewards.sandbox` copies it next to the program and executes it as a
script (`python -s -S -B child.py WORK_DIR SOLUTION CPU MEMORY FILE_SIZE PROCESSES OPEN_FILES`),
inside bubblewrap unless isolation is "none", so it uses the standard library only. In order,
before any untrusted code runs:

1. resource limits (`setrlimit`, soft = hard) for CPU seconds, address space, file size, processes
   and open files; no core dumps. (Set here rather than in the parent's `preexec_fn`, which Python
   documents as unsafe when the parent has threads, and the code reward runs a thread pool.)
2. no core dumps even through a piped `kernel.core_pattern`: the process is made not dumpable
   (`no_core_dumps`).
3. an audit hook (PEP 578) that refuses, with PermissionError: creating processes (fork, exec,
   spawn, system, subprocess), sockets, signals to other processes, changing resource limits,
   loading ctypes or `_posixsubprocess`, writing or changing files outside WORK_DIR, reading files
   outside WORK_DIR and the standard library, and opening directories outside WORK_DIR.

The audit hook is defence in depth, NOT the boundary: it runs in the program's own interpreter,
so a program can switch it off (by rebinding this module's globals or the hook's closure cells)
or walk around it (`dir_fd` opens, `_posixshmem`, `signal.pidfd_send_signal`). What holds is
what the kernel enforces: bubblewrap's namespaces and read-only mounts, the seccomp filter and the
resource limits above. The hook only turns the common accidents of RL policies (a stray fork, a
write to the home directory) into a clear PermissionError in the program's stderr.
"""

from __future__ import annotations

import builtins
import os
import resource
import sys

FORBIDDEN_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "pty.spawn",
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyaddr", "socket.sendto", "resource.setrlimit", "resource.prlimit",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
})
# Events that change the file system: every path among their arguments must be inside WORK_DIR.
PATH_EVENTS = frozenset({
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
    "os.truncate", "os.utime", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr", "shutil.rmtree",
    "shutil.move", "shutil.copyfile", "sqlite3.connect", "dbm.open",
})
FORBIDDEN_IMPORTS = frozenset({"_posixsubprocess", "_ctypes", "ctypes", "_xxsubinterpreters", "_testcapi", "_testinternalcapi"})
READABLE_FILES = frozenset({"/dev/null", "/dev/urandom", "/dev/random", "/dev/zero", "/dev/full", "/dev/stdin"})
# Writable devices: an honest program sends what it does not want to os.devnull.
WRITABLE_FILES = frozenset({"/dev/null", "/dev/zero", "/dev/full"})


def set_limits(cpu_seconds: int, memory_bytes: int, file_size_bytes: int, processes: int, open_files: int) -> None:
    limits = (
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_AS, memory_bytes),
        (resource.RLIMIT_FSIZE, file_size_bytes),
        (resource.RLIMIT_NPROC, processes),
        (resource.RLIMIT_NOFILE, open_files),
        (resource.RLIMIT_CORE, 0),
    )
    for kind, value in limits:
        _, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)  # an unprivileged process cannot raise its hard limit
        resource.setrlimit(kind, (value, value))


def no_core_dumps() -> None:
    """Make this process not dumpable. RLIMIT_CORE=0 stops core files, but not a `kernel.core_pattern` that
    pipes dumps to a host helper (systemd-coredump, apport): the kernel starts it as root for any crash and
    hands it this process's memory. The seccomp filter refuses making it dumpable again."""
    import ctypes  # before the audit hook, which refuses ctypes to the program; dropped from sys.modules below

    PR_SET_DUMPABLE = 4
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    for name in [name for name in sys.modules if name in ("ctypes", "_ctypes") or name.startswith("ctypes.")]:
        del sys.modules[name]  # so that the program's `import ctypes` is an import the audit hook sees


def install_audit_hook(work_dir: str) -> None:
    # Bound now: the untrusted code must not be able to swap these out from under the hook.
    realpath, isdir, fspath, sep, getpid = os.path.realpath, os.path.isdir, os.fspath, os.sep, os.getpid
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    work = realpath(work_dir)
    stdlib = realpath(os.path.dirname(os.__file__))
    readable_roots = (work + sep, stdlib + sep, "/usr/share/zoneinfo/")

    def resolve(path: str | bytes | os.PathLike) -> str:
        path = fspath(path)
        if isinstance(path, bytes):
            path = path.decode("utf-8", "surrogateescape")
        return realpath(path)

    def inside_work(path: str | bytes | os.PathLike) -> bool:
        resolved = resolve(path)
        return resolved == work or resolved.startswith(work + sep)

    def deny(event: str, detail: str = "") -> None:
        raise PermissionError(f"sandbox: {event} is not allowed{detail}")

    def hook(event: str, args: tuple) -> None:
        if event in FORBIDDEN_EVENTS:
            deny(event)
        elif event == "import":
            if args[0] in FORBIDDEN_IMPORTS:
                deny(event, f" for {args[0]!r}")
        elif event in ("os.kill", "os.killpg"):
            if args[0] != getpid():
                deny(event, f" (pid {args[0]})")
        elif event == "open":
            path, mode, flags = args
            if isinstance(path, int):  # an already open descriptor (os.fdopen)
                return
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & write_flags)
            if inside_work(path):
                return
            resolved = resolve(path)
            if writes and resolved in WRITABLE_FILES:
                return
            if writes or isdir(resolved):
                deny("writing outside the sandbox directory" if writes else "opening a directory", f": {resolved}")
            if resolved not in READABLE_FILES and not resolved.startswith(readable_roots):
                deny("reading outside the sandbox directory and the standard library", f": {resolved}")
        elif event in PATH_EVENTS:
            for arg in args:
                if isinstance(arg, (str, bytes, os.PathLike)) and not inside_work(arg):
                    deny(event, f" outside the sandbox directory: {resolve(arg)}")

    sys.addaudithook(hook)


def main() -> None:
    # Python put this script's folder (oxrl/rewards) first on sys.path; the program has no business there.
    if sys.path and os.path.realpath(sys.path[0]) == os.path.realpath(os.path.dirname(__file__)):
        del sys.path[0]
    work_dir, solution_path = sys.argv[1], sys.argv[2]
    cpu_seconds, memory_bytes, file_size_bytes, processes, open_files = (int(a) for a in sys.argv[3:8])
    with open(solution_path, encoding="utf-8") as handle:
        source = handle.read()
    set_limits(cpu_seconds, memory_bytes, file_size_bytes, processes, open_files)
    no_core_dumps()
    install_audit_hook(work_dir)
    # `site` (skipped by -S) is what defines exit() and quit(); programs written for judges call them.
    builtins.exit = builtins.quit = sys.exit
    sys.argv = ["solution.py"]
    code = compile(source, "solution.py", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": builtins})


if __name__ == "__main__":
    main()
