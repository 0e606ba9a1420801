"""Assert-style tests run so that the program cannot reach them: it computes values, the harness compares them.

Appending `assert add(1, 2) == 3` to the program and counting exit status 0 as a pass lets a program
win without solving: it can exit 0 before the asserts run, read the expected values from its own
source or the caller's frame, return an object whose `__eq__` is always true, or replace
`math.isclose`. So the program and the expected values never share a process:

- here, in the trainer, each test snippet is only parsed (`ast`; nothing of it is executed). Its
  maximal subexpressions that need the program ("probes": a name the program defines, followed by
  any attribute accesses, calls and subscripts, with their arguments: `add(1, 2)`,
  `Solution().solve([3, 1])`, `f(x)[0]`) are cut out; the rest of each assert (comparisons,
  operators, literals, builtin and standard-library calls such as `math.isclose(...)`, `set(...)`,
  `abs(... - 3.14)`) stays with the checker, each probe replaced by a lookup of its value;
- phase 1, in the sandbox, once per test (`harness_run.py`): the program runs, then the test's
  imports and probes are evaluated in its namespace and each value is written out as plain data
  (`harness_codec.py`: exact builtin and standard-library types, nothing with behaviour of its own).
  It is given the probes only, never an assert or an expected value;
- phase 2, in the sandbox, once per program (`harness_check.py`): the rewritten asserts run against
  the decoded values, with the real builtins and modules, and no program code in the process. A test
  passes only when phase 2 writes its pass verdict carrying the nonce that only phase 2 was given.

What a test may be: `import` statements (standard library) and `assert` statements, one or more.
Anything else is a ValueError when the row is parsed (stdin/stdout tests cover other shapes). Names in
a test mean, in order: what the test imports or binds itself (comprehension variables, lambda
arguments, `:=`), a builtin, a standard-library module used as `module.attr` (`math.isclose` works
without an import), else a name of the program. So a program that defines its own `sum` does not turn
the test's `sum(...)` into a call to it. Two exceptions close the tests that any program would pass:
a test that names nothing of the program but calls builtins (`assert max([1, 5, 3]) == 5`, the task
being "write max") takes each builtin it calls as the program's function of that name: the probe is
the outermost such call, evaluated in the program's namespace, and it fails unless the program itself
defines the name (so `isinstance(max(x), int)` would need the program's `isinstance`: compare the value
instead). A test that calls nothing of the program even so (its names are its imports, standard-library
modules or builtins it does not call: `from math import gcd; assert gcd(4, 6) == 2`) is a ValueError,
unless every assert is the literal `assert True`. A program name passed as it is to a call of the
test's (`list(map(square, xs))`, `sorted(xs, key=k)`) is a ValueError too: a function cannot cross as
plain data. A probe cannot use a name the test binds itself
(`all(f(i) == i * i for i in range(5))` would need the test's values in the program's process): that
is a ValueError too; write one assert per case. Phase 1 evaluates every probe of a test, also those
that `and`/`or` would have skipped. A probe whose value is not plain data (`harness_codec`: an object of
the program's class other than a namedtuple or an enum member, a numpy array, a function), or whose encoding exceeds the sandbox's output limit
(`max_output_bytes`), fails, as does a test whose assert needs it. A test of only `assert True` passes when
the program runs to its end.

What it does not change: a probe's value is whatever the program makes it, method calls on what it
returns included, so `assert is_valid(x)` or `assert f(x).startswith("a")` is won by anything that
says True (tests need negative cases). And the probes of one test reach the program together: a test
whose later call takes an earlier assert's expected value (`assert to_roman(4) == "IV"` then
`assert from_roman("IV") == 4`) shows the program that value; give such asserts a test each.
"""

from __future__ import annotations

import ast
import builtins
import functools
import json
import secrets
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from oxrl.rewards.harness_codec import PROBE_FUNCTION
from oxrl.rewards.sandbox import SandboxLimits, SandboxResult, run_python

# The kernel stops a program at its CPU limit with SIGXCPU (soft limit) or SIGKILL (hard limit).
CPU_LIMIT_EXITS = (-signal.SIGXCPU, -signal.SIGKILL)
SUPPORTED = (
    "an assert-style test may hold only `import` statements (standard library) and `assert` statements; "
    "write other shapes as stdin/stdout tests ({'input': ..., 'output': ...})"
)
HERE = Path(__file__).parent


@dataclass(frozen=True)
class AssertTest:
    snippet: str  # the test as the row gives it
    probes: tuple[str, ...]  # expressions evaluated in the program's namespace (phase 1)
    program_imports: str  # run in the program's namespace before the probes
    checks: tuple[str, ...]  # each assert's condition, probe k replaced by `_oxrl_probe(k)` (phase 2)
    checker_imports: str  # run in the checker's namespace before the checks
    # Per probe: the builtin name it calls that the program must define itself (a test of a task that
    # shadows a builtin: `assert max([1, 5]) == 5`), or None.
    own_names: tuple[str | None, ...]


def stopped_by_limit(result: SandboxResult) -> bool:
    """Whether a run hit the wall-clock or CPU limit: the program's remaining tests would too, each after the full limit."""
    return result.timed_out or result.returncode in CPU_LIMIT_EXITS


# --- the split, in the trainer: parsing only -----------------------------------------------------


def parse_assert_test(snippet: str, index: int) -> AssertTest:
    """The test `snippet` (item `index` of the row's `tests`) split into probes and checks; ValueError when unsupported."""
    where = f"field 'tests', item {index} ({snippet.strip().splitlines()[0] if snippet.strip() else ''!r:.70})"
    try:
        tree = ast.parse(snippet)
    except (SyntaxError, ValueError, RecursionError) as error:
        raise ValueError(f"{where} is not valid Python ({error}); {SUPPORTED}") from error
    imports: list[ast.stmt] = []
    asserts: list[ast.Assert] = []
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            _check_import(statement, where)
            imports.append(statement)
        elif isinstance(statement, ast.Assert):
            asserts.append(statement)
        else:
            shown = ast.unparse(statement).splitlines()[0]
            raise ValueError(f"{where}: line {statement.lineno} (`{shown:.60}`) is neither an import nor an assert; {SUPPORTED}")
    if not asserts:
        raise ValueError(f"{where} has no assert statement; {SUPPORTED}")
    names = _Names(imports, asserts)
    if PROBE_FUNCTION in names.used:
        raise ValueError(f"{where} uses the name {PROBE_FUNCTION}, which the code harness reserves")
    if not names.program and not all(_is_literal_true(statement) for statement in asserts):
        raise ValueError(
            f"{where} calls nothing of the program: every name it uses is its own, imported, a builtin it does not "
            "call, or a standard-library module, so it would pass for any program. Call the task's function in "
            "each test (a name the test imports is the import's, not the program's); only `assert True` may call nothing"
        )
    splitter = _ProbeSplitter(names, where)
    conditions = [splitter.visit(statement.test) for statement in asserts]  # the probes cut out
    for probe in splitter.probes:
        _check_probe(probe, names, where)
    return AssertTest(
        snippet=snippet,
        probes=tuple(ast.unparse(probe) for probe in splitter.probes),
        program_imports=_imports_source(imports, names.modules_in(splitter.probes)),
        checks=tuple(ast.unparse(condition) for condition in conditions),
        checker_imports=_imports_source(imports, names.modules_in(conditions)),
        own_names=tuple(_root(probe) if _root(probe) in names.shadowed else None for probe in splitter.probes),
    )


def _is_literal_true(statement: ast.Assert) -> bool:
    return isinstance(statement.test, ast.Constant) and statement.test.value is True


def _root(probe: ast.expr) -> str | None:
    """The name a probe's chain of attributes, calls and subscripts starts from."""
    while isinstance(probe, (ast.Attribute, ast.Call, ast.Subscript)):
        probe = probe.func if isinstance(probe, ast.Call) else probe.value
    return probe.id if isinstance(probe, ast.Name) else None


def _check_import(statement: ast.Import | ast.ImportFrom, where: str) -> None:
    if isinstance(statement, ast.ImportFrom):
        if statement.level or statement.module is None:
            raise ValueError(f"{where}: relative imports are not supported; {SUPPORTED}")
        if any(alias.name == "*" for alias in statement.names):
            raise ValueError(f"{where}: `from {statement.module} import *` is not supported; name what the test uses")
        modules = [statement.module]
    else:
        modules = [alias.name for alias in statement.names]
    for module in modules:
        if module.split(".")[0] not in sys.stdlib_module_names:
            raise ValueError(
                f"{where} imports {module!r}, which is not in the standard library: the sandbox has only the "
                "standard library, and the program's own names need no import"
            )


class _Names:
    """What each name in a test's asserts stands for (the module docstring's order)."""

    def __init__(self, imports: list[ast.stmt], asserts: list[ast.Assert]) -> None:
        self.imported = {
            alias.asname or (alias.name.split(".")[0] if isinstance(statement, ast.Import) else alias.name)
            for statement in imports for alias in statement.names  # type: ignore[attr-defined]
        }
        self.local = set().union(*(_bound_inside(statement.test) for statement in asserts))
        loads = [node for statement in asserts for node in ast.walk(statement.test) if isinstance(node, ast.Name)]
        self.used = {node.id for node in loads}
        attribute_bases = {
            id(node.value) for statement in asserts for node in ast.walk(statement.test) if isinstance(node, ast.Attribute)
        }
        # A standard-library module only where every use is `module.attr`: a program's function `copy`
        # called as `copy(x)` stays the program's.
        self.modules = {
            name for name in self.used - self.imported - self.local - set(vars(builtins))
            if name in sys.stdlib_module_names and all(id(node) in attribute_bases for node in loads if node.id == name)
        }
        self.program = self.used - self.imported - self.local - set(vars(builtins)) - self.modules
        # A test that names nothing of the program but calls builtins tests a task that shadows them
        # (`assert max([1, 5, 3]) == 5` for "write max"): each builtin it calls is the program's function
        # of that name, which the program must define (phase 1 fails the call otherwise), never the builtin.
        self.shadowed: set[str] = set()
        if not self.program:
            self.shadowed = {
                node.func.id for statement in asserts for node in ast.walk(statement.test)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in vars(builtins) and node.func.id not in self.imported | self.local
            }
            self.program = set(self.shadowed)

    def modules_in(self, trees: Sequence[ast.AST]) -> list[str]:
        found = {node.id for tree in trees for node in ast.walk(tree) if isinstance(node, ast.Name)}
        return sorted(found & self.modules)


def _bound_inside(tree: ast.AST) -> set[str]:
    """Names that comprehensions, lambdas and `:=` bind within `tree`."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.comprehension):
            bound |= {name.id for name in ast.walk(node.target) if isinstance(name, ast.Name)}
        elif isinstance(node, ast.NamedExpr):
            bound.add(node.target.id)
        elif isinstance(node, ast.Lambda):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            bound |= {argument.arg for argument in every if argument is not None}
    return bound


class _ProbeSplitter(ast.NodeTransformer):
    """Replaces each maximal program-side subexpression with `_oxrl_probe(k)`, collecting it as probe k."""

    def __init__(self, names: _Names, where: str) -> None:
        self.names = names
        self.where = where
        self.probes: list[ast.expr] = []

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.expr) and self._program_side(node):
            self.probes.append(node)
            return ast.Call(ast.Name(PROBE_FUNCTION, ast.Load()), [ast.Constant(len(self.probes) - 1)], [])
        if isinstance(node, ast.Call):
            self._check_arguments(node)
        return super().visit(node)

    def _check_arguments(self, call: ast.Call) -> None:
        # A program name handed to the checker's call as it is (`map(square, xs)`, `sorted(xs, key=k)`)
        # would cross from the program as a value, and a function is not plain data: the test could never pass.
        # (`*xs` is left alone: a function cannot be unpacked, so what is unpacked is data.)
        for value in [*call.args, *(keyword.value for keyword in call.keywords if keyword.arg is not None)]:
            if isinstance(value, ast.Name) and value.id in self.names.program:
                raise ValueError(
                    f"{self.where}: `{ast.unparse(call):.80}` passes the program's {value.id!r} itself to a call; "
                    "values cross from the program as plain data, so a function passed this way (`map(f, xs)`, "
                    f"`key=f`) could never pass. Call it in the assert instead (`assert {value.id}(2) == 4`, one "
                    f"assert per case); a value of the program's can be compared as it is (`assert {value.id} == ...`)"
                )

    def _program_side(self, node: ast.expr) -> bool:
        # Only a chain rooted at a program name: an operator, comparison or literal around a program
        # value stays with the checker (in a probe, `f(x) - 3.14` would hand 3.14 to the program and
        # let its `__sub__` decide).
        while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.names.program


def _check_probe(probe: ast.expr, names: _Names, where: str) -> None:
    used = {node.id for node in ast.walk(probe) if isinstance(node, ast.Name)}
    # A `:=` inside the probe binds in the test's scope, where phase 2 would not see it: refused as well.
    walrus = {node.target.id for node in ast.walk(probe) if isinstance(node, ast.NamedExpr)}
    borrowed = (used & names.local) - (_bound_inside(probe) - walrus)
    if borrowed:
        raise ValueError(
            f"{where}: the call `{ast.unparse(probe):.80}` uses {sorted(borrowed)[0]!r}, which the test binds itself "
            "(a comprehension, lambda or :=); the program's calls are evaluated apart from the test's own values, "
            "so write one assert per case (`assert f(1) == 1`, `assert f(2) == 4`)"
        )


def _imports_source(imports: list[ast.stmt], modules: list[str]) -> str:
    statements = [ast.unparse(statement) for statement in imports] + [f"import {module}" for module in modules]
    return "\n".join(statements)


# --- the two sandboxed phases --------------------------------------------------------------------


def count_passed(program: str, tests: Sequence[AssertTest], limits: SandboxLimits) -> tuple[int, int]:
    """(how many of `tests` the program passes, how many of its values were too large to pass back).

    Phase 1 once per test, then phase 2 once for all of them. A value is too large when its record would
    take phase 1's output past `limits.max_output_bytes`; the test that needs it fails.
    """
    records: list[str] = []
    for test in tests:
        request = {"program": program, "imports": test.program_imports, "probes": list(test.probes),
                   "own_names": list(test.own_names), "max_bytes": limits.max_output_bytes}
        result = run_python(_script("harness_run.py"), stdin=json.dumps(request), limits=limits)
        if stopped_by_limit(result):
            break  # this test fails, and the rest are not run
        records.append(result.stdout)
    too_large = sum(_too_large(output, len(test.probes)) for test, output in zip(tests, records))
    if not any("R" in output.splitlines() for output in records):
        return 0, too_large  # the program never ran to its end: no test can pass, and phase 2 need not run
    nonce = secrets.token_hex(16)
    request = {
        "nonce": nonce,
        "tests": [
            {"imports": test.checker_imports, "checks": list(test.checks), "records": output}
            for test, output in zip(tests, records)
        ],
    }
    result = run_python(_script("harness_check.py"), stdin=json.dumps(request), limits=limits)
    return len(_passed(result.stdout, nonce, len(records))), too_large


def _too_large(output: str, probes: int) -> int:
    """Phase 1's `E <k> TooLarge` records (each probe counted once): for the logs, not the score."""
    return len({line for line in output.splitlines() if line in {f"E {k} TooLarge" for k in range(probes)}})


def _passed(output: str, nonce: str, count: int) -> set[int]:
    """The tests phase 2 says passed: lines `<nonce> <index> pass`, nothing else."""
    wanted = {f"{nonce} {index} pass": index for index in range(count)}
    return {wanted[line] for line in output.splitlines() if line in wanted}


@functools.lru_cache(maxsize=None)
def _script(name: str) -> str:
    """A phase's script: the value codec, then the phase itself (the sandbox runs one file, stdlib only)."""
    return (HERE / "harness_codec.py").read_text(encoding="utf-8") + "\n\n" + (HERE / name).read_text(encoding="utf-8")
