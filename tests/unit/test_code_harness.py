"""The code harness: assert-style tests that a program cannot win without solving, and the split behind it.

Each hostile program in ATTACKS scored 1.0 when the asserts were appended to the program and exit
status 0 counted as a pass (all but two: the gc reader, since the tests then sat in a frame and not in
anything gc tracks, whereas the harness's own request is a dict gc sees; and the program's own `math`,
0.5). Here each must score 0.0, while honest programs still score 1.0. The split into
probes and checks, the value codec and the checker's handling of hostile records are tested in
process, without the sandbox.
"""

from __future__ import annotations

import json

import pytest

from oxrl.rewards import code_harness
from oxrl.rewards.code_harness import parse_assert_test
from oxrl.rewards.code_reward import code_reward, parse_tests
from oxrl.rewards.harness_check import judge, read_records
from oxrl.rewards.harness_codec import MAX_DEPTH, NotPlainData, decode, encode
from oxrl.rewards.harness_run import evaluate
from tests.system.test_sandbox import FAST, fenced, needs_sandbox


def score(program: str, tests: list, **kwargs) -> float:
    (value,) = code_reward(["p"], [fenced(program)], tests=[tests], **{**FAST, **kwargs})
    return value


# --- findings: programs that won without solving -------------------------------------------------

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
ISCLOSE_TESTS = ["import math\nassert math.isclose(area(2), 12.566, rel_tol=1e-3)", "assert math.isclose(area(1), 3.1416, rel_tol=1e-3)"]
BUILTIN_TESTS = ["assert sorted(top(3)) == [1, 2, 3]", "assert len(top(2)) == 2"]
WRONG_ADD = "def add(a, b):\n    return 0\n"

# A program that answers from the tests' text wherever it can find it, at call time: `source` is
# where it looks (strings in the callers' frames, in every dict gc knows, in files it can open).
READER = """
import gc, re, sys

def strings(objects, depth=0):
    for item in objects:
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict) and depth < 4:
            yield from strings(list(item.values()), depth + 1)
        elif isinstance(item, (list, tuple)) and depth < 4:
            yield from strings(list(item), depth + 1)

def add(a, b):
    for text in strings(source()):
        for arguments, expected in re.findall(r"add\\((\\d+, \\d+)\\) == (\\d+)", text):
            if arguments == f"{a}, {b}":
                return int(expected)
    return None
"""
FROM_FRAMES = """
def source():
    frame, found = sys._getframe(), []
    while frame is not None:
        found += list(frame.f_locals.values()) + list(frame.f_globals.values())
        frame = frame.f_back
    return found
"""
FROM_GC = "\ndef source():\n    return [item for item in gc.get_objects() if isinstance(item, dict)]\n"
# The audit hook would refuse the open; it is not what keeps the tests away, so switch it off first.
FROM_FILES = """
def source():
    for hook in gc.get_objects():
        if type(hook).__name__ == "function" and hook.__name__ == "hook" and hook.__closure__:
            for cell in hook.__closure__:
                if getattr(cell.cell_contents, "__name__", "") == "deny":
                    cell.cell_contents = lambda *args, **kwargs: None
    found = []
    for path in ("/sandbox/solution.py", "/proc/self/fd/0", "solution.py"):
        try:
            found.append(open(path).read())
        except OSError:
            pass
    return found
"""
ALWAYS_EQUAL = "class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
# Forged phase-1 records (a wrong guess) and forged verdicts, on every descriptor, then a clean exit.
FORGER = """
import os
lines = 'R\\nV 0 ["i","0x0"]\\n' + ''.join(f'{nonce} {i} pass\\n' for nonce in ('0' * 32, 'f' * 32) for i in range(4))
for fd in range(1, 32):
    try:
        os.write(fd, lines.encode())
    except OSError:
        pass
os._exit(0)
"""

ATTACKS = {
    # finding 1: ending the run with status 0 before the asserts
    "SystemExit(0) at the top": (WRONG_ADD + "raise SystemExit(0)", ADD_TESTS),
    "sys.exit() at the top": ("import sys\n" + WRONG_ADD + "sys.exit()", ADD_TESTS),
    "excepthook os._exit(0)": ("import os, sys\n" + WRONG_ADD + "sys.excepthook = lambda *args: os._exit(0)", ADD_TESTS),
    "atexit os._exit(0)": ("import atexit, os\n" + WRONG_ADD + "atexit.register(os._exit, 0)", ADD_TESTS),
    "os._exit(0) at the top": ("import os\n" + WRONG_ADD + "os._exit(0)", ADD_TESTS),
    "sys.exit(0) inside the call": ("import sys\ndef add(a, b):\n    sys.exit(0)", ADD_TESTS),
    "forged records and verdicts": (WRONG_ADD + FORGER, ADD_TESTS),
    # finding 2: reading the expected values
    "caller's frames": (READER + FROM_FRAMES, ADD_TESTS),
    "gc": (READER + FROM_GC, ADD_TESTS),
    "own source file and stdin": (READER + FROM_FILES, ADD_TESTS),
    # finding 3: fooling the comparison
    "always-equal object": (ALWAYS_EQUAL + "def add(a, b):\n    return Anything()", ADD_TESTS),
    "int subclass with __eq__": (
        "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Int(0)",
        ADD_TESTS,
    ),
    "patched encoder": (
        ALWAYS_EQUAL + "def add(a, b):\n    return Anything()\n"
        "import sys\nframe = sys._getframe()\nwhile frame is not None:\n"
        "    if 'encode' in frame.f_globals:\n"
        "        frame.f_globals['encode'] = lambda value: '[\"B\", true]'\n"
        "        frame.f_globals.get('_SEQUENCES', {})[Anything] = 'l'\n"
        "    frame = frame.f_back",
        ADD_TESTS,
    ),
    "math.isclose replaced": ("import math\nmath.isclose = lambda *a, **k: True\ndef area(r):\n    return 0", ISCLOSE_TESTS),
    "sys.modules['math'] replaced": (
        "import sys, types\nfake = types.ModuleType('math')\nfake.isclose = lambda *a, **k: True\n"
        "sys.modules['math'] = fake\nmath = fake\ndef area(r):\n    return 0",
        ISCLOSE_TESTS,
    ),
    "a `math` of the program's own": (
        "class math:\n    isclose = staticmethod(lambda *a, **k: True)\ndef area(r):\n    return 0", ISCLOSE_TESTS,
    ),
    "builtins replaced": (
        "import builtins\nbuiltins.sorted = lambda x: [1, 2, 3]\nbuiltins.len = lambda x: 2\ndef top(n):\n    return []",
        BUILTIN_TESTS,
    ),
    # the program's own classes that cross as data cross without their behaviour
    "namedtuple with an always-true __eq__": (
        "import typing\nclass T(typing.NamedTuple):\n    a: int\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = tuple.__hash__\ndef add(a, b):\n    return T(0)", ADD_TESTS,
    ),
    "namedtuple subclass": (
        "import collections\nclass T(collections.namedtuple('T', 'a')):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = tuple.__hash__\ndef add(a, b):\n    return T(0)", ADD_TESTS,
    ),
    "enum with an always-true __eq__": (
        "import enum\nclass E(enum.Enum):\n    A = 0\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\ndef add(a, b):\n    return E.A", ADD_TESTS,
    ),
    "float-mixin enum": (
        "import enum\nclass E(float, enum.Enum):\n    A = 0.0\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = float.__hash__\ndef add(a, b):\n    return E.A", ADD_TESTS,
    ),
    "builtins shadowed by the program": (
        "def sorted(x):\n    return [1, 2, 3]\ndef len(x):\n    return 2\ndef top(n):\n    return []", BUILTIN_TESTS,
    ),
}


@needs_sandbox
@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_program_that_does_not_solve_scores_nothing(name):
    program, tests = ATTACKS[name]
    assert score(program, tests) == 0.0


@needs_sandbox
def test_a_forged_record_is_only_a_claim_of_what_the_program_computed():
    # Claiming 3 for every call is what `return 3` does: it passes add(1, 2) == 3 and nothing else.
    forged = WRONG_ADD + FORGER.replace('["i","0x0"]', '["i","0x3"]')
    assert score(forged, ADD_TESTS) == score("def add(a, b):\n    return 3", ADD_TESTS) == 0.5


@needs_sandbox
def test_a_hostile_record_fails_only_its_own_test():
    # add(1, 2) writes a record nested far deeper than the checker's JSON reader allows, and one
    # that is not JSON, then ends the process; the checker must still judge the other test.
    program = """
import os
def add(a, b):
    if (a, b) == (1, 2):
        for fd in range(3, 32):
            try:
                os.write(fd, b"V 0 " + b"[" * 200000 + b"\\nV 1 {not json\\n")
            except OSError:
                pass
        os._exit(0)
    return a + b
"""
    assert score(program, ADD_TESTS) == 0.5


# --- stdin/stdout tests: the same tricks win nothing there either ----------------------------------

IO_TESTS = {"inputs": ["1 2\n", "2 2\n"], "outputs": ["3\n", "4\n"]}


@needs_sandbox
@pytest.mark.parametrize("program", [
    "raise SystemExit(0)",
    "import atexit, os\natexit.register(os._exit, 0)",
    "import sys, gc\nprint(*[v for d in gc.get_objects() if isinstance(d, dict) for v in d.values() if isinstance(v, str) and v.strip().isdigit()])",
    ALWAYS_EQUAL + "print(Anything())",
])
def test_stdin_stdout_tests_cannot_be_won_without_solving(program):
    assert score(program, IO_TESTS) == 0.0
    assert score("a, b = map(int, input().split())\nprint(a + b)", IO_TESTS) == 1.0


# --- honest programs ------------------------------------------------------------------------------

HONEST = """
import collections, math

def area(r):
    return math.pi * r * r

def unique(xs):
    return list(dict.fromkeys(xs))

def pair(a, b):
    return (a, b)

def half(n):
    return n / 2

def nothing():
    return None

def nested():
    return {"a": [1, (2, 3.5)], "b": {4}, "c": b"x", "d": -0.0}

def frequencies(xs):
    return collections.Counter(xs)

def evens(n):
    return (i for i in range(n) if i % 2 == 0)

class Solution:
    def solve(self, xs):
        return sorted(xs)

print("the program may print what it likes")
"""
HONEST_TESTS = [
    "import math\nassert math.isclose(area(2), 12.566, rel_tol=1e-3)",
    "assert math.isclose(area(1), math.pi)",
    "assert abs(area(1) - 3.14159) < 1e-3",
    "assert set(unique([3, 1, 3])) == {1, 3}\nassert sorted(unique([3, 1, 3])) == [1, 3]\nassert len(unique([1, 1])) == 1",
    "assert pair(1, 2) == (1, 2)\nassert pair(1, 2) != [1, 2]",
    "assert half(2) == 1 and type(half(2)) is float",
    "assert nothing() is None",
    "assert nested() == {'a': [1, (2, 3.5)], 'b': {4}, 'c': b'x', 'd': 0.0}",
    "assert frequencies('abca') == {'a': 2, 'b': 1, 'c': 1}",
    "assert list(evens(5)) == [0, 2, 4]",
    "assert Solution().solve([3, 1]) == [1, 3]",
    "from math import pi\nassert area(1) == pi",
    "assert all(x % 2 == 0 for x in evens(7))",
]


@needs_sandbox
def test_an_honest_program_passes_every_kind_of_assert():
    assert score(HONEST, HONEST_TESTS) == 1.0


DATA_TYPES = """
import array, collections, datetime, enum
Point = collections.namedtuple("Point", "x y")
class Color(enum.Enum):
    RED = 1
    GREEN = 2
def buffer():
    return bytearray(b"ab")
def leap_day():
    return datetime.date(2024, 2, 29)
def numbers():
    return array.array("i", [1, 2])
def point():
    return Point(1, 2)
def color():
    return Color.GREEN
def big():
    return "x" * (2 << 20)
"""
DATA_TESTS = [
    "assert buffer() == bytearray(b'ab') and buffer() == b'ab'",
    "import datetime\nassert leap_day() == datetime.date(2024, 2, 29)\nassert leap_day().isoformat() == '2024-02-29'",
    "import array\nassert numbers() == array.array('i', [1, 2]) and list(numbers()) == [1, 2]",
    "assert point() == (1, 2) and point() == Point(1, 2) and point().y == 2",
    "assert color() == Color.GREEN and color() is Color.GREEN and color() != Color.RED",
]


@needs_sandbox
def test_values_of_standard_library_and_data_classes_are_compared():
    assert score(DATA_TYPES, DATA_TESTS) == 1.0
    assert score(DATA_TYPES.replace("GREEN\n", "RED\n").replace("2024, 2, 29", "2024, 3, 1"), DATA_TESTS) == 0.6


@needs_sandbox
def test_a_value_over_the_output_limit_fails_its_test_and_is_counted_in_a_warning(caplog):
    tests = ["assert len(big()) == 2 << 20", "assert leap_day().year == 2024"]
    with caplog.at_level("WARNING", logger="oxrl.rewards.code_reward"):
        scores = code_reward(["p", "p"], [fenced(DATA_TYPES)] * 2, tests=[tests, tests[1:]], **FAST)
    assert scores == [0.5, 1.0]
    assert "code reward: 1 value(s) that programs returned were too large to compare" in caplog.text
    assert "1048576 bytes" in caplog.text


@needs_sandbox
def test_pythons_own_equality_decides():
    program = "def pair(a, b):\n    return [a, b]\ndef one():\n    return 1.0\ndef nan():\n    return float('nan')"
    tests = ["assert pair(1, 2) == (1, 2)", "assert one() == 1", "assert nan() != nan()", "assert pair(1, 2) == [1, 2]"]
    assert score(program, tests) == 0.75  # a list is not a tuple; 1.0 == 1; nan != nan


@needs_sandbox
def test_a_partial_solution_gets_its_fraction():
    assert score("def add(a, b):\n    return a * b", ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]) == pytest.approx(2 / 3)


@needs_sandbox
def test_a_crash_in_one_test_does_not_fail_the_others():
    program = "import os\ndef inverse(n):\n    if n == 2:\n        os._exit(1)\n    return 1 // n"
    tests = ["assert inverse(1) == 1", "assert inverse(0) == 0", "assert inverse(2) == 0", "assert inverse(-1) == -1"]
    assert score(program, tests) == 0.5


@needs_sandbox
def test_a_test_without_calls_passes_when_the_program_runs_to_its_end():
    assert score("x = 1", ["assert True"]) == 1.0
    assert score("raise ValueError", ["assert True"]) == 0.0


@needs_sandbox
def test_a_timeout_fails_that_test_and_skips_the_rest():
    program = "def f(n):\n    while n == 0:\n        pass\n    return n"
    assert score(program, ["assert f(1) == 1", "assert f(0) == 0", "assert f(2) == 2"]) == pytest.approx(1 / 3)


@needs_sandbox
def test_three_tests_cost_four_sandbox_runs(monkeypatch):
    calls = []

    real = code_harness.run_python

    def counting(code, stdin="", limits=None):
        calls.append(code)
        return real(code, stdin=stdin, limits=limits)

    monkeypatch.setattr(code_harness, "run_python", counting)
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]
    assert score("def add(a, b):\n    return a + b", tests) == 1.0
    assert len(calls) == 4  # phase 1 once per test, phase 2 once
    calls.clear()
    assert score("raise ValueError", tests) == 0.0
    assert len(calls) == 3  # the program never ran to its end: no phase 2


# --- the split into probes and checks (no sandbox) ------------------------------------------------


@pytest.mark.parametrize("snippet, probes, checks", [
    ("assert add(1, 2) == 3", ["add(1, 2)"], ["_oxrl_probe(0) == 3"]),
    ("import math\nassert math.isclose(area(2), 12.56)", ["area(2)"], ["math.isclose(_oxrl_probe(0), 12.56)"]),
    # an operator around a program value stays with the checker: 3.14 is never shown to the program
    ("assert abs(area(1) - 3.14) < 1e-3", ["area(1)"], ["abs(_oxrl_probe(0) - 3.14) < 0.001"]),
    ("assert set(f([1, 2])) == {1, 2}", ["f([1, 2])"], ["set(_oxrl_probe(0)) == {1, 2}"]),
    ("assert Solution().solve([3, 1])[0] == 1", ["Solution().solve([3, 1])[0]"], ["_oxrl_probe(0) == 1"]),
    ("assert f(1) == 1\nassert g(f(2)) == [4] and h() is None", ["f(1)", "g(f(2))", "h()"],
     ["_oxrl_probe(0) == 1", "_oxrl_probe(1) == [4] and _oxrl_probe(2) is None"]),
    ("assert all(x > 0 for x in f(3))", ["f(3)"], ["all((x > 0 for x in _oxrl_probe(0)))"]),
    ("assert copy(3) == 3", ["copy(3)"], ["_oxrl_probe(0) == 3"]),  # a module name called: the program's
    ("assert sum(f(2)) == 3", ["f(2)"], ["sum(_oxrl_probe(0)) == 3"]),  # a builtin is the builtin
    ("assert f(3) == 9, 'the message is not evaluated'", ["f(3)"], ["_oxrl_probe(0) == 9"]),
    ("assert True", [], ["True"]),
    # nothing of the program but builtins called: the outermost call is the program's function of that name
    ("assert max([1, 5, 3]) == 5", ["max([1, 5, 3])"], ["_oxrl_probe(0) == 5"]),
    ("assert sum(range(5)) == 10 and round(2.5) == 2", ["sum(range(5))", "round(2.5)"],
     ["_oxrl_probe(0) == 10 and _oxrl_probe(1) == 2"]),
])
def test_the_split(snippet, probes, checks):
    test = parse_assert_test(snippet, 0)
    assert list(test.probes) == probes and list(test.checks) == checks


def test_imports_go_where_they_are_used():
    test = parse_assert_test("from fractions import Fraction\nassert f(Fraction(1, 2)) == re.sub('a', '', 'b')", 0)
    assert test.program_imports == "from fractions import Fraction"
    assert test.checker_imports == "from fractions import Fraction\nimport re"


@pytest.mark.parametrize("snippet, message", [
    ("x = 3\nassert f(x) == 3", r"item 4 \('x = 3'\): line 1 \(`x = 3`\) is neither an import nor an assert"),
    ("def check(f):\n    assert f(1) == 1", "is neither an import nor an assert"),
    ("assert all(f(i) == i * i for i in range(5))", "uses 'i', which the test binds itself"),
    ("assert list(map(lambda v: f(v), [1])) == [1]", "uses 'v', which the test binds itself"),
    ("import numpy\nassert f(1)", "imports 'numpy', which is not in the standard library"),
    ("from math import *\nassert f(1)", "import \\*` is not supported"),
    ("import math", "has no assert statement"),
    ("assert f(1) ==", "is not valid Python"),
    ("assert _oxrl_probe(0)", "reserves"),
    # tests that any program passes: they call nothing of it
    ("from math import gcd\nassert gcd(4, 6) == 2", "calls nothing of the program"),
    ("import math\nassert math.gcd(4, 6) == 2", "calls nothing of the program"),
    ("assert 1 + 1 == 2", "calls nothing of the program"),
    ("assert True\nassert not False", "calls nothing of the program"),
    ("assert max == max", "calls nothing of the program"),
    # a function of the program's passed to the test's own call cannot cross as plain data
    ("assert list(map(square, [1, 2])) == [1, 4]", "passes the program's 'square' itself to a call"),
    ("assert sorted([3, 1], key=k) == [1, 3]", "passes the program's 'k' itself to a call"),
    ("assert f(*xs) == 1\nassert max(a=1, key=k)", "passes the program's 'k' itself"),
])
def test_unsupported_tests_are_refused_when_parsed(snippet, message):
    with pytest.raises(ValueError, match=message) as caught:
        parse_assert_test(snippet, 4)
    assert "field 'tests', item 4" in str(caught.value)


def test_the_program_must_define_a_shadowed_builtin_itself():
    assert parse_assert_test("assert max([1, 5]) == 5\nassert max([2]) != 1", 0).own_names == ("max", "max")
    # The outermost call is the program's: a builtin wrapped around the task's needs the program's own too.
    assert parse_assert_test("assert abs(max([2]) - 2) < 1", 0).own_names == ("abs",)
    assert parse_assert_test("assert sum(f(2)) == 3", 0).own_names == (None,)  # with a program name, builtins are builtins


@needs_sandbox
def test_a_test_of_a_builtin_named_task_is_scored_against_the_programs_own_function():
    tests = ["assert max([1, 5, 3]) == 5", "assert max([-1, -4]) == -1"]
    assert score("x = 1", tests) == 0.0  # the builtin would pass both
    assert score("from builtins import min as max", tests) == 0.0  # the program's max, and a wrong one
    assert score("def max(xs):\n    best = xs[0]\n    for x in xs:\n        best = x if x > best else best\n"
                 "    return best", tests) == 1.0
    assert score("def max(xs):\n    return xs[0]", tests) == 0.5


@needs_sandbox
def test_a_row_whose_test_calls_nothing_of_the_program_is_refused_naming_the_row():
    from oxrl.rewards.base import RewardError
    from oxrl.rewards.combine import RewardSpec, build_reward_fn

    reward = build_reward_fn([RewardSpec("code", kwargs=FAST)])
    rows = [{"tests": ADD_TESTS}, {"tests": ["from math import gcd\nassert gcd(4, 6) == 2"]}]
    with pytest.raises(RewardError, match=r"mbpp.jsonl row 8.*field 'tests', item 0 .*calls nothing of the program"):
        reward(["p", "p"], [fenced("def add(a, b):\n    return a + b")] * 2, fields=rows,
               origins=["mbpp.jsonl row 7", "mbpp.jsonl row 8"])


def test_parse_tests_refuses_an_unsupported_assert_before_anything_runs():
    with pytest.raises(ValueError, match=r"field 'tests', item 1 .*stdin/stdout tests"):
        parse_tests(["assert f(1) == 1", "for i in range(3):\n    assert f(i) == i"])


# --- the value codec (no sandbox) -----------------------------------------------------------------


def test_plain_values_cross_exactly():
    import collections
    import decimal
    import fractions

    values = [
        None, True, 0, -31, 10**5000, 1.5, float("inf"), 1 + 2j, "é\n\udc80", b"\x00\xff", [1, (2, 3)],
        {1: [2], "a": {3}}, frozenset({1}), range(2, 10, 3), collections.Counter("abca"),
        collections.OrderedDict(a=1), collections.deque([1, 2], 5), fractions.Fraction(1, 3), decimal.Decimal("1.10"),
        {1: 2}.keys(), {(1, 2): 3}.items(),
    ]
    for value in values:
        decoded = decode(encode(value))
        assert type(decoded) is type(value) and decoded == value
    assert str(decode(encode(-0.0))) == "-0.0" and decode(encode(float("nan"))) != decode(encode(float("nan")))
    assert list(decode(encode(map(str, [1, 2])))) == ["1", "2"]


def test_standard_library_values_and_the_programs_data_classes_cross_faithfully():
    import array
    import collections
    import datetime
    import enum
    import typing

    class Point(typing.NamedTuple):
        x: int
        y: list

    class Color(enum.Enum):
        RED = 1
        GREEN = (2, "g")
        CRIMSON = 1  # an alias

    class Mode(enum.IntFlag):
        R = 4
        W = 2

    class Size(enum.StrEnum):
        S = "s"

    east = datetime.timezone(datetime.timedelta(hours=5, minutes=30), "IST")
    values = [
        bytearray(b"\x00\xff"), datetime.date(2024, 2, 29), datetime.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=east),
        datetime.datetime(2021, 11, 7, 1, 30, fold=1), datetime.time(23, 59, 59, 999999, tzinfo=datetime.timezone.utc),
        datetime.timedelta(days=-1, microseconds=5), array.array("d", [1.5, -0.0]), array.array("b", [-1, 2]),
    ]
    for value in values:
        decoded = decode(encode(value))
        assert type(decoded) is type(value) and decoded == value and repr(decoded) == repr(value)
    point = decode(encode(Point(1, [2])))
    assert point == (1, [2]) and point.y == [2] and type(point).__name__ == "Point" and point._fields == ("x", "y")
    pair = decode(encode(collections.namedtuple("Pair", "a b")(1, 2)))
    assert pair == (1, 2) and pair.b == 2
    # Enum members of one class decode to one class: identity and equality hold between them, not with plain values.
    green, red, alias = (decode(encode(member)) for member in (Color.GREEN, Color.RED, Color.CRIMSON))
    assert green is decode(encode(Color.GREEN)) and green.value == (2, "g") and alias is red and green != red
    assert red != 1 and type(green).__name__ == "Color" and green.name == "GREEN"
    assert decode(encode(Mode.R | Mode.W)) == 6 and decode(encode(Mode.R)) == 4 and decode(encode(Size.S)) == "s"


@pytest.mark.parametrize("value", [object(), [1, object()], type, print, (i for i in [object()])])
def test_anything_with_behaviour_of_its_own_is_not_plain_data(value):
    with pytest.raises(NotPlainData):
        encode(value)


def test_a_zone_other_than_a_fixed_offset_and_a_mixin_enum_are_not_plain_data():
    import datetime
    import enum
    import zoneinfo

    class Weight(float, enum.Enum):
        LIGHT = 1.5

    for value in (datetime.datetime(2024, 1, 1, tzinfo=zoneinfo.ZoneInfo("UTC")), Weight.LIGHT):
        with pytest.raises(NotPlainData):
            encode(value)


def test_subclasses_and_cycles_are_refused():
    class Int(int):
        pass

    cycle: list = []
    cycle.append(cycle)
    deep: list = []
    for _ in range(MAX_DEPTH):
        deep = [deep]
    for value in (Int(3), cycle, deep):
        with pytest.raises(NotPlainData):
            encode(value)


@pytest.mark.parametrize("text", [
    '["x"]', "[]", '["i", 3]', '["B", 1]', '["S", [["l", []]]]', '["d", [[["l", []], ["N"]]]]',
    '["A", [["i", "0x1"]]]', '["q", [], "5"]', '{"i": "0x1"}', "[" * 100000,
    '["y", "0"]', '["Ar", "x", ""]', '["Ar", "i", "00"]', '["Td", [2024, 2, 30]]', '["Td", [2024, 2]]',
    '["TD", [1, 1, 1, 0, 0, 0, 0], 2, ["N"]]', '["Tt", [0, 0, 0, 0], 0, ["i", "0x1"]]', '["Tz", ["i", "0x1"], "x"]',
    '["nt", "P", ["x", 1], []]', '["nt", "P", ["x"], [["i", "0x1"], ["i", "0x2"]]]', '["nt", "P", ["def"], [["N"]]]',
    '["En", "Object", "E", [["A", ["i", "0x1"]]], ["i", "0x1"]]', '["En", "Enum", "E", [["A", ["i", "0x1"]]], ["i", "0x2"]]',
    '["En", "Enum", "E", [["_A_", ["i", "0x1"]]], ["i", "0x1"]]', '["En", "Flag", "E", [["A", ["s", "x"]]], ["s", "x"]]', '["En", "Enum", "E", [["__eq__", ["N"]], ["A", ["N"]]], ["N"]]',
])
def test_malformed_values_do_not_decode(text):
    with pytest.raises((ValueError, TypeError, RecursionError)):
        decode(text)


# --- the checker against hostile records (no sandbox) --------------------------------------------


def check(records: str, checks: list[str], imports: str = "") -> str:
    return judge({"imports": imports, "checks": checks, "records": records})


def test_the_checker_passes_only_what_the_values_satisfy():
    three = f"R\nV 0 {encode(3)}\n"
    assert check(three, ["_oxrl_probe(0) == 3"]) == "pass"
    assert check(three, ["_oxrl_probe(0) == 4"]) == "fail an assert is false"
    assert check(f"V 0 {encode(3)}\n", ["_oxrl_probe(0) == 3"]).startswith("fail the program did not run")
    assert check("R\nE 0 ZeroDivisionError\n", ["_oxrl_probe(0) == 3"]) == "fail ProbeFailed"
    assert check("R\n", ["_oxrl_probe(0) is None or True"]) == "fail ProbeFailed"
    assert check(three + f"V 0 {encode(4)}\n", ["_oxrl_probe(0) in (3, 4)"]) == "fail ProbeFailed"  # two claims
    assert check("R\nV 0 " + "[" * 100000 + "\n", ["_oxrl_probe(0) == 3"]) == "fail RecursionError"
    assert check(three, ["math.isclose(_oxrl_probe(0), 3.0)"], "import math") == "pass"


def test_records_are_read_defensively():
    ran, values = read_records("noise\nR\nV 1 x\nV -1 y\nV ¹ z\nV 1234567 w\nE 2 Boom\n")
    assert ran and values == {1: "x", 2: None}


def test_only_lines_with_the_nonce_count_as_verdicts():
    output = "abc 0 pass\nabc 1 fail an assert is false\nxyz 2 pass\nabc 2 pass extra\nabc 5 pass\nabc 3 pass\n"
    assert code_harness._passed(output, "abc", 4) == {0, 3}


def test_phase_one_records_values_and_failures():
    namespace = {"__builtins__": __builtins__, "f": lambda n: [n], "g": lambda: 1 / 0, "h": lambda: object()}
    assert evaluate(0, "f(2)", namespace) == f"V 0 {json.dumps(['l', [['i', '0x2']]], separators=(',', ':'))}"
    assert evaluate(1, "g()", namespace) == "E 1 ZeroDivisionError"
    assert evaluate(2, "h()", namespace) == "E 2 NotPlainData"


# --- code-block extraction ------------------------------------------------------------------------


def test_code_extraction_is_linear_in_runs_of_backticks():
    import time

    from oxrl.data.code_blocks import extract_code

    start = time.perf_counter()
    for text in ("`" * 200_000, "```\n" + "`" * 200_000, "```python\n" + "`\n" * 100_000):
        extract_code(text)
    assert time.perf_counter() - start < 0.5  # the regex took 1.6 s for one run of 48,000


@pytest.mark.parametrize("text, code", [
    ("```python\nprint(1)\n```\n```js\nx\n```", "print(1)\n"),
    ("```\nprint(2)\n```", "print(2)\n"),
    ("```python\nprint(1)", None),  # unclosed: a cut completion
    ("```py3 extra words\na\n```\n```\nb\n```", "b\n"),  # `py3` is not python; the untagged block is taken
    ("```Python3 run\na\n```", "a\n"),
    ("``````\nx\n``` ```python\ny\n```", "y\n"),  # a block ends at the first fence after its first line
    ("no fences", None),
])
def test_code_extraction_keeps_its_behaviour(text, code):
    from oxrl.data.code_blocks import extract_code

    assert extract_code(text) == code


def test_code_blocks_match_the_regex_they_replace():
    import random
    import re

    from oxrl.data.code_blocks import code_blocks

    regex = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)  # quadratic, but the reference
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice("```\npy +-é") for _ in range(rng.randint(0, 30)))
        assert code_blocks(text) == regex.findall(text), text
