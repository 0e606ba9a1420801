"""Every test file (and `path.py::name` test id) that the docs or the code cite exists.

Tests moved into tiers (tests/unit, tests/integration, tests/system) once and left 29 citations pointing at
files that were gone; a reader who follows one finds nothing. This reads every place a citation can sit.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Where citations live: the README, the docs pages, the package (code, registry YAML), benchmarks, examples,
# scripts and the tests' own docstrings and comments.
CITING = ("README.md", "docs/*.md", "oxrl/**/*", "benchmarks/*.py", "examples/**/*", "scripts/*", "tests/**/*.py")
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".sh", ".toml", ".txt", ".json", ".jsonl", ""}

# A path starts at `tests/` (not inside a longer path such as `foo/tests/`) and ends in `.py`, with an optional
# pytest id after `::`.
CITATION = re.compile(r"(?<![\w/.-])(tests/[\w/.-]+?\.py)(?!\w)(?:::(\w+))?")


def citations(text: str) -> list[tuple[str, str | None]]:
    """(path, test name or None) for each test file cited in `text`."""
    return [(match.group(1), match.group(2)) for match in CITATION.finditer(text)]


def defines(source: str, name: str) -> bool:
    """Whether a test module defines a function or class called `name` at its top level."""
    return re.search(rf"^(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", source, re.MULTILINE) is not None


def citing_files() -> list[Path]:
    found = set()
    for pattern in CITING:
        for path in ROOT.glob(pattern):
            # This file's own sample citations are made up on purpose.
            if path == Path(__file__).resolve() or "__pycache__" in path.parts:
                continue
            if path.is_file() and path.suffix in TEXT_SUFFIXES:
                found.add(path)
    return sorted(found)


def test_citation_pattern_finds_paths_and_ids():
    text = "see tests/unit/test_a.py and `tests/system/test_b.py::test_c`, not src/tests/test_d.py or tests/x.pyc"
    assert citations(text) == [("tests/unit/test_a.py", None), ("tests/system/test_b.py", "test_c")]


def test_every_cited_test_path_exists():
    missing = []
    scanned = citing_files()
    assert ROOT / "README.md" in scanned and ROOT / "oxrl" / "models" / "registry.yaml" in scanned
    for path in scanned:
        text = path.read_text(encoding="utf-8", errors="replace")
        for line_number, line in enumerate(text.splitlines(), start=1):
            for cited, name in citations(line):
                where = f"{path.relative_to(ROOT)}:{line_number}"
                target = ROOT / cited
                if not target.is_file():
                    missing.append(f"{where}: {cited} does not exist")
                elif name is not None and not defines(target.read_text(encoding="utf-8"), name):
                    missing.append(f"{where}: {cited} has no test {name}")
    assert not missing, "cited test paths that do not exist:\n" + "\n".join(missing)


# `pip install -e ".[vla]"`, `pip install '/path/to/oxRL[rl]'`: an extra of this project, named in a command.
EXTRA_INSTALL = re.compile(r"pip install[^\n`]*?(?:\.|oxRL)\[([\w,-]+)\]")


def test_every_extra_an_install_command_names_exists():
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    unknown = []
    for path in citing_files():
        for line_number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            for match in EXTRA_INSTALL.finditer(line):
                unknown += [f"{path.relative_to(ROOT)}:{line_number}: [{name}]" for name in match.group(1).split(",")
                            if name not in extras]
    assert not unknown, f"install commands naming extras pyproject.toml does not declare ({sorted(extras)}):\n" + \
        "\n".join(unknown)


def test_no_install_hint_in_the_package_names_the_pypi_oxrl():
    """`oxrl` on PyPI is another project: `pip install 'oxrl[vla]'` installs that one. Only oxrl/dependencies.py,
    which says so, may write the name that way."""
    hint = re.compile(r"""pip install\s+['"]?oxrl\[""")
    named = [f"{path.relative_to(ROOT)}:{number}" for path in citing_files()
             if path.is_relative_to(ROOT / "oxrl") and path != ROOT / "oxrl" / "dependencies.py"
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1) if hint.search(line)]
    assert not named, f"install hints that would install PyPI's other `oxrl`: {named}"


# [text](target) in Markdown, outside code blocks; a target with a scheme (https:, mailto:) is not checked.
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.DOTALL)


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but `-` and `_` dropped, spaces as `-`,
    a repeated heading's anchor suffixed -1, -2, ..."""
    anchors, repeats = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", markdown), re.MULTILINE):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        repeats[anchor] = repeats.get(anchor, -1) + 1
        anchors.add(anchor if repeats[anchor] == 0 else f"{anchor}-{repeats[anchor]}")
    return anchors


def test_heading_anchors_follow_githubs_rule():
    page = "# A\n## The `oxrl eval` flags (2026-11-27)\n```\n# not a heading\n```\n## A\n"
    assert heading_anchors(page) == {"a", "the-oxrl-eval-flags-2026-11-27", "a-1"}


def test_every_link_in_the_readme_and_docs_reaches_its_file_and_heading():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading in {linked.name}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    listed = set(LINK.findall(index))
    pages = {page.name for page in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= listed, f"docs/README.md does not list {sorted(pages - listed)}"
    assert "docs/README.md" in set(LINK.findall((ROOT / "README.md").read_text()))


def test_the_docs_name_the_reward_error_setting_by_its_config_key():
    """The setting is `rl.on_reward_error`; `on_error` is only the internal RewardSpec field's name."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = [f"{page.relative_to(ROOT)}:{number}" for page in pages
             for number, line in enumerate(page.read_text().splitlines(), start=1) if re.search(r"`on_error\b", line)]
    assert not named, f"these name `on_error`, which no config accepts; write rl.on_reward_error: {named}"
