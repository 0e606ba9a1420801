"""How deep a JSON text nests, measured without parsing it.

Parsers recurse once per level of nesting: pyarrow's JSON reader (what `datasets` uses) crashes the whole process
with a segmentation fault on a row nested some 20,000 levels deep, and Python's `json` raises RecursionError
near 1,000. No training row needs more than a few levels, so a record nested deeper than MAX_JSON_DEPTH is
an error naming its row, found here before any parser sees it.

The scan is cheap (0.1-0.2 s for a 100,000-row, 13 MB file, as JSON Lines or as one JSON array, which `datasets`
then reads in about 3 s): a line with at most MAX_JSON_DEPTH opening brackets cannot nest deeper, so only a rare long line, or a
JSON array document, is measured, outside its strings (where a bracket is text), as a running sum of +1 per
opening and -1 per closing bracket.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

MAX_JSON_DEPTH = 100  # levels of arrays and objects in one record; chat rows use under ten
# What an error says of such a record (after its file and row).
TOO_DEEP = f"its arrays and objects nest more than {MAX_JSON_DEPTH} levels deep, which no training record needs"

_KEPT = b'[]{},"'  # the structure, and the quotes that delimit strings
_NOT_KEPT = bytes(sorted(set(range(256)) - set(_KEPT)))
_STEP = np.zeros(256, np.int8)
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1
_CHUNK = 1 << 22  # structure bytes summed at once: bounds the scan's memory for a large file


def _structure(text: bytes) -> np.ndarray:
    """The brackets and commas of the JSON text `text` that are outside its strings, as bytes.

    Escapes go first (`\\\\`, then `\\"`: a backslash appears only in strings and always starts a two-character
    escape); then a byte is outside every string when an even number of quotes precede it."""
    kept = np.frombuffer(text.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_KEPT), np.uint8)
    quote = kept == ord('"')
    return kept[~np.logical_xor.accumulate(quote) & ~quote]


def _depths(structure: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(offset, the nesting depth after each byte) of `structure`, a chunk at a time."""
    depth = 0
    for offset in range(0, len(structure), _CHUNK):
        depths = np.cumsum(_STEP[structure[offset:offset + _CHUNK]], dtype=np.int64) + depth
        yield offset, depths
        depth = int(depths[-1])


def too_deep(line: bytes) -> bool:
    """Whether the JSON text `line` nests arrays and objects more than MAX_JSON_DEPTH levels deep."""
    if line.count(b"[") + line.count(b"{") <= MAX_JSON_DEPTH:
        return False
    return any(int(depths.max()) > MAX_JSON_DEPTH for _, depths in _depths(_structure(line)))


def too_deep_element(document: bytes) -> int | None:
    """For a JSON array document: the 1-based number of its first element nested more than MAX_JSON_DEPTH levels
    deep (the array itself not counted), or None."""
    if document.count(b"[") + document.count(b"{") <= MAX_JSON_DEPTH + 1:
        return None
    structure = _structure(document)
    elements = 1
    for offset, depths in _depths(structure):
        commas = structure[offset:offset + len(depths)] == ord(",")
        deeper = np.flatnonzero(depths > MAX_JSON_DEPTH + 1)
        if deeper.size:
            return elements + int(np.count_nonzero(commas[: deeper[0]] & (depths[: deeper[0]] == 1)))
        elements += int(np.count_nonzero(commas & (depths == 1)))
    return None
