"""Escapes from the code sandbox, tried for real: every one must leave the host as it was.

Each hostile program first switches the Python audit hook off (UNHOOK), so what is tested is the
kernel boundary (bubblewrap's namespaces and mounts, the seccomp filter, the limits), not the hook.
A program prints "contained" when it reaches its end with every attempt refused, "escaped" as soon
as one worked; scored through `code_reward` against the expected output "escaped", it gets 0.0.
After each program the `host` fixture checks that the trainer (this pytest process) and a victim
process of the same user are alive, that nothing was written outside (a sentinel folder, the home
directory, /dev/shm) and that no process the program started is left.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import oxrl
from oxrl.rewards.code_reward import code_reward
from oxrl.rewards.sandbox import SandboxLimits, SandboxResult, run_python
from oxrl.rewards.sandbox_seccomp import ARCHES
from tests.test_sandbox import FAST, LIMITS, fenced, needs_sandbox

pytestmark = needs_sandbox

# Switches the audit hook of sandbox_child.py off, the two ways a program can: rebinding the
# module's globals, and replacing `deny` in the hook's closure cells (found through gc).
UNHOOK = """
import gc as _gc, sys as _sys
_child = _sys.modules["__main__"]
_child.FORBIDDEN_EVENTS = _child.FORBIDDEN_IMPORTS = _child.PATH_EVENTS = frozenset()
for _f in _gc.get_objects():
    if type(_f).__name__ == "function" and _f.__name__ == "hook" and _f.__closure__:
        for _cell in _f.__closure__:
            if getattr(_cell.cell_contents, "__name__", "") == "deny":
                _cell.cell_contents = lambda *args, **kwargs: None
"""
REPORT = "\nprint('escaped' if hits else 'contained')\n"


@dataclass
class Host:
    marker: str  # in the name of everything a hostile program creates, and in its daemons' command lines
    secret: str  # in the trainer's environment and in a file the trainer has open
    sentinel: Path  # a folder outside the sandbox that must stay as it is
    home_file: Path  # created in the user's home before the program runs: it must not see it
    victim: subprocess.Popen  # another process of the trainer's user: it must survive
    shm_victim: str  # a file in the host's /dev/shm that the program tries to delete

    def constants(self) -> str:
        """Python assignments that tell a hostile program what to aim at."""
        values = {
            "MARK": self.marker, "SECRET": self.secret, "SENTINEL": str(self.sentinel), "HOME": str(Path.home()),
            "HOME_FILE": self.home_file.name, "TRAINER": os.getpid(), "VICTIM": self.victim.pid,
            "SHM_VICTIM": self.shm_victim, "REPO": str(Path(oxrl.__file__).resolve().parents[1]),
            "STDLIB": os.path.dirname(os.__file__), "EXECUTABLE": os.path.realpath(sys.executable),
        }
        return "".join(f"{name} = {value!r}\n" for name, value in values.items())


def processes_with(marker: str) -> list[str]:
    """Command lines of the host's processes that contain `marker` (a /proc scan, no psutil)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # the process ended while we looked
        if marker in cmdline:
            found.append(f"{entry}: {cmdline}")
    return found


@pytest.fixture
def host(tmp_path, monkeypatch):
    marker = f"oxrl-escape-{uuid.uuid4().hex[:12]}"
    secret = f"hunter2-{uuid.uuid4().hex}"
    monkeypatch.setenv("OXRL_TEST_SECRET", secret)
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (sentinel / "kept.txt").write_text("kept")
    home_file = Path.home() / f"{marker}-visible.txt"
    home_file.write_text(secret)
    shm_victim = f"{marker}-victim"
    Path("/dev/shm", shm_victim).write_text("kept")
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield Host(marker, secret, sentinel, home_file, victim, shm_victim)
        assert victim.poll() is None, "the victim process was killed"
        assert sorted(p.name for p in sentinel.iterdir()) == ["kept.txt"] and (sentinel / "kept.txt").read_text() == "kept"
        assert sorted(p.name for p in Path.home().iterdir() if marker in p.name) == [home_file.name]
        assert sorted(name for name in os.listdir("/dev/shm") if marker in name) == [shm_victim]
        assert Path("/dev/shm", shm_victim).read_text() == "kept"
        deadline = time.monotonic() + 3  # processes of a killed namespace are reaped within moments
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker) == []
    finally:
        victim.kill()
        victim.wait()
        home_file.unlink(missing_ok=True)
        Path("/dev/shm", shm_victim).unlink(missing_ok=True)


def contained(host: Host, attempts: str, limits: SandboxLimits = LIMITS) -> SandboxResult:
    """Run the hostile `attempts` (which append to `hits` on success) unhooked; assert that all failed."""
    program = UNHOOK + host.constants() + "hits = []\n" + attempts + REPORT
    (value,) = code_reward(["p"], [fenced(program)], tests=[{"inputs": [""], "outputs": ["escaped"]}], **FAST)
    assert value == 0.0
    result = run_python(program, limits=limits)
    assert result.ok and result.stdout.rstrip().endswith("contained"), (result.stdout, result.stderr)
    assert host.secret not in result.stdout + result.stderr
    return result


def test_unhook_really_switches_the_audit_hook_off():
    """Otherwise the tests below would test the hook, not the kernel."""
    assert "not allowed" in run_python("import ctypes", limits=LIMITS).stderr
    result = run_python(UNHOOK + "import ctypes\nopen('/tmp/x', 'w').write('x')\nprint('hook off')", limits=LIMITS)
    assert result.ok and result.stdout == "hook off\n", result.stderr


# --- the five escapes that got past the audit-hook sandbox ---------------------------------------


def test_escape_1_pidfd_signals_reach_no_host_process(host):
    contained(host, """
import os, signal
for pid in {os.getppid(), TRAINER, VICTIM}:
    try:
        signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGKILL)
        hits.append(pid)
    except OSError as error:
        print(pid, error)
for pid in (TRAINER, VICTIM):
    try:
        os.kill(pid, signal.SIGKILL)
        hits.append(pid)
    except OSError as error:
        print(pid, error)
""")


def test_escape_2_dir_fd_walk_reaches_only_the_sandbox_root(host):
    result = contained(host, """
import os
os.mkdir("sub")
fd = os.open("sub", os.O_RDONLY)
for _ in range(64):
    parent = os.open("..", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = parent
print(sorted(os.listdir(fd)))
for path in (f"proc/{TRAINER}/environ", "proc/1/environ", "proc/self/environ"):
    try:
        if SECRET.encode() in os.read(os.open(path, os.O_RDONLY, dir_fd=fd), 1 << 20):
            hits.append(path)
    except OSError as error:
        print(path, error)
for path in (SENTINEL + "/pwned", HOME + "/" + MARK + "-pwned", HOME + "/" + HOME_FILE):
    try:
        os.close(os.open(path.lstrip("/"), os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        hits.append(path)
    except OSError as error:
        print(path, error)
""")
    assert "'sandbox'" in result.stdout and "'home'" not in result.stdout  # the sandbox's own root


def test_escape_3_without_the_hook_the_kernel_still_refuses(host, tmp_path):
    with socket.socket(socket.AF_UNIX) as listening, socket.socket(socket.AF_UNIX) as abstract:
        listening.bind(str(tmp_path / "host.sock"))
        listening.listen()
        abstract.bind(f"\0{host.marker}")
        abstract.listen()
        contained(host, f"""
import ctypes, os, socket, sys
try:
    if os.fork() == 0:
        os._exit(0)
    hits.append("fork")
except OSError as error:
    print("fork", error)
for address in ({str(tmp_path / "host.sock")!r}, "\\0" + MARK):
    try:
        socket.socket(socket.AF_UNIX).connect(address)
        hits.append(address)
    except OSError as error:
        print(address, error)
for path in (SENTINEL + "/pwned", HOME + "/" + MARK + "-pwned", "/usr/" + MARK, STDLIB + "/" + MARK + ".py", EXECUTABLE):
    try:
        open(path, "a").write("pwned")
        hits.append(path)
    except OSError as error:
        print(path, error)
""")


@pytest.mark.parametrize("ends", ["by itself", "at the timeout"])
def test_escape_3_a_double_forked_daemon_dies_with_the_sandbox(host, ends):
    """With processes allowed (and the hook off), a setsid daemon still cannot outlive its run."""
    daemon = "import os, time\nopen('/tmp/alive', 'w').close()\ntime.sleep(600)  # " + host.marker
    program = UNHOOK + f"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-S", "-c", {daemon!r}])
    os._exit(0)
deadline = time.monotonic() + 3
while not os.path.exists("/tmp/alive") and time.monotonic() < deadline:
    time.sleep(0.02)
print("daemon started" if os.path.exists("/tmp/alive") else "no daemon", flush=True)
if {ends == "at the timeout"}:
    time.sleep(60)
"""
    limits = SandboxLimits(cpu_seconds=2, wall_seconds=4.0, memory_mb=256, max_processes=4)
    result = run_python(program, limits=limits)
    assert result.stdout == "daemon started\n", result.stderr
    assert result.timed_out == (ends == "at the timeout")
    # The `host` fixture then checks that no process with the marker is left.


def test_escape_3_the_kernel_refuses_new_processes_by_default(host):
    contained(host, """
import os, subprocess, time
children = 0
for _ in range(50):  # bounded: if the kernel let it through, this is 50 processes, not a bomb
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
    except OSError as error:
        print("fork", error)
        break
try:
    subprocess.run(["/bin/true"])
    hits.append("subprocess")
except OSError as error:
    print("subprocess", error)
if children:
    hits.append(children)
""")


def test_escape_4_shared_memory_stays_in_the_sandbox(host):
    contained(host, """
import _posixshmem, os
try:
    _posixshmem.shm_unlink("/" + SHM_VICTIM)
    hits.append("deleted a host file")
except OSError as error:
    print("unlink", error)
fd = _posixshmem.shm_open("/" + MARK, os.O_CREAT | os.O_RDWR, 0o600)  # the sandbox's own /dev/shm
os.write(fd, b"x")
print(os.listdir("/dev/shm"))
""")


def test_escape_5_home_and_repository_are_not_there(host):
    contained(host, """
import os
for directory, telltale in ((HOME, HOME_FILE), (REPO, "pyproject.toml"), (REPO + "/oxrl", "rewards")):
    try:
        names = os.listdir(directory)
        print(directory, names)
        if telltale in names:
            hits.append(directory)
    except OSError as error:
        print(directory, error)
try:
    hits.append(open(HOME + "/" + HOME_FILE).read())
except OSError as error:
    print(error)
""")


# --- other ways out ----------------------------------------------------------------------------


def test_environment_secrets_are_not_visible(host):
    contained(host, """
import os
hits += [name for name, value in os.environ.items() if SECRET in value]
for path in ("/proc/self/environ", "/proc/1/environ", f"/proc/{TRAINER}/environ"):
    try:
        if SECRET.encode() in open(path, "rb").read():
            hits.append(path)
    except OSError as error:
        print(path, error)
""")


def test_the_trainers_open_files_are_not_inherited(host, tmp_path):
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(host.secret)
    fd = os.open(secret_file, os.O_RDONLY)
    os.set_inheritable(fd, True)
    try:
        result = contained(host, """
import os
open_fds = []
for fd in range(3, 256):
    try:
        os.fstat(fd)
        open_fds.append(fd)
        if SECRET.encode() in os.pread(fd, 1 << 16, 0):
            hits.append(fd)
    except OSError:
        pass
print("open:", open_fds)
""")
    finally:
        os.close(fd)
    assert result.stdout.startswith("open: []")  # beyond stdin, stdout and stderr


def test_the_program_has_no_capabilities(host):
    """bwrap run by root keeps every capability unless told to drop them: a regression guard (read without /proc)."""
    contained(host, """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; twice (capabilities 0-31, 32-63)
assert libc.capget(header, data) == 0, ctypes.get_errno()
bounding = [cap for cap in range(64) if libc.prctl(23, cap, 0, 0, 0) == 1]  # PR_CAPBSET_READ
ambient = [cap for cap in range(64) if libc.prctl(47, 2, cap, 0, 0) == 1]  # PR_CAP_AMBIENT_IS_SET
print(list(data), bounding, ambient)
if any(data) or bounding or ambient:
    hits.append("capabilities")
""")


def test_only_its_own_process_is_visible(host):
    contained(host, """
import os, signal
print(os.getpid(), os.getppid())
if os.getpid() != 1 or os.getppid() != 0:
    hits.append("not the init of its own PID namespace")
for pid in (*range(2, 64), TRAINER, VICTIM):
    try:
        os.kill(pid, 0)
        hits.append(pid)
    except ProcessLookupError:
        pass
""")


@pytest.mark.parametrize("attempt", ["read_secrets", "write_the_interpreter", "kernel_calls", "kill_everyone", "host_inodes"])
def test_break_out_attempts_fail(host, attempt):
    machine = platform.machine()
    keyctl = ARCHES[machine].syscalls["keyctl"] if machine in ARCHES else -1
    host_nodes = [(os.stat(path).st_dev, os.stat(path).st_ino) for path in ("/dev/null", "/dev/urandom")]
    modes = {path: os.stat(path).st_mode for path in ("/dev/null", "/dev/urandom")}
    attempts = {
        "read_secrets": """
for path in ("/etc/shadow", "/etc/passwd", "/root/.bashrc", "/root/.ssh/id_rsa", HOME + "/.cache", "/proc/kcore"):
    try:
        open(path, "rb").read(16)
        hits.append(path)
    except OSError as error:
        print(path, error)
""",
        "write_the_interpreter": """
import os
for path in (STDLIB + "/os.py", STDLIB + "/" + MARK + ".py", os.path.dirname(EXECUTABLE) + "/" + MARK, "/sandbox/solution.py", "/" + MARK):
    try:
        open(path, "a").write("pwned")
        hits.append(path)
    except OSError as error:
        print(path, error)
""",
        "kernel_calls": f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
calls = {{
    "ptrace attach": lambda: libc.ptrace(16, TRAINER, 0, 0),
    "mount": lambda: libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None),
    "unshare user": lambda: libc.unshare(0x10000000),
    "keyctl": lambda: libc.syscall({keyctl}, 0, -3),  # read the session keyring's id
}}
for name, call in calls.items():
    if call() != -1:
        hits.append(name)
    print(name, os.strerror(ctypes.get_errno()))
""",
        "kill_everyone": """
import os, signal
try:
    os.kill(-1, signal.SIGKILL)
except OSError as error:
    print("kill -1", error)
""",
        "host_inodes": f"""
import os
for path in ("/proc/sys/kernel/hostname", "/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger"):
    try:
        os.close(os.open(path, os.O_WRONLY))
        hits.append(path)
    except OSError as error:
        print(path, error)
host_nodes = {host_nodes!r}  # (st_dev, st_ino) of the host's nodes
for path in ("/dev/null", "/dev/urandom"):
    try:
        os.chmod(path, 0o600)  # harmless on a private node; on a host inode it changes the host
        if (os.stat(path).st_dev, os.stat(path).st_ino) in host_nodes:
            hits.append("chmod of the host's " + path)
    except OSError as error:
        print(path, error)
""",
    }
    contained(host, attempts[attempt])
    assert {path: os.stat(path).st_mode for path in modes} == modes
