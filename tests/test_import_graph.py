"""The package's layout: every module imports on its own, and no two modules import each other,
directly or through others (imports inside functions count: a late import only hides a cycle)."""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "oxrl"


def module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[:3] == ("oxrl", "data", "bundled"):  # data scripts shipped with the package, not modules
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imported_modules(name: str, known: set[str]) -> set[str]:
    """The oxrl modules `name` imports anywhere in its file (`from oxrl.x import y` counts x, or x.y when
    that is a module)."""
    path = PACKAGE.parent / Path(*name.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    known = set(module_names())
    return {name: imported_modules(name, known) for name in known}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_the_package_import_graph_is_acyclic():
    graph = import_graph()
    assert len(graph) > 50 and "oxrl.loops.rl" in graph and graph["oxrl.loops.rl"]  # the graph was really read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_packages_lean_one_way():
    """The pure maths imports no loop, engine or strategy; the training strategies import no loop."""
    graph = import_graph()
    for name, imports in graph.items():
        if name.startswith("oxrl.algorithms"):
            assert not {m for m in imports if not m.startswith(("oxrl.algorithms", "oxrl.config", "oxrl.data.types"))}, name
        if name.startswith(("oxrl.training", "oxrl.rollout", "oxrl.data", "oxrl.rewards")):
            assert not {m for m in imports if m.startswith("oxrl.loops")}, name


@pytest.mark.slow
def test_every_module_imports_on_its_own():
    def import_alone(name: str) -> tuple[str, str]:
        done = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=300)
        return name, done.stderr.strip().splitlines()[-1] if done.returncode else ""

    optional = {"oxrl.rollout.vllm_engine": "vllm", "oxrl.rollout.vllm_transfer": "vllm"}  # need an extra
    modules = [name for name in module_names() if name != "oxrl.__main__"]  # runs the CLI when imported
    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = {name: error for name, error in pool.map(import_alone, modules)
                    if error and not (name in optional and optional[name] in error)}
    assert not failures, failures
