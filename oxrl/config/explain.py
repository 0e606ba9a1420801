"""How a config that cannot load is explained: the file, line and column of bad YAML, and for each invalid key its
dotted name, the value, what is wrong and, for an unknown key, the likely one meant and the valid keys there. Loaded
only when a config fails (oxrl/config/load.py)."""

from __future__ import annotations

import difflib
import reprlib
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from oxrl.config.schema import Config, section_in

# Names users bring from other libraries, mapped to ours (difflib cannot guess these).
SYNONYMS = {
    "learning_rate": "lr",
    "batch_size": "global_batch_size",
    "per_device_train_batch_size": "micro_batch_size_per_device",
    "num_train_epochs": "epochs",
    "model_name_or_path": "name_or_path",
    "lora_r": "rank",
    "r": "rank",
    "lora_alpha": "alpha",
    "warmup": "warmup_steps",
}

QUOTED_CHARS = 200  # of a value quoted in an error message
# Of a validator's message: ours list the valid choices, and may quote the value, which must stay bounded.
MESSAGE_CHARS = 2000
MAX_REPORTED_ERRORS = 20  # problems listed in one error; the count of the rest follows


def bounded(value: Any, limit: int = QUOTED_CHARS) -> str:
    """A value as an error message may quote it: a bounded repr, whatever its size or depth."""
    if isinstance(value, str):
        text = value
    else:
        quote = reprlib.Repr()  # Python 3.11's takes no arguments
        quote.maxlevel, quote.maxstring, quote.maxother = 3, QUOTED_CHARS, QUOTED_CHARS
        quote.maxdict = quote.maxlist = quote.maxtuple = quote.maxset = 6
        text = quote.repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


def yaml_error(error: yaml.YAMLError | RecursionError, text: str, where: str) -> str:
    """`where` (a file, an override), the 1-based line and column, what PyYAML found wrong, the line marked.

    PyYAML's own message names the source `"<unicode string>"` and counts lines from 0.
    """
    if isinstance(error, RecursionError):
        return f"{where}: not a config: its YAML is nested too deep to read"
    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return f"{where}: not valid YAML: {bounded(str(error))}"
    mark = error.problem_mark
    message = f"{where}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {error.problem}"
    if error.context and error.context_mark is not None:
        start = error.context_mark
        message += f" ({error.context} that starts at line {start.line + 1}, column {start.column + 1})"
    lines = text.splitlines()
    if mark.line < len(lines):
        line, column = lines[mark.line], mark.column
        if len(line) > QUOTED_CHARS:  # show the part of a long line around the mark
            start = max(0, column - QUOTED_CHARS // 2)
            line, column = line[start:start + QUOTED_CHARS], column - start
        message += f"\n    {line}\n    {' ' * column}^"
    return message


def fields_at(location: tuple, model: type[BaseModel] = Config) -> list[str]:
    """The valid field names of the section at `location` (for suggestions)."""
    current: Any = model
    for part in location:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return []
        annotation = current.model_fields[part].annotation
        current = section_in(annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def describe_errors(error: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    items = error.errors()
    for item in items[:MAX_REPORTED_ERRORS]:
        location = tuple(item["loc"])
        dotted = bounded(".".join(str(p) for p in location))
        kind = item["type"]
        if kind == "extra_forbidden":
            name = str(location[-1])
            valid = fields_at(location[:-1])
            close = [SYNONYMS[name]] if SYNONYMS.get(name) in valid else difflib.get_close_matches(name, valid, n=1)
            hint = f" Did you mean `{'.'.join(str(p) for p in location[:-1] + (close[0],))}`?" if close else ""
            lines.append(f"  - unknown key `{dotted}`.{hint} Valid keys here: {', '.join(valid)}")
        elif kind == "missing":
            lines.append(f"  - missing required key `{dotted}`")
        elif isinstance(item.get("input"), dict):  # a check across a section's keys: the message names them
            where = f"in `{dotted}`: " if dotted else ""
            lines.append(f"  - {where}{bounded(item['msg'].removeprefix('Value error, '), MESSAGE_CHARS)}")
        else:
            value = item.get("input")
            # A field validator's own message (e.g. an unknown algorithm.name) arrives prefixed "Value error, ".
            lines.append(f"  - `{dotted}` = {bounded(value) if not isinstance(value, str) else repr(bounded(value))}: "
                         f"{bounded(item['msg'].removeprefix('Value error, '), MESSAGE_CHARS)}")
    if len(items) > MAX_REPORTED_ERRORS:
        lines.append(f"  - ... and {len(items) - MAX_REPORTED_ERRORS} more")
    return "\n".join(lines)
