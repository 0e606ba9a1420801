"""Markdown reference of every config field, generated from the schema (never hand-maintained)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from oxrl.config.schema import section_in
from oxrl.config.schema import Config, ReadOnly, rules_of


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    return text or str(annotation).replace("typing.", "")


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()
        return "(section)" if isinstance(value, BaseModel) else f"`{value!r}`"
    return f"`{field.default!r}`"


def _read_only(rules: Sequence[ReadOnly]) -> str:
    """Who reads a setting (or a section, its `keep` fields aside), as its `ReadOnly` rules say."""
    said = [rule.reader + (f" (except {', '.join(rule.keep)})" if rule.keep else "") for rule in rules]
    return f"Read only {'; and '.join(said)}." if said else ""


def _section(model: type[BaseModel], prefix: str, out: list[str], rules: Sequence[ReadOnly] = ()) -> None:
    rows = []
    nested = []
    for name, field in model.model_fields.items():
        inner = section_in(field.annotation)
        key = f"{prefix}{name}"
        if inner is not None and not str(field.annotation).startswith("list"):
            nested.append((key, inner, rules_of(model, name)))
            continue
        if inner is not None:  # a list of sections
            nested.append((f"{key}[]", inner, []))
        type_text = _type_name(field.annotation).replace("|", "\\|")
        # (a description written as the field's docstring keeps its line breaks: one line in a table row)
        described = " ".join(" ".join(text.split()) for text in (field.description, _read_only(rules_of(model, name)))
                             if text)
        rows.append(f"| `{key}` | {type_text} | {_default(field)} | {described} |")
    if rows:
        out.append(f"\n### `{prefix.rstrip('.') or 'top level'}`\n")
        if rules:
            out.append(_read_only(rules) + "\n")
        out.append("| key | type | default | description |\n|---|---|---|---|")
        out.extend(rows)
    for key, inner, section_rules in nested:
        _section(inner, f"{key}.", out, section_rules)


def config_reference() -> str:
    out = [
        "# Config reference",
        "",
        "Generated from `oxrl/config/schema.py` by `oxrl config-reference`; do not edit by hand.",
        "Set any field in the YAML file or on the command line as a dotted override, e.g. `train.optim.lr=1e-6`.",
    ]
    _section(Config, "", out)
    return "\n".join(out) + "\n"
