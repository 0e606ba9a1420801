r"""The forms a secret may be written in, for `oxrl.logging.redaction`: a server echoing a header writes it in its own.

Each character as itself or escaped by any escaping a server applies, mixed freely: JSON's `\/` and `\u002f`,
backslash escapes `\-`, `\x2f`, `\057`, percent-encoding `%2F` of its UTF-8 bytes and `+` for a space, HTML
character references `&sol;`, `&#47;`, `&#x2F;`, each escape doubled any number of times (JSON inside JSON,
`%252F`, `&amp;#47;`). And base64, standard or URL-safe, of any text holding it (the Authorization header's
`Bearer <key>`, basic auth's `user:key`): the characters that encode the value's bytes alone, and the one on each
side that mixes them with its neighbours'.
"""

from __future__ import annotations

import base64
import functools
import html.entities
import re
from collections import defaultdict


def masked(text: str, values: tuple[str, ...], mask: str) -> str:
    """`text` with each of `values`, in every written form, replaced by `mask`."""
    pieces, written = [], 0
    for found in secrets_pattern(values).finditer(text):
        start = found.start()
        # A base64 core's neighbour mixes the value's bits with the text's around it: masked too.
        if found["base64"] is not None and (edge := _BASE64_BEFORE.search(text, max(written, start - 2), start)):
            start = edge.start()
        pieces += [text[written:start], mask]
        written = found.end()
    return "".join(pieces) + text[written:]


@functools.lru_cache(maxsize=32)
def secrets_pattern(values: tuple[str, ...]) -> re.Pattern:
    """One pattern matching every written form of each of `values` (the module's docstring lists them); the base64
    forms in the group `base64`, each with the character after it that mixes the value's bits with the next."""
    cores = sorted({core for value in values for core in base64_cores(value)}, key=lambda core: (-len(core), core))
    # Every form starts with its first character itself or with one of `\%&+`: a position where neither is
    # skipped at once, instead of trying every alternative there.
    starts = re.escape("".join(sorted({text[0] for text in values + tuple(cores)} | set("\\%&+"))))
    return re.compile(f"(?=[{starts}])(?:" + "|".join(_spelled(value) for value in values)
                      + "|(?P<base64>" + "|".join(_spelled(core) + f"{_BASE64_CHAR.pattern}?" for core in cores) + "))")


# A base64 character, standard or URL-safe (`/` perhaps JSON-escaped); and one that ends where a search ends.
_BASE64_CHAR = re.compile(r"(?:[A-Za-z0-9+/_-]|\\/)")
_BASE64_BEFORE = re.compile(_BASE64_CHAR.pattern + r"\Z")


def base64_cores(value: str) -> set[str]:
    """The base64 characters that encode `value`'s UTF-8 bytes alone, wherever it starts in the encoded text (at
    each of the 3 byte offsets a base64 group has), in the standard and the URL-safe alphabet."""
    data = value.encode()
    cores = set()
    for shift in range(3):
        encoded = base64.b64encode(bytes(shift) + data).decode()
        # Character i holds bits [6i, 6i + 6); the value's are [8 shift, 8 (shift + len)).
        core = encoded[-(-8 * shift // 6): 8 * (shift + len(data)) // 6]
        cores |= {core, core.translate(str.maketrans("+/", "-_"))}
    return cores


def _spelled(value: str) -> str:
    """A pattern for `value` with each character in any of its forms (`_char_forms`)."""
    return "".join(_char_forms(char) for char in value)


@functools.lru_cache(maxsize=4096)
def _char_forms(char: str) -> str:
    """A pattern for one character as a server may write it: itself; after one or more backslashes (`\\/`, `\\-`,
    an escaped escape), or as a backslash escape `\\xHH`, `\\uHHHH` (a UTF-16 surrogate pair beyond the BMP),
    `\\UHHHHHHHH`, `\\u{H}` or octal; percent-encoded (`%2F`, its UTF-8 bytes; `%u002F`; `+` for a space; the `%`
    itself encoded again any number of times); an HTML character reference, named, decimal or hex (the `&` itself
    encoded again any number of times). Hex digits in any case, with any leading zeros."""
    code = ord(char)
    if code < 0x10000:
        utf16 = rf"u0*{code:x}"
    else:  # a surrogate pair
        high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
        utf16 = rf"u0*{high:x}\\+u0*{low:x}"
    escapes = [utf16, rf"U0*{code:x}", rf"u\{{0*{code:x}\}}"] + ([rf"x0*{code:x}", rf"0*{code:o}"] if code < 256 else [])
    forms = [re.escape(char), r"\\+" + re.escape(char), r"\\+(?i:" + "|".join(escapes) + ")"]
    forms.append("".join(rf"%(?:25)*(?i:{byte:02x})" for byte in char.encode()))
    forms.append(rf"%(?:25)*(?i:u0*{code:x})")
    if char == " ":
        forms.append(r"\+")
    references = [rf"#0*{code};?", rf"#(?i:x0*{code:x});?"] + [re.escape(name) for name in _ENTITY_NAMES[char]]
    forms.append(r"&(?:amp;)*(?:" + "|".join(references) + ")")
    return "(?:" + "|".join(forms) + ")"


def _entity_names() -> dict[str, list[str]]:
    """HTML5's named character references of each single character (`/`: `sol;`, `amp` and `amp;` for `&`)."""
    names = defaultdict(list)
    for name, text in html.entities.html5.items():
        if len(text) == 1:
            names[text].append(name)
    for found in names.values():
        found.sort(key=len, reverse=True)  # `amp;` before `amp`: the whole reference is redacted
    return names


_ENTITY_NAMES = _entity_names()  # built once; read only
