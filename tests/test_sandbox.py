"""Hostile programs in the code sandbox: each fails promptly, and the host is left unharmed."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from oxrl.rewards.code_reward import code_reward
from oxrl.rewards.sandbox import SandboxLimits, network_isolation_prefix, run_python

# Small limits keep every hostile test well under 5 s.
LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=2.0, memory_mb=256)
FAST = {"cpu_seconds": 1, "wall_seconds": 2.0, "memory_mb": 256}


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```"


def score(code: str, tests) -> tuple[float, float]:
    """(score, seconds) of one completion."""
    start = time.monotonic()
    (value,) = code_reward(["p"], [fenced(code)], tests=[tests], **FAST)
    return value, time.monotonic() - start


def test_a_correct_program_passes():
    code = "import collections, heapq, math, re, json, fractions, itertools, functools\nn = int(input())\nprint(n * 2)\nexit(0)"
    assert score(code, {"inputs": ["21\n"], "outputs": ["42\n"]})[0] == 1.0


def test_only_the_standard_library_and_a_fixed_hash_seed():
    assert not run_python("import code_reward", limits=LIMITS).ok  # oxrl's own folder is not on sys.path
    assert not run_python("import numpy", limits=LIMITS).ok  # no site-packages
    program = "print(list({'apple', 'banana', 'cherry', 'damson', 'elder'}))"
    assert run_python(program, limits=LIMITS).stdout == run_python(program, limits=LIMITS).stdout


def test_infinite_loop_is_stopped_by_the_cpu_limit():
    value, seconds = score("while True:\n    pass", {"inputs": [""], "outputs": ["done"]})
    assert value == 0.0 and seconds < 4


def test_sleeping_program_is_killed_at_the_wall_clock_timeout():
    result = run_python("import time\ntime.sleep(60)", limits=LIMITS)
    assert result.timed_out and not result.ok and result.elapsed_seconds < 4


def test_fork_bomb_fails_fast():
    value, seconds = score("import os\nwhile True:\n    os.fork()", ["assert True"])
    assert value == 0.0 and seconds < 4
    result = run_python("import os\nos.fork()", limits=LIMITS)
    assert "os.fork is not allowed" in result.stderr
    result = run_python("import subprocess\nsubprocess.run(['true'])", limits=LIMITS)
    assert not result.ok and "not allowed" in result.stderr


def test_memory_bomb_hits_the_memory_limit():
    value, seconds = score("chunks = []\nwhile True:\n    chunks.append(' ' * 10**7)", ["assert True"])
    assert value == 0.0 and seconds < 4
    assert "MemoryError" in run_python("x = bytearray(10**9)", limits=LIMITS).stderr


def test_writes_outside_the_sandbox_are_refused(tmp_path):
    outside = tmp_path / "outside.txt"
    in_home = Path.home() / f"oxrl-sandbox-probe-{uuid.uuid4().hex}.txt"
    try:
        for target in (outside, in_home):
            code = f"with open({str(target)!r}, 'w') as f:\n    f.write('pwned')\nprint('written')"
            value, seconds = score(code, {"inputs": [""], "outputs": ["written"]})
            assert value == 0.0 and seconds < 4
            assert not target.exists()
        removal = run_python(f"import os\nos.remove({str(tmp_path / 'kept.txt')!r})", limits=LIMITS)
        assert not removal.ok
    finally:
        in_home.unlink(missing_ok=True)


def test_writes_inside_the_sandbox_work_and_the_directory_is_deleted():
    result = run_python("import os\nopen('scratch.txt', 'w').write('ok')\nprint(open('scratch.txt').read(), os.getcwd())", limits=LIMITS)
    assert result.ok, result.stderr
    text, work_dir = result.stdout.split()
    assert text == "ok" and not Path(work_dir).exists()


def test_environment_secrets_are_not_visible(monkeypatch):
    secret = f"hunter2-{uuid.uuid4().hex}"
    monkeypatch.setenv("OXRL_TEST_SECRET", secret)
    code = (
        "import os\n"
        "print(os.environ.get('OXRL_TEST_SECRET', 'absent'))\n"
        "print(open(f'/proc/{os.getppid()}/environ', 'rb').read())\n"  # the trainer's environment
    )
    value, _ = score(code, {"inputs": [""], "outputs": [secret]})
    assert value == 0.0
    result = run_python(code, limits=LIMITS)
    assert secret not in result.stdout and secret not in result.stderr
    assert result.stdout.startswith("absent")


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


def test_network_namespace_alone_blocks_localhost():
    """The OS layer without the audit hook: a plain interpreter inside the namespace cannot connect."""
    prefix = network_isolation_prefix()
    if not prefix:
        pytest.skip("no network namespace on this machine (the audit hook still blocks sockets)")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        code = f"import socket; socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=1)"
        probe = subprocess.run([*prefix, sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=10, check=False)
    assert probe.returncode != 0 and ("unreachable" in probe.stderr or "refused" in probe.stderr)


def test_huge_output_is_bounded():
    result = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", limits=LIMITS)
    assert not result.ok and len(result.stdout) <= LIMITS.max_output_bytes and result.elapsed_seconds < 4


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
