"""A cgroup per sandboxed call: the kernel's bound on all the tasks and all the memory of one program.

Rlimits bind one process at a time, and RLIMIT_NPROC not at all when the trainer is root; a cgroup
binds everything the program starts, threads included, and counts what rlimits miss (tmpfs and
shared-memory pages, kernel objects). Each call gets its own child cgroup, created under the
trainer's own cgroup of each controller:

- `pids`: `pids.max` = the call's task limit (processes and threads, the program included);
- `memory`: the call's memory limit (`memory.limit_in_bytes` and `memory.memsw.limit_in_bytes`
  on cgroup v1; `memory.max`, `memory.swap.max` = 0 and `memory.oom.group` on v2).

The sandbox moves the program into it before it runs (`CallCgroup.attach`), and afterwards
`CallCgroup.close` kills whatever is left in it (`cgroup.kill` on v2, each task through a pidfd on
v1), waits until it is empty and removes it.

Where the cgroups come from (`cgroup_setup`, the environment variable `OXRL_SANDBOX_CGROUP`):

- unset or "auto": cgroup v2 when the trainer's own cgroup already enables both controllers for
  its children (`cgroup.subtree_control`), else each controller's cgroup v1 hierarchy. Creating
  children needs write access to the trainer's cgroup: root, or a delegated cgroup;
- a path: a cgroup v2 directory prepared for oxRL (writable by the trainer, `pids` and `memory`
  in its `cgroup.subtree_control`), for a trainer whose own cgroup cannot delegate (v2 forbids
  enabling controllers for the children of a cgroup that holds processes);
- "none": no cgroups (the sandbox falls back to its other bounds: `oxrl.rewards.sandbox`).

A controller that cannot be used is reported with the reason (`CgroupSetup.problems`); the
sandbox decides what that means. A trial cgroup is created and removed once per setting, and the
cgroups of trainers that died in a call (named after the trainer's pid) are emptied and removed
then too.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

CGROUP_ENV = "OXRL_SANDBOX_CGROUP"
CONTROLLERS = ("pids", "memory")
PREFIX = "oxrl-sandbox-"  # then the trainer's identity (`_owner`), a dash and a random suffix
EMPTY_WAIT_S = 5.0  # how long `close` waits for killed tasks to leave the cgroup


@dataclass(frozen=True)
class CgroupSetup:
    """Where each usable controller's per-call cgroups are created: {controller: (version, parent folder)}."""

    parents: dict[str, tuple[int, str]] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # controller -> why it cannot be used

    def bounds(self, controller: str) -> bool:
        return controller in self.parents

    def describe(self) -> str:
        used = ", ".join(f"{name} (v{version}, under {parent})" for name, (version, parent) in self.parents.items())
        unused = "; ".join(f"no {name} cgroup: {why}" for name, why in self.problems.items())
        return "; ".join(part for part in (used and f"a cgroup per call: {used}", unused) if part)


def cgroup_setup(setting: str | None = None) -> CgroupSetup:
    """The cgroups this process can use, per `setting` (default: `$OXRL_SANDBOX_CGROUP`, else "auto")."""
    if setting is None:
        setting = os.environ.get(CGROUP_ENV, "").strip() or "auto"
    return _setup(setting)


@functools.lru_cache(maxsize=None)
def _setup(setting: str) -> CgroupSetup:
    if setting == "none":
        return CgroupSetup(problems={name: f"{CGROUP_ENV}=none" for name in CONTROLLERS})
    if setting == "auto":
        candidates = find_parents(_read("/proc/self/cgroup"), _read("/proc/self/mountinfo"))
    elif os.path.isabs(setting):
        candidates = {name: (2, setting) for name in _v2_controllers(setting)}
    else:
        raise ValueError(f"{CGROUP_ENV} must be 'auto', 'none' or an absolute path to a cgroup v2 folder, got {setting!r}")
    parents, problems = {}, {}
    for name in CONTROLLERS:
        if name not in candidates:
            problems[name] = f"no {name} controller delegated to this process's cgroup (setting {setting!r})"
            continue
        why = _trial(name, *candidates[name])
        if why is None:
            parents[name] = candidates[name]
        else:
            problems[name] = why
    setup = CgroupSetup(parents, problems)
    remove_stale_cgroups(setup)
    return setup


def find_parents(proc_cgroup: str, mountinfo: str) -> dict[str, tuple[int, str]]:
    """{controller: (version, folder of this process's cgroup)} from /proc/self/cgroup and /proc/self/mountinfo.

    v2 counts when the process's cgroup enables the controller for its children; otherwise the
    controller's v1 hierarchy, whose mount may show only a subtree (a container's), rooted at the
    mount's root.
    """
    mounts: dict[str, tuple[str, str]] = {}  # "cgroup2" or a v1 controller -> (mount root, mount point)
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2":
            mounts.setdefault("cgroup2", (root, point))
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                mounts.setdefault(option, (root, point))
    found: dict[str, tuple[int, str]] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        if names == "" and "cgroup2" in mounts:
            folder = _under_mount(path, *mounts["cgroup2"])
            if folder is not None:
                for name in _v2_controllers(folder):
                    found[name] = (2, folder)
        for name in names.split(","):
            if name in CONTROLLERS and name in mounts and name not in found:
                folder = _under_mount(path, *mounts[name])
                if folder is not None:
                    found[name] = (1, folder)
    return {name: found[name] for name in CONTROLLERS if name in found}


def _under_mount(path: str, root: str, point: str) -> str | None:
    """Where cgroup `path` is under a mount of the hierarchy's `root` at `point`; None when the mount does not show it."""
    root = root.rstrip("/")  # "/" becomes "", which every path starts with
    if path != root and not path.startswith(root + "/"):
        return None
    return os.path.normpath(point + "/" + path[len(root):].lstrip("/"))


def _unescape(text: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes.
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(escaped, plain)
    return text


def _v2_controllers(folder: str) -> list[str]:
    try:
        enabled = _read(os.path.join(folder, "cgroup.subtree_control")).split()
    except OSError:
        return []
    return [name for name in CONTROLLERS if name in enabled]


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(value)


def _trial(controller: str, version: int, parent: str) -> str | None:
    """None when a child cgroup can be created, limited and removed under `parent`, else why not."""
    folder = os.path.join(parent, f"{PREFIX}{_owner(os.getpid())}-trial{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(folder)
    except OSError as error:
        return f"cannot create a cgroup under {parent}: {error.strerror}"
    try:
        _limit(controller, version, folder, 1 << 30 if controller == "memory" else 64)
    except OSError as error:
        return f"cannot set {controller} limits in {folder}: {error.strerror}"
    finally:
        os.rmdir(folder)
    return None


def _limit(controller: str, version: int, folder: str, value: int) -> None:
    if controller == "pids":
        _write(os.path.join(folder, "pids.max"), str(value))
    elif version == 1:
        _write(os.path.join(folder, "memory.limit_in_bytes"), str(value))
        if os.path.exists(os.path.join(folder, "memory.memsw.limit_in_bytes")):  # swap accounting is on
            _write(os.path.join(folder, "memory.memsw.limit_in_bytes"), str(value))
    else:
        _write(os.path.join(folder, "memory.max"), str(value))
        for name, setting in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            if os.path.exists(os.path.join(folder, name)):
                _write(os.path.join(folder, name), setting)


class CallCgroup:
    """The cgroups of one call: created limited, the program attached, then emptied and removed by `close`."""

    def __init__(self, setup: CgroupSetup, max_tasks: int, memory_bytes: int):
        self.folders: list[str] = []
        name = f"{PREFIX}{_owner(os.getpid())}-{uuid.uuid4().hex[:12]}"
        limits = {"pids": max_tasks, "memory": memory_bytes}
        try:
            for controller, (version, parent) in setup.parents.items():
                folder = os.path.join(parent, name)
                if folder not in self.folders:  # v2: one folder for both controllers
                    os.mkdir(folder)
                    self.folders.append(folder)
                _limit(controller, version, folder, limits[controller])
        except BaseException:
            self.close()
            raise

    def attach(self, pid: int) -> None:
        """Move `pid` (not yet running untrusted code) into every cgroup of the call."""
        for folder in self.folders:
            _write(os.path.join(folder, "cgroup.procs"), str(pid))

    def close(self) -> None:
        """SIGKILL every task left in the call's cgroups, wait until they are empty, remove them."""
        for folder in self.folders:
            _empty(folder)
        self.folders.clear()

    def __enter__(self) -> CallCgroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _empty(folder: str) -> None:
    kill_file = os.path.join(folder, "cgroup.kill")  # v2, kernel >= 5.14: the kernel kills them all at once
    deadline = time.monotonic() + EMPTY_WAIT_S
    while True:
        tasks = _tasks(folder)
        if not tasks:
            try:
                os.rmdir(folder)
                return
            except FileNotFoundError:
                return  # another trainer's sweep removed it (a stale one)
            except OSError as error:
                if error.errno != errno.EBUSY:  # EBUSY: the last tasks are still leaving
                    raise
        elif os.path.exists(kill_file):
            _write(kill_file, "1")
        else:
            for pid in tasks:
                _kill_if_inside(pid, folder)
        if time.monotonic() > deadline:
            logger.warning("code sandbox: cgroup %s still holds tasks %s after SIGKILL; left in place", folder, tasks)
            return
        time.sleep(0.001)


def _tasks(folder: str) -> list[int]:
    try:
        return [int(line) for line in _read(os.path.join(folder, "cgroup.procs")).split()]
    except FileNotFoundError:
        return []


def _kill_if_inside(pid: int, folder: str) -> None:
    """SIGKILL `pid` if it is still in `folder` (checked after its pidfd pinned it, so never a reused pid)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if str(pid) in _read(os.path.join(folder, "cgroup.procs")).split():
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended by itself
    finally:
        os.close(pidfd)


def remove_stale_cgroups(setup: CgroupSetup) -> None:
    """Empty and remove, under every parent `setup` uses, the call cgroups of trainers that died in a call."""
    for parent in sorted({parent for _, parent in setup.parents.values()}):
        _remove_stale(parent)


def _remove_stale(parent: str) -> None:
    """Empty and remove the call cgroups under `parent` whose trainer has died."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if name.startswith(PREFIX) and _owner_died(name[len(PREFIX):]):
            logger.info("code sandbox: removing %s, left by a trainer that died", os.path.join(parent, name))
            _empty(os.path.join(parent, name))


def _owner(pid: int) -> str:
    """"<PID namespace>-<pid>-<start time>": names a process for good, across pid reuse, in names other trainers see."""
    return f"{os.stat('/proc/self/ns/pid').st_ino}-{pid}-{_start_ticks(pid)}"


def _owner_died(name: str) -> bool:
    """Whether the trainer named at the start of a call cgroup's `name` has died (never for another PID namespace's)."""
    parts = name.split("-")
    if len(parts) < 4 or not all(part.isdigit() for part in parts[:3]):
        return False  # not ours to judge
    namespace, pid, started = parts[:3]
    if int(namespace) != os.stat("/proc/self/ns/pid").st_ino:
        return False  # its pid means another process here
    return _start_ticks(int(pid)) != int(started)  # gone (None), or the pid now names another process


def _start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (/proc/PID/stat field 22), or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            after_name = handle.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(after_name[19])  # field 22, counting from the state (field 3)
