"""The code sandbox: limits, fail-closed behaviour, the `isolation` switch. Escapes: test_sandbox_escapes.py."""

from __future__ import annotations

import logging
import os
import socket
import stat
import time
import uuid
from pathlib import Path

import pytest

from oxrl.rewards import sandbox
from oxrl.rewards.code_reward import code_reward
from oxrl.rewards.combine import build_reward_fn
from oxrl.rewards.sandbox import KernelBounds, SandboxLimits, SandboxUnavailableError, require_sandbox, run_python
from oxrl.rewards.sandbox_cgroup import CGROUP_ENV, CgroupSetup, cgroup_setup, find_parents
from oxrl.rewards.sandbox_seccomp import seccomp_program

# Small limits keep every hostile test well under 5 s.
LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=2.0, memory_mb=256)
FAST = {"cpu_seconds": 1, "wall_seconds": 2.0, "memory_mb": 256}


def _sandbox_problem() -> str | None:
    try:
        require_sandbox()
    except SandboxUnavailableError as error:
        return str(error)
    return None


SANDBOX_PROBLEM = _sandbox_problem()
needs_sandbox = pytest.mark.skipif(SANDBOX_PROBLEM is not None, reason=f"no code sandbox here: {SANDBOX_PROBLEM}")


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```"


def score(code: str, tests, **kwargs) -> tuple[float, float]:
    """(score, seconds) of one completion."""
    start = time.monotonic()
    (value,) = code_reward(["p"], [fenced(code)], tests=[tests], **{**FAST, **kwargs})
    return value, time.monotonic() - start


@needs_sandbox
def test_a_correct_program_passes():
    code = "import collections, heapq, math, re, json, fractions, itertools, functools\nn = int(input())\nprint(n * 2)\nexit(0)"
    assert score(code, {"inputs": ["21\n"], "outputs": ["42\n"]})[0] == 1.0


@needs_sandbox
def test_the_program_runs_as_nobody_in_its_own_namespaces():
    result = run_python("import os, socket\nprint(os.getuid(), os.getgid(), os.getpid(), os.getcwd(), socket.gethostname())", limits=LIMITS)
    assert result.ok, result.stderr
    assert result.stdout.split() == ["65534", "65534", "1", "/tmp", "sandbox"]


@needs_sandbox
def test_only_the_standard_library_and_a_fixed_hash_seed():
    assert not run_python("import code_reward", limits=LIMITS).ok  # oxrl's own folder is not on sys.path
    assert not run_python("import numpy", limits=LIMITS).ok  # no site-packages
    program = "print(list({'apple', 'banana', 'cherry', 'damson', 'elder'}))"
    assert run_python(program, limits=LIMITS).stdout == run_python(program, limits=LIMITS).stdout


@needs_sandbox
def test_infinite_loop_is_stopped_by_the_cpu_limit():
    value, seconds = score("while True:\n    pass", {"inputs": [""], "outputs": ["done"]})
    assert value == 0.0 and seconds < 4
    result = run_python("while True:\n    pass", limits=LIMITS)
    assert result.returncode < 0 and not result.timed_out  # a signal, mapped back from bwrap's 128 + N


@needs_sandbox
def test_sleeping_program_is_killed_at_the_wall_clock_timeout():
    result = run_python("import time\ntime.sleep(60)", limits=LIMITS)
    assert result.timed_out and not result.ok and result.elapsed_seconds < 4


@needs_sandbox
def test_fork_bomb_fails_fast():
    value, seconds = score("import os\nwhile True:\n    os.fork()", ["assert True"])
    assert value == 0.0 and seconds < 4
    result = run_python("import os\nos.fork()", limits=LIMITS)
    assert "os.fork is not allowed" in result.stderr
    result = run_python("import subprocess\nsubprocess.run(['true'])", limits=LIMITS)
    assert not result.ok and "not allowed" in result.stderr


@needs_sandbox
def test_memory_bomb_hits_the_memory_limit():
    value, seconds = score("chunks = []\nwhile True:\n    chunks.append(' ' * 10**7)", ["assert True"])
    assert value == 0.0 and seconds < 4
    assert "MemoryError" in run_python("x = bytearray(10**9)", limits=LIMITS).stderr


@needs_sandbox
def test_scratch_space_is_private_and_bounded():
    name = f"oxrl-scratch-{uuid.uuid4().hex}"
    code = f"open('/tmp/{name}', 'w').write('ok')\nprint(open('/tmp/{name}').read())"
    result = run_python(code, limits=LIMITS)
    assert result.ok and result.stdout == "ok\n", result.stderr
    assert not Path("/tmp", name).exists()  # the sandbox's /tmp is its own tmpfs
    # Many files, each under the file-size limit, still cannot fill more than scratch_mb.
    filler = "block = b'x' * (1 << 20)\nfor i in range(64):\n    open(f'/tmp/f{i}', 'wb').write(block)"
    small = SandboxLimits(cpu_seconds=2, wall_seconds=4.0, memory_mb=256, scratch_mb=8)
    result = run_python(filler, limits=small)
    assert not result.ok and "No space left on device" in result.stderr


@needs_sandbox
def test_no_network_even_to_localhost():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
        value, seconds = score(code, {"inputs": [""], "outputs": ["connected"]})
        assert value == 0.0 and seconds < 4
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected


@needs_sandbox
def test_huge_output_is_bounded():
    result = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", limits=LIMITS)
    assert not result.ok and len(result.stdout) <= LIMITS.max_output_bytes and result.elapsed_seconds < 4


@needs_sandbox
def test_parallel_batch_is_deterministic_and_ordered():
    programs = [
        "print(int(input()) + 1)",  # right
        "print(int(input()) + 2)",  # wrong
        "while True:\n    pass",  # times out
        "print(int(input()) + 1)",
        "raise SystemExit(3)",
        "import os\nos.fork()",
    ]
    tests = [{"inputs": ["1\n", "2\n"], "outputs": ["2\n", "3\n"]}] * len(programs)
    completions = [fenced(p) for p in programs]
    limits = {**FAST, "wall_seconds": 1.0}
    first = code_reward(["p"] * len(programs), completions, tests=tests, **limits)
    second = code_reward(["p"] * len(programs), completions, tests=tests, **limits)
    assert first == second == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]


# --- fail closed -------------------------------------------------------------------------------


def test_a_missing_bwrap_is_one_clear_error(monkeypatch):
    with pytest.raises(SandboxUnavailableError) as caught:
        require_sandbox("/nonexistent/oxrl-test/bwrap")
    message = str(caught.value)
    assert "apt-get install bubblewrap" in message and "dnf install bubblewrap" in message
    assert "isolation: none" in message  # and the way out, for trusted code
    # The code reward, and building it from a config, fail the same way before running anything.
    monkeypatch.setattr(sandbox, "BWRAP", "/nonexistent/oxrl-test/bwrap")
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        code_reward(["p"], [fenced("print(1)")], tests=[["assert True"]], **FAST)
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        run_python("print(1)", limits=LIMITS)
    with pytest.raises(SandboxUnavailableError):
        build_reward_fn([{"name": "code", "kwargs": {"cpu_seconds": 2}}])


def test_an_rl_run_without_the_sandbox_stops_before_the_model_loads(tmp_path, monkeypatch, caplog):
    import logging

    import yaml

    from oxrl.cli import main

    monkeypatch.setattr(sandbox, "BWRAP", "/nonexistent/oxrl-test/bwrap")
    config = tmp_path / "code.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"name": "no-sandbox", "output_dir": str(tmp_path / "runs")},
        "model": {"name_or_path": str(tmp_path / "no-such-model")},  # loading it would fail differently
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "rewards": [{"name": "code", "kwargs": {"cpu_seconds": 2, "isolation": "bwrap"}}]},
    }))
    monkeypatch.setattr(logging.getLogger("oxrl"), "handlers", [caplog.handler])  # it does not propagate to root
    assert main(["train", str(config)]) == 2  # an input problem: one message, no traceback
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len({record.getMessage() for record in errors}) == 1 and not any(record.exc_info for record in errors)
    assert "apt-get install bubblewrap" in errors[0].getMessage()
    assert not (tmp_path / "runs" / "no-sandbox" / "config.yaml").exists()


def test_a_bwrap_that_cannot_create_namespaces_reports_what_it_said(tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(SandboxUnavailableError) as caught:
        require_sandbox(str(fake))
    message = str(caught.value)
    assert "setting up uid map: Permission denied" in message and "user namespaces" in message


def test_a_too_old_bwrap_is_refused_with_its_version(tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bubblewrap 0.6.1'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(SandboxUnavailableError, match=r"bubblewrap 0\.6\.1, too old .* needs >= 0\.8"):
        require_sandbox(str(fake))


def test_doctor_says_whether_the_sandbox_works(monkeypatch):
    from oxrl.doctor import _sandbox_lines

    if SANDBOX_PROBLEM is None:
        lines = _sandbox_lines()
        assert lines[0] == "code sandbox   yes" and any("seccomp" in line for line in lines)
        assert [line.split(":")[0].strip() for line in lines if line.strip().startswith(("tasks", "memory", "lifetime"))] == [
            "tasks", "memory", "lifetime"]
    monkeypatch.setattr(sandbox, "BWRAP", "/nonexistent/oxrl-test/bwrap")
    (line,) = _sandbox_lines()
    assert line.startswith("code sandbox   no: code rewards refuse to run") and "apt-get install bubblewrap" in line


def test_isolation_none_runs_without_bwrap_and_warns(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "BWRAP", "/nonexistent/oxrl-test/bwrap")
    sandbox._warn_unsandboxed.cache_clear()
    with caplog.at_level(logging.WARNING, logger="oxrl.rewards.sandbox"):
        result = run_python("print(6 * 7)", limits=SandboxLimits(cpu_seconds=2, wall_seconds=5.0, isolation="none"))
    assert result.ok and result.stdout == "42\n", result.stderr
    assert "UNSAFE" in caplog.text
    (value,) = code_reward(["p"], [fenced("print(int(input()) * 2)")], tests=[{"inputs": ["4\n"], "outputs": ["8\n"]}],
                           cpu_seconds=2, wall_seconds=5.0, isolation="none")
    assert value == 1.0
    build_reward_fn([{"name": "code", "kwargs": {"isolation": "none"}}])  # no probe, no error


def test_an_unknown_isolation_lists_the_allowed_values():
    with pytest.raises(ValueError, match=r"isolation must be one of \['bwrap', 'none'\], got 'docker'"):
        SandboxLimits(isolation="docker")
    with pytest.raises(ValueError, match="reward 'code': isolation must be one of"):
        build_reward_fn([{"name": "code", "kwargs": {"isolation": "bwarp"}}])
    with pytest.raises(ValueError, match="isolation must be one of"):
        code_reward(["p"], [fenced("print(1)")], tests=[["assert True"]], isolation="off")


def test_seccomp_program_shape():
    strict = seccomp_program(allow_new_processes=False, machine="x86_64")
    lenient = seccomp_program(allow_new_processes=True, machine="x86_64")
    threadless = seccomp_program(allow_new_processes=False, allow_threads=False, machine="x86_64")
    assert strict is not None and lenient is not None and threadless is not None
    assert len(strict) % 8 == 0  # struct sock_filter: 8 bytes
    # Refusing processes adds fork and vfork (2 instructions each) and the CLONE_THREAD check (2).
    assert len(strict) - len(lenient) == 6 * 8
    # Refusing threads too: clone is refused outright (2) instead of checked (jump, load, 4 checks, allow).
    assert len(strict) - len(threadless) == (7 - 2) * 8
    assert seccomp_program(allow_new_processes=False, machine="aarch64") is not None
    assert seccomp_program(allow_new_processes=False, machine="riscv64") is None  # undescribed: no filter


def test_max_processes_cannot_exceed_max_tasks():
    with pytest.raises(ValueError, match=r"max_processes \(8\) cannot exceed max_tasks \(4\)"):
        SandboxLimits(max_processes=8, max_tasks=4)
    with pytest.raises(ValueError, match="max_tasks must be positive"):
        SandboxLimits(max_tasks=0)


# --- cgroups: where they come from, and that each call removes its own -----------------------------


def test_cgroup_v1_hierarchies_are_found_under_their_mount(tmp_path):
    mountinfo = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        # a container's view: the hierarchy's root is the container's own cgroup
        "39 31 0:36 /docker/abc /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    proc_cgroup = "8:pids:/docker/abc/trainer\n4:memory:/process_api/f17d\n1:name=systemd:/\n0::/\n"
    assert find_parents(proc_cgroup, mountinfo) == {
        "pids": (1, "/sys/fs/cgroup/pids/trainer"), "memory": (1, "/sys/fs/cgroup/memory/process_api/f17d"),
    }
    # A cgroup outside what the mount shows cannot be used.
    assert find_parents("8:pids:/elsewhere\n", mountinfo) == {}


def test_cgroup_v2_counts_only_where_its_controllers_are_delegated(tmp_path):
    (tmp_path / "trainer").mkdir()
    mountinfo = f"41 31 0:38 / {tmp_path} rw,relatime - cgroup2 cgroup2 rw\n"
    (tmp_path / "trainer" / "cgroup.subtree_control").write_text("cpu memory\n")
    assert find_parents("0::/trainer\n", mountinfo) == {"memory": (2, str(tmp_path / "trainer"))}
    (tmp_path / "trainer" / "cgroup.subtree_control").write_text("cpu pids memory\n")
    assert find_parents("0::/trainer\n", mountinfo) == {
        "pids": (2, str(tmp_path / "trainer")), "memory": (2, str(tmp_path / "trainer")),
    }


def test_a_cgroup_setting_that_cannot_be_used_says_why(tmp_path):
    setup = cgroup_setup(str(tmp_path / "no-such-cgroup"))
    assert setup.parents == {} and set(setup.problems) == {"pids", "memory"}
    assert "no pids controller delegated" in setup.describe()
    assert cgroup_setup("none").problems == {"pids": f"{CGROUP_ENV}=none", "memory": f"{CGROUP_ENV}=none"}


def test_without_a_seccomp_filter_only_cgroups_can_bound_a_program():
    """An undescribed architecture has no filter: SysV memory and, as root, threads would be unbounded."""
    none = CgroupSetup(problems={"pids": "none here", "memory": "none here"})
    with pytest.raises(SandboxUnavailableError, match=r"no seccomp filter .* bound a program's tasks and memory"):
        KernelBounds(none, trainer_is_root=True, seccomp=False).check(SandboxLimits())
    with pytest.raises(SandboxUnavailableError, match=r"bound a program's memory, and there are none"):
        KernelBounds(none, trainer_is_root=False, seccomp=False).check(SandboxLimits())
    memory_only = CgroupSetup(parents={"memory": (1, "/sys/fs/cgroup/memory")}, problems={"pids": "none here"})
    KernelBounds(memory_only, trainer_is_root=False, seccomp=False).check(SandboxLimits())  # RLIMIT_NPROC binds
    KernelBounds(none, trainer_is_root=True, seccomp=True).check(SandboxLimits())  # the filter refuses threads


@needs_sandbox
def test_each_call_removes_its_cgroups():
    setup = cgroup_setup()
    if not setup.parents:
        pytest.skip(f"no cgroups here: {setup.describe()}")
    ours = lambda: [name for _, parent in setup.parents.values() for name in os.listdir(parent)  # noqa: E731
                    if name.startswith(f"oxrl-sandbox-{os.stat('/proc/self/ns/pid').st_ino}-{os.getpid()}-")]
    assert run_python("import time\ntime.sleep(60)", limits=SandboxLimits(cpu_seconds=1, wall_seconds=0.5)).timed_out
    assert run_python("print(1)", limits=LIMITS).ok
    assert ours() == []
