"""Output that the docs quote is what the program prints now: the `oxrl models` sample in docs/models.md."""

import re
from pathlib import Path

from oxrl.models.catalog import catalog_frame, catalog_row
from oxrl.models.registry import find_model, load_registry

DOCS = Path(__file__).resolve().parents[2] / "docs"


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
