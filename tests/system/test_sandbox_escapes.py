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

import errno
import os
import platform
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import oxrl
from oxrl.rewards.code_reward import code_reward
from oxrl.rewards.sandbox import SandboxLimits, SandboxResult, SandboxUnavailableError, run_python
from oxrl.rewards.sandbox_cgroup import CGROUP_ENV, cgroup_setup, remove_stale_cgroups
from oxrl.rewards.sandbox_seccomp import ARCHES
from tests.system.test_sandbox import FAST, LIMITS, fenced, needs_sandbox

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


def contained(host: Host, attempts: str, limits: SandboxLimits = LIMITS, then: str = "") -> SandboxResult:
    """Run the hostile `attempts` (which append to `hits` on success) unhooked; assert that all failed. `then`:
    code after the report."""
    program = UNHOOK + host.constants() + "hits = []\n" + attempts + REPORT + then
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


def fork_loop(attempts: int) -> str:
    """Program text: fork sleeping children until the kernel refuses, at most `attempts` (a bound, not a bomb)."""
    return f"""
import os, time
children = 0
for _ in range({attempts}):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
    except OSError as error:
        print("fork", error.strerror)
        break
"""


def test_escape_3_the_kernel_refuses_new_processes_by_default(host):
    contained(host, fork_loop(50) + """
import subprocess
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
try:
    os.chmod("/dev/stdin", 0o4777)  # the input: a file of the trainer's, bound read-only
    hits.append("chmod /dev/stdin")
except OSError as error:
    print("/dev/stdin", error)
""",
    }
    contained(host, attempts[attempt])
    assert {path: os.stat(path).st_mode for path in modes} == modes


# --- the kernel bounds every call: lifetime, memory, tasks, sockets, devices, /proc -----------------
# Each runs with the call's cgroups ("auto") and with none (OXRL_SANDBOX_CGROUP=none), the fallback.

ROOT = os.getuid() == 0
CLONE_THREAD_FLAGS = 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x40000  # VM FS FILES SIGHAND THREAD SYSVSEM


@pytest.fixture(params=["auto", "none"])
def cgroups(request, monkeypatch) -> str:
    monkeypatch.setenv(CGROUP_ENV, request.param)
    if request.param == "auto" and not cgroup_setup().bounds("pids"):
        pytest.skip(f"no cgroups here: {cgroup_setup().describe()}")
    return request.param


def rexec_with_marker(host: Host, code: str) -> str:
    """A program that replaces itself (it is PID 1: no fork needed) by `code` with the marker in its command line."""
    return UNHOOK + f"""
import os, sys
os.execv(sys.executable, [sys.executable, "-S", "-c", {code!r}, {host.marker!r}])
"""


PDEATHSIG_CLEARER = """
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
refused = libc.prctl(1, 0, 0, 0, 0) == -1  # PR_SET_PDEATHSIG, 0: clear the signal bwrap set
signal_now = ctypes.c_int()
libc.prctl(2, ctypes.byref(signal_now), 0, 0, 0)  # PR_GET_PDEATHSIG
print("refused" if refused else "cleared", signal_now.value, flush=True)
open("/tmp/ready", "w").write(f"{'refused' if refused else 'cleared'} {signal_now.value}")
time.sleep(600)
"""


def test_finding_4_a_program_that_clears_its_parent_death_signal_dies_at_the_timeout(host, cgroups):
    limits = SandboxLimits(cpu_seconds=2, wall_seconds=1.5, memory_mb=256)
    result = run_python(rexec_with_marker(host, PDEATHSIG_CLEARER), limits=limits)
    assert result.timed_out and result.returncode == -9
    assert result.stdout == "refused 9\n", result.stderr  # SIGKILL stays set
    # The `host` fixture then checks that no process with the marker is left.


def test_finding_4_the_program_dies_with_the_trainer(host, cgroups, tmp_path):
    """kill -9 of the trainer (a wrapper process standing in for it) kills the sandboxed program too."""
    program = rexec_with_marker(host, PDEATHSIG_CLEARER)
    trainer = subprocess.Popen(
        [sys.executable, "-c", "import sys; from oxrl.rewards.sandbox import SandboxLimits, run_python; "
         "run_python(sys.argv[1], limits=SandboxLimits(cpu_seconds=60, wall_seconds=60.0, memory_mb=256))", program],
        cwd=Path(oxrl.__file__).resolve().parents[1],
        env={**os.environ, "TMPDIR": str(tmp_path)},  # the killed trainer cannot remove its call's folder
    )
    try:
        deadline = time.monotonic() + 20
        while not ready(host.marker) and time.monotonic() < deadline and trainer.poll() is None:
            time.sleep(0.02)
        assert ready(host.marker) == ["refused 9"], "the program never got past its prctl"
    finally:
        trainer.kill()
        trainer.wait()
    deadline = time.monotonic() + 5
    while processes_with(host.marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(host.marker) == []
    # The dead trainer's cgroups are left behind, emptied; the next trainer's setup removes them.
    setup = cgroup_setup()
    parents = {parent for _, parent in setup.parents.values()}
    left = lambda: [name for parent in parents for name in os.listdir(parent) if f"-{trainer.pid}-" in name]  # noqa: E731
    assert len(left()) == len(parents)
    remove_stale_cgroups(setup)
    assert left() == []


def ready(marker: str) -> list[str]:
    """What the marked programs wrote to their /tmp/ready, read through /proc/PID/root (the trainer is their root)."""
    said = []
    for line in processes_with(marker):
        try:
            said.append(Path("/proc", line.split(":")[0], "root/tmp/ready").read_text())
        except OSError:
            continue  # not written yet, or the process ended
    return said


def test_finding_5_sysv_shared_memory_is_refused_and_host_memory_is_unchanged(host, cgroups):
    before = shared_memory_kib()
    result = contained(host, """
import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
segment = libc.shmget(0, 1 << 30, 0o1600)  # IPC_PRIVATE, 1 GiB, IPC_CREAT | 0600
print("shmget", segment, os.strerror(ctypes.get_errno()))
if segment != -1:
    address = libc.shmat(segment, None, 0)
    if address not in (None, ctypes.c_void_p(-1).value):
        ctypes.memset(address, 1, 1 << 30)  # touch it: the pages are allocated now
        hits.append("1 GiB of SysV shared memory")
for name, call in (("semget", lambda: libc.semget(0, 4, 0o1600)), ("msgget", lambda: libc.msgget(0, 0o1600))):
    if call() != -1:
        hits.append(name)
""", limits=SandboxLimits(cpu_seconds=2, wall_seconds=4.0, memory_mb=256))
    assert "shmget -1 Operation not permitted" in result.stdout
    assert shared_memory_kib() - before < 256 << 10  # other tests may add some; 1 GiB would show


def shared_memory_kib() -> int:
    """The host's shared memory (tmpfs, SysV and memfd pages) in KiB, from /proc/meminfo."""
    with open("/proc/meminfo", encoding="ascii") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("Shmem:"))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the raw clone below is written for x86-64")
def test_finding_6_raw_clone_thread_storm_is_bounded(host, cgroups):
    """3,000 clone(CLONE_THREAD) in 0.15 s without a bound: at most max_tasks now, or none (root, no cgroup)."""
    result = contained(host, f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
pause = ctypes.cast(libc.pause, ctypes.c_void_p).value
stacks, started, error = [], 0, 0
for _ in range(200):  # bounded: if the kernel let them through, 200 threads, not a storm
    stack = ctypes.create_string_buffer(1 << 16)
    top = (ctypes.addressof(stack) + (1 << 16) - 64) & ~15
    ctypes.c_void_p.from_address(top).value = pause  # the new thread "returns" from syscall() into pause()
    stacks.append(stack)
    if libc.syscall(56, {CLONE_THREAD_FLAGS}, ctypes.c_void_p(top), None, None, None) <= 0:  # SYS_clone
        error = ctypes.get_errno()
        break
    started += 1
print("started", started, os.strerror(error))
if started >= 32:  # max_tasks, the program included
    hits.append(started)
""", limits=SandboxLimits(cpu_seconds=2, wall_seconds=4.0, memory_mb=256),
        # The raw threads sleep on ctypes buffers that the interpreter frees as it shuts down, and one woken then
        # would crash the program (SIGSEGV) after its report: end at once instead.
        then="import sys, os\nsys.stdout.flush()\nos._exit(0)\n")
    started = int(result.stdout.split("started ")[1].split()[0])
    if cgroups == "none" and ROOT:
        assert started == 0 and "Operation not permitted" in result.stdout  # the seccomp filter: no clone at all
    else:
        assert started == 31 and "Resource temporarily unavailable" in result.stdout  # pids.max (or RLIMIT_NPROC)


def test_finding_6_python_thread_storm_is_bounded(host, cgroups):
    result = contained(host, """
import threading, time
threading.stack_size(1 << 18)
started = 0
try:
    for _ in range(300):
        threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
        started += 1
except RuntimeError as error:
    print(error)
print("started", started)
if started >= 32:
    hits.append(started)
""", limits=SandboxLimits(cpu_seconds=2, wall_seconds=4.0, memory_mb=2048))
    expected = 0 if cgroups == "none" and ROOT else 31
    assert f"can't start new thread\nstarted {expected}\n" in result.stdout


def test_finding_7_only_unix_sockets(host, cgroups):
    result = contained(host, """
import socket
for family in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, socket.AF_PACKET, 40):  # 40: AF_VSOCK
    try:
        socket.socket(family, socket.SOCK_DGRAM if family == socket.AF_NETLINK else socket.SOCK_STREAM).close()
        hits.append(family)
    except OSError as error:
        print(family, error.errno)
left, right = socket.socketpair()
left.sendall(b"unix ok")
print(right.recv(16).decode())
server = socket.socket(socket.AF_UNIX)
server.bind("/tmp/unix.sock")
""")
    assert result.stdout.count(f" {errno.EAFNOSUPPORT}\n") == 5 and "unix ok" in result.stdout


HONEST_DEVICES = """
import os, sys
sys.stderr = open(os.devnull, "w")
print("debugging noise", file=sys.stderr)
with open("/dev/zero", "rb") as zero, open("/dev/urandom", "rb") as urandom:
    assert zero.read(4) == bytes(4) and len(urandom.read(16)) == 16
with open(os.devnull, "wb") as null:
    null.write(b"x" * 100)
print(int(open("/dev/stdin").read()) * 2)
"""


def test_finding_8_an_honest_program_may_use_dev_null_zero_urandom_and_stdin(cgroups):
    (value,) = code_reward(["p"], [fenced(HONEST_DEVICES)], tests=[{"inputs": ["21\n"], "outputs": ["42\n"]}], **FAST)
    assert value == 1.0, run_python(HONEST_DEVICES, stdin="21\n", limits=LIMITS).stderr
    # /dev itself is read-only: nothing can be added to it.
    result = run_python(UNHOOK + "open('/dev/new', 'w')", limits=LIMITS)
    assert "Read-only file system" in result.stderr


def test_finding_9_no_proc_no_sys(host, cgroups):
    contained(host, """
import os
for path in ("/proc/self/mountinfo", "/proc/1/mountinfo", "/proc/mounts", "/proc/cmdline", "/proc/slabinfo",
             "/proc/timer_list", "/proc/vmallocinfo", "/proc/keys", "/sys/fs/cgroup/pids/pids.max", "/sys/kernel/notes"):
    try:
        open(path, "rb").read(16)
        hits.append(path)
    except OSError as error:
        print(path, error.strerror)
for folder in ("/proc", "/sys"):
    try:
        hits.append((folder, os.listdir(folder)))
    except OSError as error:
        print(folder, error.strerror)
import ctypes
log = ctypes.create_string_buffer(1 << 12)
if ctypes.CDLL(None).klogctl(3, log, 1 << 12) >= 0:  # the kernel log (SYSLOG_ACTION_READ_ALL)
    hits.append("dmesg")
""")


# --- the fallbacks without cgroups, and attacks of our own ---------------------------------------


def test_without_cgroups_a_root_trainer_refuses_more_processes_clearly(monkeypatch):
    if not ROOT:
        pytest.skip("RLIMIT_NPROC binds a trainer that is not root: processes are allowed")
    monkeypatch.setenv(CGROUP_ENV, "none")
    with pytest.raises(SandboxUnavailableError, match=rf"max_processes=4\) needs a pids cgroup .*{CGROUP_ENV}"):
        run_python("print(1)", limits=SandboxLimits(max_processes=4))
    from oxrl.doctor import _sandbox_lines

    lines = "\n".join(_sandbox_lines())
    assert "tasks: NO pids cgroup" in lines and "refuses every thread and process" in lines
    assert "memory: RLIMIT_AS per process" in lines
    assert run_python("print('still runs')", limits=LIMITS).stdout == "still runs\n"


def test_an_unknown_cgroup_setting_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(CGROUP_ENV, "sometimes")
    with pytest.raises(ValueError, match=rf"{CGROUP_ENV} must be 'auto', 'none' or an absolute path .* got 'sometimes'"):
        run_python("print(1)", limits=LIMITS)


def test_a_process_tree_is_bounded_by_the_pids_cgroup_even_as_root(host):
    """max_processes > 1: RLIMIT_NPROC does not bind root; the call's pids cgroup does."""
    if not cgroup_setup().bounds("pids"):
        pytest.skip(f"no pids cgroup here: {cgroup_setup().describe()}")
    result = contained(host, fork_loop(100) + """
print("children", children)
if children >= 8:
    hits.append(children)
""", limits=SandboxLimits(cpu_seconds=2, wall_seconds=4.0, memory_mb=256, max_processes=8, max_tasks=8))
    assert "children 7\n" in result.stdout


def test_the_memory_of_all_processes_is_bounded_together(host):
    """Each process under its RLIMIT_AS, all of them over the call's memory cgroup: some are killed."""
    if not cgroup_setup().bounds("memory"):
        pytest.skip(f"no memory cgroup here: {cgroup_setup().describe()}")
    limits = SandboxLimits(cpu_seconds=4, wall_seconds=8.0, memory_mb=256, scratch_mb=8, max_processes=4)
    result = run_python(UNHOOK + """
import os, time
for _ in range(3):
    if os.fork() == 0:
        block = b"x" * (200 << 20)  # touched: 200 MiB resident, under the 256 MiB address-space limit
        time.sleep(1)
        print("survived", flush=True)
        os._exit(0)
for _ in range(3):
    os.wait()
""", limits=limits)
    assert result.stdout.count("survived") < 3, result  # 600 MiB > 256 + 2 x 8 + 32 MiB


def test_memfd_and_message_queues_are_refused(host, cgroups):
    """Memory RLIMIT_AS does not count when it is not mapped: written to a memfd, or queued."""
    contained(host, """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
try:
    fd = os.memfd_create("hoard")
    os.write(fd, b"x" * (1 << 20))
    hits.append("memfd")
except OSError as error:
    print("memfd", error.strerror)
if libc.mq_open(b"/hoard", os.O_CREAT | os.O_RDWR, 0o600, None) != -1:
    hits.append("mq_open")
""")


def test_a_thread_that_outlives_the_main_thread_still_dies_at_the_timeout(host, cgroups):
    """The init's main thread exits alone (SYS_exit): its namespace lives on in another thread, until the kill."""
    if platform.machine() not in ARCHES:
        pytest.skip("the raw exit below needs a described architecture")
    if cgroups == "none" and ROOT:
        pytest.skip("no threads without a pids cgroup when the trainer is root")
    exit_thread = {"x86_64": 60, "aarch64": 93}[platform.machine()]
    code = f"""
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(600,)).start()
print("main thread leaves", flush=True)
ctypes.CDLL(None).syscall({exit_thread}, 0)  # SYS_exit: this thread only
"""
    result = run_python(rexec_with_marker(host, code), limits=SandboxLimits(cpu_seconds=2, wall_seconds=1.5))
    assert result.timed_out and result.stdout == "main thread leaves\n", result.stderr


def test_no_mount_lets_a_set_uid_program_clear_the_parent_death_signal(host):
    """Exec of a set-uid file would clear the parent-death signal; every mount is nosuid."""
    contained(host, """
import os
for path in ("/", "/usr", "/tmp", "/dev/shm", "/dev", "/dev/null", "/sandbox", os.path.dirname(os.__file__)):
    if not os.statvfs(path).f_flag & os.ST_NOSUID:
        hits.append(path)
""")


def test_a_crashing_program_cannot_be_dumped_to_a_host_helper(host):
    """Where kernel.core_pattern pipes core dumps to a host helper, RLIMIT_CORE=0 does not stop the kernel from
    starting it as root on a crash: the program is not dumpable, and cannot make itself dumpable again."""
    contained(host, """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(3, 0, 0, 0, 0) != 0:  # PR_GET_DUMPABLE
    hits.append("dumpable")
if libc.prctl(4, 1, 0, 0, 0) == 0 or libc.prctl(3, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 1
    hits.append("made dumpable")
""")


# --- finding 10: the descriptors it inherits, and locks on host files ----------------------------


def test_finding_10_fchmod_of_its_stdio_changes_no_host_file(host, tmp_path, monkeypatch):
    """stdin, stdout and stderr were files of the trainer's call folder: as root, the program could make them
    set-uid and world-writable for the length of the call. Now they are pipes, and /dev/stdin is read-only."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the call folder is made: watched below
    seen: dict[str, int] = {}

    def watch(stop: threading.Event) -> None:
        while not stop.is_set():
            for path in tmp_path.glob("oxrl-sandbox-*/*"):
                try:
                    seen[path.name] = seen.get(path.name, 0) | os.lstat(path).st_mode
                except FileNotFoundError:
                    pass  # the call ended and its folder went
            time.sleep(0.01)

    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stop,))
    watcher.start()
    try:
        result = contained(host, """
import os, stat, time
for fd in (0, 1, 2):
    if stat.S_ISREG(os.fstat(fd).st_mode):
        hits.append(f"fd {fd} is a file")
    os.fchmod(fd, 0o4777)  # a pipe's mode is the pipe's own
with open("/dev/stdin", "rb") as stdin:
    try:
        os.fchmod(stdin.fileno(), 0o4777)
        hits.append("/dev/stdin")
    except OSError as error:
        print("/dev/stdin", error.strerror)
time.sleep(0.5)  # for the watcher
""")
    finally:
        stop.set()
        watcher.join()
    assert "/dev/stdin Read-only file system" in result.stdout
    assert seen and not any(mode & (stat.S_ISUID | stat.S_IWOTH) for mode in seen.values()), seen


def test_finding_10_leases_and_flock_are_refused(host):
    result = contained(host, """
import errno, fcntl, os
F_SETLEASE = 1024
for path in ("/tmp/own.txt", os.__file__):
    if path.startswith("/tmp"):
        open(path, "w").close()
    with open(path, "rb") as handle:
        for name, call in (("flock", lambda: fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)),
                           ("lease", lambda: fcntl.fcntl(handle, F_SETLEASE, fcntl.F_RDLCK))):
            try:
                call()
                hits.append((path, name))
            except OSError as error:
                print(name, errno.errorcode[error.errno])
                if error.errno != errno.EPERM:
                    hits.append((path, name, error.errno))
with open("/tmp/own.txt", "r+b") as handle:
    fcntl.lockf(handle, fcntl.LOCK_EX)  # POSIX record locks stay: sqlite needs them
    print("lockf ok")
""")
    assert result.stdout.count("EPERM") == 4 and "lockf ok" in result.stdout
