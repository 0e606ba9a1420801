"""The package's layout: every module imports on its own, no two modules import each other, directly or
through others, and no module imports from a layer above its own (the README's list). Imports inside
functions count: a late import only hides a cycle or an upward edge."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "oxrl"
README = PACKAGE.parent / "README.md"


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
    """The pure maths imports torch and its own types only (no model, config, process group or loop); the
    training strategies import no loop."""
    graph = import_graph()
    for name, imports in graph.items():
        if name.startswith("oxrl.algorithms"):
            assert not {m for m in imports if not m.startswith("oxrl.algorithms")}, name
            path = PACKAGE.parent / Path(*name.split("."))
            source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()
            assert "torch.distributed" not in source and "transformers" not in source, name
        if name.startswith(("oxrl.training", "oxrl.rollout", "oxrl.data", "oxrl.rewards")):
            assert not {m for m in imports if m.startswith("oxrl.loops")}, name


def readme_layers() -> dict[str, int]:
    """Top-level module or package name -> its layer, from the README's `<!-- layers -->` list."""
    text = README.read_text()
    block = text[text.index("<!-- layers -->"):text.index("<!-- /layers -->")]
    return {name: int(number) for number, names in re.findall(r"^(\d+)\. (.+)$", block, re.M)
            for name in names.split()}


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The layer of `oxrl.<top>...`; None for the package root, which stands outside the layers."""
    parts = module.split(".")
    return layers[parts[1]] if len(parts) > 1 else None


def test_every_module_is_in_a_layer_of_the_readme():
    layers = readme_layers()
    assert len(layers) > 15 and layers["cli"] > layers["runner"] > layers["loops"] > layers["algorithms"]
    unplaced = {module.split(".")[1] for module in import_graph() if module != "oxrl"} - set(layers)
    assert not unplaced, f"add these to the README's layer list: {sorted(unplaced)}"


def upward_imports(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Every `a -> b` where b's layer is above a's (the package root, outside the layers, is never counted)."""
    return [f"{name} -> {target}" for name, imports in sorted(graph.items()) for target in sorted(imports)
            if None not in (layer_of(name, layers), layer_of(target, layers))
            and layer_of(target, layers) > layer_of(name, layers)]


def test_upward_imports_finds_one_and_only_one():
    layers = {"algorithms": 5, "loops": 10}
    graph = {"oxrl.loops.sl": {"oxrl.algorithms.sft"}, "oxrl.algorithms.sft": {"oxrl.loops.sl", "oxrl"}}
    assert upward_imports(graph, layers) == ["oxrl.algorithms.sft -> oxrl.loops.sl"]


def test_no_module_imports_from_a_higher_layer():
    upward = upward_imports(import_graph(), readme_layers())
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


# One process loads the third-party modules that oxrl's modules import (listed by a first child importing every one of
# them), with no oxrl module, then forks a child per module to import it alone: oxrl's own modules start from nothing
# in each child, as in a fresh interpreter, at a fraction of the cost.
IMPORT_EACH_ALONE = """
import importlib, os, sys, traceback

def in_child(work):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            message = work()
        except BaseException:
            message = "!" + traceback.format_exc().strip().splitlines()[-1]
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    return message

def every_module():
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except BaseException:
            pass
    return " ".join(name for name in sys.modules if name.split(".")[0] != "oxrl")

for name in sorted(in_child(every_module).split(), key=lambda name: name.count(".")):
    try:
        importlib.import_module(name)
    except BaseException:
        pass  # (a module that imports only inside another's import: the child imports it then)
assert not [name for name in sys.modules if name.split(".")[0] == "oxrl"]
for name in sys.argv[1:]:
    message = in_child(lambda: importlib.import_module(name) and "")
    print(f"{name}\t{message[1:] if message.startswith('!') else message}", flush=True)
"""


@pytest.mark.slow
def test_every_module_imports_on_its_own():
    optional = {"oxrl.rollout.vllm_engine": "vllm", "oxrl.cluster.vllm_transfer": "vllm"}  # need an extra
    modules = [name for name in module_names() if name != "oxrl.__main__"]  # runs the CLI when imported
    done = subprocess.run([sys.executable, "-c", IMPORT_EACH_ALONE, *modules], capture_output=True, text=True,
                          timeout=600, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    results = dict(line.split("\t", 1) for line in done.stdout.splitlines())
    assert sorted(results) == sorted(modules)  # every module was tried
    failures = {name: error for name, error in results.items()
                if error and not (name in optional and optional[name] in error)}
    assert not failures, failures
