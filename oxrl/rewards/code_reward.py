"""`code`: the fraction of a row's tests that the completion's program passes, run in the sandbox.

The program is the completion's last ```python block (0.0 when there is none). The row field
`tests` is one of:

- stdin/stdout pairs: `{"inputs": [...], "outputs": [...]}` (APPS, TACO, PRIME) or
  `[{"input": ..., "output": ...}, ...]`; a test passes when the program exits 0 and its output
  equals the expected one, up to trailing whitespace on each line and trailing blank lines. The
  program never sees the expected output: it is compared here, after the program ended;
- assert-style tests: a list of Python snippets (`["assert add(1, 2) == 3", ...]`, MBPP), each made
  of `import` (standard library) and `assert` statements. They run in a harness the program cannot
  reach (`oxrl.rewards.code_harness`): the program only computes the values the asserts ask of it
  (`add(1, 2)`), in a sandbox that holds no assert and no expected value; the asserts run in another
  sandboxed process, with the real builtins and modules and no program code, against those values
  passed over as plain data. So a program that exits early (`raise SystemExit(0)`, `os._exit(0)`
  in an `atexit` or `sys.excepthook`), reads its caller's frame or its own file, returns an object
  whose `__eq__` is always true, or replaces `math.isclose` or a builtin, gains nothing: a test
  passes only when the checker says so. What it asks of the tests: the values compared must be plain
  data (numbers, strings, bytes, None, the builtin and `collections` containers, `datetime` values,
  `array.array`, and the program's namedtuples and enum members, which cross as their data; not another
  object of the program's class, nor a function), and builtin and standard-library names in a test mean
  those, even where the program defines its own `sum`, except in a test that calls nothing of the
  program but builtins, which tests the program's own functions of those names. A test that calls
  nothing of the program at all, or passes the program's function to a call of its own, is refused
  (`code_harness` says the rest). Another shape is a ValueError naming the item before anything runs;
- a JSON string of either of the above.

A value the program returns whose record would pass the sandbox's `max_output_bytes` (1 MiB: all
that is read back of a run's output) fails the test that needs it; a batch that had such values logs
a warning with their count (a metric would need the reward combiner, which is on every run's path).

Every stdin/stdout test, and the program's part of every assert-style test, runs in its own
sandboxed process (`oxrl.rewards.sandbox`), so one crashing test does not fail the others; a
program's assert-style tests cost one more sandbox run, for the checker. Once a test times out
(wall clock or CPU limit), the program's remaining tests fail without being run: they would almost
surely time out as well, each after the full limit.
Completions are scored in parallel by `max_workers` threads, each driving one subprocess at a time;
results keep the input order, so they are deterministic.

`isolation` (a reward kwarg, `rl.rewards[].kwargs.isolation` in a config): "bwrap", the default,
runs every program in the bubblewrap sandbox and fails closed: where bwrap is missing or cannot
create namespaces, building the reward raises `SandboxUnavailableError` (before the model loads),
saying what to install. "none" runs programs as plain subprocesses with the same limits: UNSAFE for
model-written code, only for trusted code on a machine without bwrap (it logs a warning).
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from oxrl.rewards.base import batched
from oxrl.rewards.code_harness import AssertTest, count_passed, parse_assert_test, stopped_by_limit
from oxrl.data.code_blocks import extract_code
from oxrl.rewards.sandbox import SandboxLimits, require_sandbox, run_python

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CodeTest:
    """A stdin/stdout test."""

    stdin: str
    expected_stdout: str


@batched
def code_reward(
    prompts: list[str],
    completions: list[str],
    *,
    tests: list[Any],
    cpu_seconds: int = 5,
    wall_seconds: float = 10.0,
    memory_mb: int = 512,
    max_workers: int = 2,
    isolation: str = "bwrap",
) -> list[float]:
    limits = SandboxLimits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=memory_mb, isolation=isolation)
    if limits.isolation == "bwrap":
        require_sandbox()  # one clear error before any program runs, not one per worker thread
    # Parse every row's tests before running anything: a malformed row fails fast, whatever the completions.
    parsed = [parse_tests(row_tests) for row_tests in tests]
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="oxrl-code-reward") as pool:
        scored = list(pool.map(lambda item: score_program(*item, limits), zip(completions, parsed)))
    too_large = sum(count for _, count in scored)
    if too_large:  # an honest program's large answer fails its test: say so, or it would look like a wrong one
        logger.warning(
            "code reward: %d value(s) that programs returned were too large to compare (a record over "
            "max_output_bytes, %d bytes); the tests that needed them failed", too_large, limits.max_output_bytes,
        )
    return [score for score, _ in scored]


def check_code_reward(**kwargs: Any) -> None:
    """Check a `code` reward's kwargs and the sandbox it will need, when the reward is built.

    `build_reward_fn` calls this (as `code_reward.preflight`) before anything is trained, so a typo in
    `isolation` or a machine without bubblewrap stops the run before the model loads.
    """
    names = ("cpu_seconds", "wall_seconds", "memory_mb", "isolation")
    try:
        limits = SandboxLimits(**{name: kwargs[name] for name in names if name in kwargs})
    except (TypeError, ValueError) as error:
        raise ValueError(f"reward 'code': {error}") from error
    max_workers = kwargs.get("max_workers", 1)
    if not isinstance(max_workers, int) or max_workers < 1:
        raise ValueError(f"reward 'code': max_workers must be a positive integer, got {max_workers!r}")
    if limits.isolation == "bwrap":
        require_sandbox()


code_reward.preflight = check_code_reward  # type: ignore[attr-defined]


def score_program(completion: str, tests: list[CodeTest] | list[AssertTest], limits: SandboxLimits) -> tuple[float, int]:
    """(the fraction of `tests` passed, how many of the program's values were too large to compare)."""
    program = extract_code(completion)
    if program is None:
        return 0.0, 0
    if isinstance(tests[0], AssertTest):
        passed, too_large = count_passed(program, tests, limits)  # type: ignore[arg-type]
        return passed / len(tests), too_large
    passed = 0
    for test in tests:
        result = run_python(program, stdin=test.stdin, limits=limits)
        if stopped_by_limit(result):
            break
        if result.ok and _same_output(result.stdout, test.expected_stdout):
            passed += 1
    return passed / len(tests), 0


def parse_tests(tests: Any) -> list[CodeTest] | list[AssertTest]:
    """The row's `tests` field as stdin/stdout `CodeTest`s or `AssertTest`s (formats in the module docstring)."""
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as error:
            raise ValueError(f"field 'tests' is a string but not JSON ({error.msg}); expected a list or a dict") from error
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        inputs, outputs = tests["inputs"], tests["outputs"]
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise ValueError("field 'tests': 'inputs' and 'outputs' must be lists of the same length")
        parsed = [CodeTest(stdin=_text(i), expected_stdout=_text(o)) for i, o in zip(inputs, outputs)]
    elif isinstance(tests, list) and all(isinstance(t, dict) for t in tests):
        if not all("input" in t and "output" in t for t in tests):
            raise ValueError("field 'tests': each test dict needs 'input' and 'output'")
        parsed = [CodeTest(stdin=_text(t["input"]), expected_stdout=_text(t["output"])) for t in tests]
    elif isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        parsed = [parse_assert_test(snippet, index) for index, snippet in enumerate(tests)]
    else:
        raise ValueError(
            "field 'tests' must be {'inputs': [...], 'outputs': [...]}, a list of {'input', 'output'} dicts "
            f"or a list of assert snippets; got {type(tests).__name__} {tests!r:.100}"
        )
    if not parsed:
        raise ValueError("field 'tests' is empty: there is nothing to score the program against")
    return parsed


def _text(value: Any) -> str:
    # Some datasets store an input as a list of lines.
    if isinstance(value, list):
        return "\n".join(str(line) for line in value) + "\n"
    return str(value)


def _same_output(actual: str, expected: str) -> bool:
    def normalise(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return normalise(actual) == normalise(expected)
