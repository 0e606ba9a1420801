"""scripts/reading_path.py counts what a reader reads: code lines, not blank lines, comments or docstrings
(a module's, class's or function's, and an attribute's: PEP 257's string right after an assignment)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reading_path.py"

SOURCE = '''"""Module docstring,
on two lines."""

import os  # a comment after code


class Section:
    """Class docstring."""

    size: int = 3
    """The attribute's docstring,
    on two lines."""
    name = "x"
    "A one-line attribute docstring."

    def method(self):
        """Method docstring."""
        # only a comment
        os.getcwd()
        "a bare string after a call: not documentation of anything, so it counts"
        return os.path.join("""a string in code""",
                            self.name)
'''


def _script():
    spec = importlib.util.spec_from_file_location("reading_path", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_code_lines_counts_code_and_skips_comments_and_every_kind_of_docstring():
    module = _script()
    # By hand: `import os`, `class Section:`, `size: int = 3`, `name = "x"`, `def method(self):`, `os.getcwd()`,
    # the bare string after it, `return ...` and its continuation line.
    assert module.code_lines(SOURCE) == 9
    # The class's docstring replaced by an assignment: one more line of code.
    assert module.code_lines(SOURCE.replace('"""Class docstring."""', 'x = 1')) == 10


def test_uncalled_lines_are_the_functions_whose_bodies_did_not_run():
    module = _script()
    lines = SOURCE.splitlines()
    body = next(n for n, line in enumerate(lines, 1) if "os.getcwd()" in line)
    # Only the class body ran (the import): `method` was never called, so its 5 code lines (`def`, the call, the
    # bare string, `return` and its continuation) could go elsewhere; its docstring and comment are not code.
    assert module.uncalled_lines(SOURCE, {4, 7, 10, 13}) == 5
    assert module.uncalled_lines(SOURCE, {4, 7, 10, 13, body}) == 0  # called: it stays
    decorated = SOURCE.replace("    def method(self):", "    @staticmethod\n    def method(self):")
    assert module.uncalled_lines(decorated, {4, 7, 10, 13}) == 6  # its decorator goes with it
