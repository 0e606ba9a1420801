"""`oxrl.logging.redaction.redact` masks a secret in every form a server echoing it may write: a table of
(escaping, text) rows, each of which must be redacted whole; base64 of the Authorization header's value down to
the characters that encode its known prefix alone."""

from __future__ import annotations

import base64
import html
import json
import re
from urllib.parse import quote, quote_plus

import pytest

from oxrl.logging.redaction import MASK, redact, register_secret

KEY = "sk-test/6f1c+2a9e=0b7d4e3f"  # `/`, `+` and `=` are what escapers change
ODD = "p\u00e4ss w\u00f6rd&<42>\U0001f511"  # an environment secret may hold anything


@pytest.fixture(autouse=True)
def secrets(monkeypatch):
    register_secret(KEY)
    monkeypatch.setenv("ODD_TOKEN", ODD)


def every_char(template: str):
    return lambda value: "".join(template.format(code=ord(char)) for char in value)


def mixed(value: str) -> str:
    """Each character escaped another way: percent, HTML, JSON, as itself."""
    ways = [lambda c: "%{:02X}".format(ord(c)) if ord(c) < 128 else quote(c), lambda c: f"&#{ord(c)};",
            lambda c: json.dumps(c)[1:-1] if ord(c) > 127 else f"\\u{ord(c):04x}", lambda c: c]
    return "".join(ways[index % 4](char) for index, char in enumerate(value))


ESCAPINGS = {
    "as is": lambda v: v,
    "JSON": lambda v: json.dumps(v)[1:-1],
    "JSON, ASCII only": lambda v: json.dumps(v, ensure_ascii=True)[1:-1],
    "JSON with \\/ (PHP's default)": lambda v: json.dumps(v)[1:-1].replace("/", "\\/"),
    "JSON, every character \\uXXXX": lambda v: "".join(json.dumps(c, ensure_ascii=True)[1:-1] if ord(c) > 0xFFFF
                                                     else f"\\u{ord(c):04x}" for c in v),
    "JSON, upper-case \\uXXXX": lambda v: "".join(f"\\u{ord(c):04X}" if ord(c) < 0x10000 else c for c in v),
    "JSON inside JSON": lambda v: json.dumps(json.dumps(v))[3:-3],
    "JSON inside JSON, PHP": lambda v: json.dumps(json.dumps(v).replace("/", "\\/"))[3:-3],
    "URL, quote": lambda v: quote(v, safe=""),
    "URL, quote_plus": lambda v: quote_plus(v, safe=""),
    "URL, every byte, lower-case": lambda v: "".join(f"%{byte:02x}" for byte in v.encode()),
    "URL, twice": lambda v: quote(quote(v, safe=""), safe=""),
    "URL, %uXXXX": lambda v: "".join(f"%u{ord(c):04X}" if ord(c) < 0x10000 else c for c in v),
    "HTML, html.escape": html.escape,
    "HTML, named": lambda v: v.replace("&", "&amp;").replace("/", "&sol;").replace("+", "&plus;")
    .replace("=", "&equals;").replace("<", "&lt;").replace(">", "&gt;").replace("\u00e4", "&auml;"),
    "HTML, decimal": every_char("&#{code};"),
    "HTML, decimal, leading zeros, no semicolon": every_char("&#000{code}"),
    "HTML, hex": every_char("&#x{code:x};"),
    "HTML, upper-case hex": every_char("&#X{code:X};"),
    "HTML, escaped twice": lambda v: html.escape("".join(f"&#{ord(c)};" for c in v)),
    "backslash before every punctuation mark": lambda v: re.sub(r"([^\w])", r"\\\1", v),
    "backslash \\xHH": lambda v: "".join(f"\\x{ord(c):02x}" if ord(c) < 256 else c for c in v),
    "backslash octal": lambda v: "".join(f"\\{ord(c):03o}" if ord(c) < 256 else c for c in v),
    "backslash \\u{H}": every_char("\\u{{{code:x}}}"),
    "backslash \\UHHHHHHHH": every_char("\\U{code:08x}"),
    "Python repr, unicode_escape": lambda v: v.encode("unicode_escape").decode(),
    "mixed": mixed,
}


@pytest.mark.parametrize("value", [KEY, ODD], ids=["api key", "odd env secret"])
@pytest.mark.parametrize("escaping", ESCAPINGS)
def test_every_escaping_is_redacted(escaping, value):
    written = ESCAPINGS[escaping](value)
    assert redact(f'{{"auth": "Bearer {written}", "n": 1}}') == f'{{"auth": "Bearer {MASK}", "n": 1}}'


HEADERS = ["Bearer ", "user:", "ab:"]  # the value at each of base64's 3 byte offsets (after 7, 5 and 3 bytes)


@pytest.mark.parametrize("prefix", HEADERS)
@pytest.mark.parametrize("alphabet", ["standard", "URL-safe", "standard, JSON \\/"])
def test_base64_of_an_authorization_header_is_redacted(prefix, alphabet):
    encoded = base64.b64encode((prefix + KEY).encode()).decode()
    if alphabet == "URL-safe":
        encoded = encoded.translate(str.maketrans("+/", "-_"))
    written = encoded.replace("/", "\\/") if "JSON" in alphabet else encoded
    out = redact(f"Authorization: Basic {written}!")
    assert out.startswith("Authorization: Basic ") and out.endswith("!")
    kept, masked, tail = out.removeprefix("Authorization: Basic ").removesuffix("!").partition(MASK)
    # Left: only characters that encode the prefix's bits alone, and the padding.
    assert masked == MASK and encoded.startswith(kept.replace("\\/", "/")) and len(kept) <= 8 * len(prefix) // 6
    assert set(tail) <= {"="}


def test_text_without_a_secret_is_unchanged():
    text = 'Score: 7 &amp; \\u002f %2F sk-test/6f1c+2a9e=0b7d4e3 c2stdGVzdC82ZjFj'  # a key's prefix is no key
    assert redact(text) == text
