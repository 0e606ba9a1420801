"""User code by reference: the one importer of a user's files and modules (extensions, rewards, environments).

`load_extensions` imports what a config's `extensions:` names (oxrl/extensions.py says what an extension
does); `load_function` finds the callable a reference such as `path/to/file.py:fn` or `pkg.module:fn`
names. It imports nothing of oxRL's, so every layer may use it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ENTRY_POINT_GROUP = "oxrl.extensions"


class ExtensionError(ValueError):
    """An extension cannot be imported, or registers a name that is taken."""


def load_extensions(references: Iterable[str]) -> None:
    """Import each extension once (a second load of the same one is a no-op, so its names stay registered once)."""
    for reference in references:
        what = f"extension {reference!r}"
        if reference.endswith(".py") or "/" in reference or "\\" in reference:
            import_file(Path(reference), what, ExtensionError)
            continue
        found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=reference)
        if found:
            next(iter(found)).load()
        else:
            import_module(reference, what, ExtensionError)


def load_function(reference: str, kind: str, error: type[Exception]) -> Callable[..., Any]:
    """The callable that `reference` names: `path/to/file.py:fn`, `pkg.module:fn` or `pkg.module.fn`.

    `fn` may be dotted (`module:Class.method`, `module:instance`). Raises `error`, worded for a `kind`
    ("reward", "environment"), when the file or module does not exist, has no such attribute, or the
    attribute is not callable. Shared by user rewards and multi-turn environments.
    """
    if reference.endswith(".py"):
        raise error(f"{kind} {reference!r}: name the function too, as in `{reference}:my_{kind}`")
    module_part, separator, attribute = reference.rpartition(":")
    if not separator:  # pkg.module.fn
        module_part, _, attribute = reference.rpartition(".")
    if not module_part or not attribute:
        raise error(
            f"{kind} {reference!r}: expected `pkg.module:function`, `pkg.module.function` or `path/to/file.py:function`"
        )
    if module_part.endswith(".py") or "/" in module_part or "\\" in module_part:
        module = import_file(Path(module_part), f"{kind} {reference!r}", error)
    else:
        module = import_module(module_part, f"{kind} {reference!r}", error)
    target: Any = module
    for name in attribute.split("."):
        if not hasattr(target, name):
            available = sorted(n for n in dir(target) if not n.startswith("_") and callable(getattr(target, n)))
            raise error(
                f"{kind} {reference!r}: {getattr(target, '__name__', module_part)!r} has no attribute {name!r}; "
                f"its public callables are {available}"
            )
        target = getattr(target, name)
    if not callable(target):
        raise error(f"{kind} {reference!r}: {attribute!r} is a {type(target).__name__}, not a function")
    return target


def import_module(name: str, what: str, error: type[Exception]) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as missing:
        if missing.name and name.startswith(missing.name):  # the module itself (or its package) is missing
            raise error(f"{what}: no module named {name!r} (is it installed, or on PYTHONPATH?)") from missing
        raise  # the module exists but one of *its* imports is missing: show the real error


def import_file(path: Path, what: str, error: type[Exception]) -> Any:
    resolved = path.expanduser().resolve()
    if not resolved.is_file():
        raise error(f"{what}: file {str(path)!r} not found (resolved to {str(resolved)!r})")
    # A unique module name per file, so that two `rewards.py` in different folders do not collide;
    # registered in sys.modules because dataclasses and pickle look modules up there.
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    module_name = f"oxrl_user_{resolved.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise error(f"{what}: {str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]  # do not leave a half-imported module behind
        raise
    return module
