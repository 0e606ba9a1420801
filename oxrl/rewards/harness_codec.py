"""The format in which the code harness's two sandboxed phases pass a program's values: plain data only.

Standard library only, no oxRL imports: `code_harness` prepends this file's source to the scripts
that run inside the sandbox (`harness_run.py` encodes what the program returned, `harness_check.py`
decodes it and compares). A value is one line of JSON, a tagged array per node:

    None ["N"]   bool ["B", true]   int ["i", "0x1f"]   float ["f", float.hex]   complex ["c", re, im]
    str ["s", "..."]   bytes ["b", "00ff"]   list ["l", [...]]   tuple ["t", [...]]   set ["S", [...]]
    frozenset ["z", [...]]   dict ["d", [[k, v], ...]]   range ["r", start, stop, step]
    collections.Counter ["C", pairs]   OrderedDict ["O", pairs]   defaultdict ["D", pairs]
    deque ["q", [...], maxlen]   fractions.Fraction ["Q", num, den]   decimal.Decimal ["M", "1.10"]
    dict views ["K", [...]] ["V", [...]] ["A", pairs]   an iterator or generator ["I", [...]]

Exact types only (`type(v) is int`, never isinstance): an int subclass, an object with its own
`__eq__`, a numpy array are not plain data and cannot be encoded, so no behaviour of the program's
objects reaches the comparison. Ints and floats are exact (hex), nan, infinities and -0.0 included.
An iterator is drained into its items (a program's `map` or generator, for `list(f(x)) == [...]`)
and decodes as an iterator over them. The decoder builds only builtin and standard-library values
and validates every node: its input is untrusted, since the program can write lines of its own.
"""

import json
import sys

PROBE_FUNCTION = "_oxrl_probe"  # how the checker's rewritten asserts look a program value up
MAX_DEPTH = 100  # nesting of one value
MAX_ITEMS = 1_000_000  # nodes in one value, an iterator's items included

_SEQUENCES = {list: "l", tuple: "t", set: "S", frozenset: "z"}
_BUILDERS = {"l": list, "t": tuple, "S": set, "z": frozenset}
# Standard-library container types, looked up where the program's process has them loaded (a value
# cannot be of a type whose module was never imported): (module, name) -> tag.
_MAPPINGS = {("collections", "Counter"): "C", ("collections", "OrderedDict"): "O", ("collections", "defaultdict"): "D"}
_ITERATOR_TYPES = {
    type(iter(example)) for example in ([], (), "", b"", range(0), set(), {}, {}.values(), {}.items(), reversed([]))
} | {map, filter, zip, enumerate, reversed, type((lambda: (yield))())}
_VIEW_TYPES = {type({}.keys()): "K", type({}.values()): "V", type({}.items()): "A"}


class NotPlainData(ValueError):
    """A value the harness does not pass between phases: not one of the exact types above, too deep or too large."""


def encode(value) -> str:
    """`value` as one line of JSON (the module docstring's format); raises NotPlainData."""
    return json.dumps(_encode(value, MAX_DEPTH, [MAX_ITEMS]), separators=(",", ":"))


def decode(text: str):
    """The value that `text` (one encoded line) stands for; raises ValueError, TypeError or RecursionError when malformed."""
    return _decode(json.loads(text), MAX_DEPTH)


def _encode(value, depth: int, budget: list[int]) -> list:
    budget[0] -= 1
    if depth <= 0 or budget[0] < 0:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} or more than {MAX_ITEMS} items")
    kind = type(value)
    if value is None:
        return ["N"]
    if kind is bool:
        return ["B", value]
    if kind is int:
        return ["i", hex(value)]
    if kind is float:
        return ["f", value.hex()]
    if kind is complex:
        return ["c", value.real.hex(), value.imag.hex()]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["b", value.hex()]
    if kind in _SEQUENCES:
        return [_SEQUENCES[kind], [_encode(item, depth - 1, budget) for item in value]]
    if kind is dict:
        return ["d", _pairs(value, depth, budget)]
    if kind is range:
        return ["r", hex(value.start), hex(value.stop), hex(value.step)]
    if kind in _VIEW_TYPES:
        return [_VIEW_TYPES[kind], [_encode(item, depth - 1, budget) for item in value]]
    for (module, name), tag in _MAPPINGS.items():
        if kind is _stdlib_type(module, name):
            return [tag, _pairs(value, depth, budget)]
    if kind is _stdlib_type("collections", "deque"):
        return ["q", [_encode(item, depth - 1, budget) for item in value], value.maxlen]
    if kind is _stdlib_type("fractions", "Fraction"):
        return ["Q", hex(value.numerator), hex(value.denominator)]
    if kind is _stdlib_type("decimal", "Decimal"):
        return ["M", str(value)]
    if kind in _ITERATOR_TYPES:
        return ["I", [_encode(item, depth - 1, budget) for item in value]]
    raise NotPlainData(f"not plain data: {kind.__name__}")


def _pairs(mapping, depth: int, budget: list[int]) -> list:
    return [[_encode(key, depth - 1, budget), _encode(item, depth - 1, budget)] for key, item in dict.items(mapping)]


def _stdlib_type(module: str, name: str):
    loaded = sys.modules.get(module)
    return getattr(loaded, name, None) if loaded is not None else None


def _decode(node, depth: int):
    if depth <= 0:
        raise ValueError(f"value nested deeper than {MAX_DEPTH}")
    if type(node) is not list or not node or type(node[0]) is not str:
        raise ValueError("malformed value")
    tag, args = node[0], node[1:]
    if tag == "N" and not args:
        return None
    if tag == "B" and len(args) == 1 and type(args[0]) is bool:
        return args[0]
    if tag == "i":
        return int(_text(args, 1)[0], 16)
    if tag == "f":
        return float.fromhex(_text(args, 1)[0])
    if tag == "c":
        real, imag = _text(args, 2)
        return complex(float.fromhex(real), float.fromhex(imag))
    if tag == "s":
        return _text(args, 1)[0]
    if tag == "b":
        return bytes.fromhex(_text(args, 1)[0])
    if tag in _BUILDERS:
        return _BUILDERS[tag](_items(args, depth))
    if tag == "d":
        return dict(_decoded_pairs(args, depth))
    if tag == "r":
        return range(*(int(text, 16) for text in _text(args, 3)))
    if tag in ("K", "V", "A"):
        items = _items(args, depth)
        if tag == "K":
            return dict.fromkeys(items).keys()
        if tag == "V":
            return dict(enumerate(items)).values()
        return dict(_as_pairs(items)).items()
    # Imported here, when such a value arrives: most checks never need these modules.
    if tag in ("C", "O", "D"):
        import collections

        mapping = dict(_decoded_pairs(args, depth))
        if tag == "D":
            return collections.defaultdict(None, mapping)  # the program's default factory stays behind
        return collections.Counter(mapping) if tag == "C" else collections.OrderedDict(mapping)
    if tag == "q" and len(args) == 2 and (args[1] is None or type(args[1]) is int):
        import collections

        return collections.deque(_items(args[:1], depth), args[1])
    if tag == "Q":
        import fractions

        numerator, denominator = (int(text, 16) for text in _text(args, 2))
        return fractions.Fraction(numerator, denominator)
    if tag == "M":
        import decimal

        return decimal.Decimal(_text(args, 1)[0])
    if tag == "I":
        return iter(_items(args, depth))
    raise ValueError(f"malformed value (tag {tag!r:.20})")


def _text(args: list, count: int) -> list:
    if len(args) != count or any(type(arg) is not str for arg in args):
        raise ValueError("malformed value")
    return args


def _items(args: list, depth: int) -> list:
    if len(args) != 1 or type(args[0]) is not list:
        raise ValueError("malformed value")
    return [_decode(item, depth - 1) for item in args[0]]


def _decoded_pairs(args: list, depth: int) -> list:
    if len(args) != 1 or type(args[0]) is not list:
        raise ValueError("malformed value")
    return [(_decode(key, depth - 1), _decode(item, depth - 1)) for key, item in _raw_pairs(args[0])]


def _raw_pairs(pairs: list) -> list:
    if any(type(pair) is not list or len(pair) != 2 for pair in pairs):
        raise ValueError("malformed value")
    return pairs


def _as_pairs(items: list) -> list:
    if any(type(item) is not tuple or len(item) != 2 for item in items):
        raise ValueError("malformed value")
    return items
