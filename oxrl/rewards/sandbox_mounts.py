"""The file system a sandboxed program sees: what bwrap mounts, binds and leaves out.

Read-only binds of /usr (and /bin, /lib, /lib64 as the host has them) and of the interpreter and its
standard library at their host paths; the program folder at /sandbox; private, size-limited tmpfs at
/tmp (the working directory) and /dev/shm; a read-only /dev holding null, zero, full, random, urandom
and stdin. No /proc, no /sys. Why each of these: `oxrl.rewards.sandbox`'s docstring.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64")  # bound read-only (or re-created as the host's symlinks)
DEVICE_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9)}  # (major, minor)
# Inside the sandbox: the program folder (child script and solution, read-only) and the working
# directory, which is the /tmp tmpfs itself.
INSIDE_PROGRAM, INSIDE_WORK = "/sandbox", "/tmp"


def mount_arguments(root: Path, scratch_bytes: int) -> list[str]:
    """bwrap's file-system arguments for the call folder `root` (its program/, stdin and, made here, dev/)."""
    python = interpreter_layout()
    arguments = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # e.g. /bin -> usr/bin on a merged-/usr system
            arguments += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            arguments += ["--ro-bind", path, path]
    for path in python.binds:
        arguments += ["--ro-bind", path, path]
    for path in python.hidden:
        arguments += ["--tmpfs", path, "--remount-ro", path]
    # /dev: a tmpfs made read-only (not recursively: the nodes and /dev/shm are mounts of their own,
    # and bwrap's read-only binds are nodev) holding the nodes and the input.
    arguments += ["--tmpfs", "/dev", *device_binds(root / "dev"), "--ro-bind", str(root / "stdin"), "/dev/stdin"]
    return [
        *arguments,
        "--size", str(scratch_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--size", str(scratch_bytes), "--tmpfs", INSIDE_WORK,
        "--ro-bind", str(root / "program"), INSIDE_PROGRAM, "--remount-ro", "/", "--chdir", INSIDE_WORK,
    ]


def private_devices() -> bool:
    """Whether the sandbox needs device nodes of its own: the trainer owns the host's, so the program would too."""
    return os.stat("/dev/null").st_uid == os.geteuid()


@functools.lru_cache(maxsize=1)
def device_problem() -> str | None:
    """Why private device nodes cannot be made and used in the temporary folder, or None when they can."""
    with tempfile.TemporaryDirectory(prefix="oxrl-sandbox-dev-") as folder:
        node = os.path.join(folder, "null")
        try:
            os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(*DEVICE_NODES["null"]))
            with open(node, "wb") as handle:
                handle.write(b"x")
        except OSError as error:
            return (
                f"cannot make and open a device node in {tempfile.gettempdir()} ({error.strerror}): a file system "
                "mounted nodev, or no CAP_MKNOD. Set TMPDIR to a folder where root can use device nodes"
            )
    return None


def device_binds(folder: Path) -> list[str]:
    """bwrap arguments that put usable null, zero, full, random, urandom in /dev ([] where none can be made)."""
    if not private_devices():
        return [arg for name in DEVICE_NODES for arg in ("--dev-bind", f"/dev/{name}", f"/dev/{name}")]
    if device_problem() is not None:
        return []
    folder.mkdir()
    arguments = []
    for name, (major, minor) in DEVICE_NODES.items():
        node = folder / name
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(major, minor))
        os.chmod(node, 0o666)  # mknod's mode went through the umask
        arguments += ["--dev-bind", str(node), f"/dev/{name}"]
    return arguments


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
