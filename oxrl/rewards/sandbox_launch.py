"""Starting and stopping a sandboxed program so that nothing it starts outlives its call.

bwrap runs the program as the init of a new PID namespace (`--as-pid-1`); when that init dies,
the kernel kills every other process in the namespace and waits for them before the init is
reaped. `launch_bwrap` starts bwrap with `--info-fd` (bwrap writes there the host pid of that
init) and `--block-fd` (the init, its namespaces and mounts set up, waits there before its seccomp
filter and the program until a byte arrives), opens a pidfd on the init, lets `attach` move it
into the call's cgroups, and only then releases it. `wait_then_kill` waits up to the wall-clock
limit for the launched process, then SIGKILLs the init through its pidfd (a pidfd names one
process for good: a pid number could by then be another's) and the process group the launched
process leads.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Launched:
    process: subprocess.Popen  # bwrap (or, with isolation "none", the interpreter itself)
    init_pidfd: int | None = None  # the PID namespace's init; None when there is none (or it never started)

    def close(self) -> None:
        if self.init_pidfd is not None:
            os.close(self.init_pidfd)
            self.init_pidfd = None


def launch_bwrap(command: list[str], attach: Callable[[int], None], timeout: float, **popen: object) -> Launched:
    """Start `command` (bwrap and its arguments) held before exec, `attach` its init, then let it run.

    `popen` goes to `subprocess.Popen` (`pass_fds` included). If bwrap says nothing within
    `timeout` seconds, or fails before starting the program, it is killed and the program never
    runs; `wait_then_kill` then reports what bwrap said.
    """
    info_read, info_write = os.pipe()
    block_read, block_write = os.pipe()
    pass_fds = (*popen.pop("pass_fds", ()), info_write, block_read)
    try:
        process = subprocess.Popen(
            [command[0], "--info-fd", str(info_write), "--block-fd", str(block_read), *command[1:]],
            pass_fds=pass_fds, start_new_session=True, close_fds=True, **popen,
        )
    except BaseException:
        for fd in (info_read, block_write):
            os.close(fd)
        raise
    finally:
        os.close(info_write)
        os.close(block_read)
    launched = Launched(process)
    try:
        pid = _child_pid(info_read, time.monotonic() + timeout)
        launched.init_pidfd = None if pid is None else _pin(pid, process.pid)
        if launched.init_pidfd is None:
            _kill(launched)  # whatever bwrap got to, it must not run the program unattached
        else:
            attach(pid)
            os.write(block_write, b"\n")
    except BaseException:
        _kill(launched)  # before block_write closes: end-of-file there would release the program too
        process.wait()
        launched.close()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:  # pipes to a program that never ran: nobody will read them
                stream.close()
        raise
    finally:
        os.close(info_read)
        os.close(block_write)
    return launched


def _child_pid(info_fd: int, deadline: float) -> int | None:
    """The init's host pid from bwrap's --info-fd JSON; None if bwrap closed it without one or timed out."""
    data = b""
    poller = select.poll()
    poller.register(info_fd, select.POLLIN)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(math.ceil(remaining * 1000)):
            return None
        chunk = os.read(info_fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None  # bwrap failed before it cloned the init: its stderr says why


def _pin(pid: int, parent: int) -> int | None:
    """A pidfd on `pid` if it is still `parent`'s child (not a reused pid), else None."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None  # the init died during bwrap's setup
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            ppid = next((line.split()[1] for line in handle if line.startswith("PPid:")), None)
        # The pidfd was open when the status was read: if the process is alive now, the status was its.
        signal.pidfd_send_signal(pidfd, 0)
    except (ProcessLookupError, FileNotFoundError):
        ppid = None
    if ppid != str(parent):
        os.close(pidfd)
        return None
    return pidfd


def wait_then_kill(launched: Launched, timeout: float) -> bool:
    """Wait up to `timeout` s for the launched process, then SIGKILL what is left; True when it timed out.

    The wait watches a pidfd of the launched process: it wakes at its exit, not at a polling tick.
    Until `process.wait()` reaps it, its pid, hence its process group id, cannot be reused, so the
    `killpg` can only hit processes it started.
    """
    pidfd = os.pidfd_open(launched.process.pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        timed_out = not poller.poll(math.ceil(max(timeout, 0.0) * 1000))
    finally:
        os.close(pidfd)
    _kill(launched)
    launched.process.wait()
    launched.close()
    return timed_out


def _kill(launched: Launched) -> None:
    if launched.init_pidfd is not None:
        try:
            signal.pidfd_send_signal(launched.init_pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it has already ended, and with it its namespace
    try:
        os.killpg(launched.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is already empty
