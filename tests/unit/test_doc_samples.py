"""What the docs quote is what the program does now: the `oxrl models` sample in docs/models.md prints so, and the
README's Python and YAML examples name tasks and files that exist and a config that loads."""

import re
from pathlib import Path

from oxrl.models.catalog import catalog_frame, catalog_row
from oxrl.models.registry import find_model, load_registry

DOCS = Path(__file__).resolve().parents[2] / "docs"
README = DOCS.parent / "README.md"


def quoted_output(page: str, command: str) -> list[str]:
    """The lines of the fenced block that starts with `$ <command>` on a docs page, `...` (lines cut) left out."""
    block = re.search(rf"```\n\$ {re.escape(command)}\n(.*?)```", (DOCS / page).read_text(), re.DOTALL)
    assert block, f"docs/{page} has no block quoting `$ {command}`"
    return [line for line in block.group(1).splitlines() if line != "..."]


def test_the_models_table_in_docs_is_what_oxrl_models_prints():
    entries = load_registry()
    head, notes = catalog_frame(entries)
    quoted = quoted_output("models.md", "oxrl models")
    assert quoted[:2] == head
    rows = [line for line in quoted[2:] if line.startswith("| ")]
    assert len(rows) >= 3
    for line in quoted[2:]:
        if line.startswith("| "):  # a model's row: computed from the registry and the memory estimate
            entry = find_model(line.split(" | ")[0].removeprefix("| "), entries)
            assert entry is not None and catalog_row(entry) == line, \
                f"docs/models.md quotes\n{line}\n`oxrl models` prints\n{entry and catalog_row(entry)}"
        else:
            assert line in notes, f"docs/models.md quotes a note `oxrl models` does not print: {line!r}"


def fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


def test_the_readmes_python_example_names_tasks_and_files_that_exist(monkeypatch):
    import ast

    from oxrl.config.presets import task_preset
    from oxrl.data.read import resolve_local

    monkeypatch.chdir(README.parent)
    [block] = fenced(README.read_text(), "python")
    calls = [node for node in ast.walk(ast.parse(block)) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == "train"]
    assert len(calls) >= 2
    for call in calls:
        given = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords if keyword.arg}
        if "task" in given:
            assert task_preset(given["task"])  # an unknown task raises, naming the valid ones
        if "data" in given:  # a shipped file (`bundled:` or in the checkout), not one the reader must bring
            assert resolve_local(given["data"]) is not None, given["data"]


def test_the_readmes_yaml_example_is_a_config_that_loads(tmp_path, monkeypatch):
    from oxrl.config.load import load_config
    from oxrl.data.read import resolve_local

    monkeypatch.chdir(README.parent)  # its data path is relative to the checkout, where the README is read
    [block] = fenced(README.read_text(), "yaml")
    (tmp_path / "example.yaml").write_text(block)
    cfg = load_config(tmp_path / "example.yaml")
    assert cfg.algorithm.name == "dpo"
    assert all(resolve_local(spec.path) is not None for spec in cfg.data.train)
