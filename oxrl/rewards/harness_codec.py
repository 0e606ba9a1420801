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
    bytearray ["y", "00ff"]   array.array ["Ar", typecode, "00ff"]   datetime.timedelta ["Tr", [d, s, us]]
    datetime.date ["Td", [y, m, d]]   datetime.time ["Tt", [h, m, s, us], fold, tz]
    datetime.datetime ["TD", [y, mo, d, h, mi, s, us], fold, tz]   datetime.timezone ["Tz", offset, name or null]
    a namedtuple ["nt", "Point", ["x", "y"], [...]]   an enum member ["En", kind, "Color", pairs, value]

Exact types only (`type(v) is int`, never isinstance): an int subclass, an object with its own
`__eq__`, a numpy array are not plain data and cannot be encoded, so no behaviour of the program's
objects reaches the comparison. Two kinds of the program's own classes are data all the same, and
cross as data only: a namedtuple (a direct subclass of tuple with `_fields`: its items, read with
tuple's own iterator, its name and field names; it decodes as a fresh `collections.namedtuple`, so any
method or `__eq__` the program gave it stays behind) and an enum member (of a class whose metaclass is
exactly enum's, an Enum, IntEnum, Flag, IntFlag or StrEnum without other mixins: every member's name and
value; it decodes as the member of an enum class rebuilt from them, the same class for every value of
one checker, so `color() is Color.RED` holds). Ints and floats are exact (hex), nan, infinities and -0.0 included.
An iterator is drained into its items (a program's `map` or generator, for `list(f(x)) == [...]`)
and decodes as an iterator over them. The decoder builds only builtin and standard-library values
and validates every node: its input is untrusted, since the program can write lines of its own.
"""

import functools
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
    if kind is bytearray:
        return ["y", value.hex()]
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
    if kind is _stdlib_type("array", "array"):
        budget[0] -= len(value)
        return ["Ar", value.typecode, value.tobytes().hex()]
    node = _encode_datetime(value, kind, depth, budget)
    if node is None and _is_namedtuple(kind):
        node = ["nt", kind.__name__, list(kind.__dict__["_fields"]), [_encode(item, depth - 1, budget) for item in tuple.__iter__(value)]]
    if node is None and type(kind) is _stdlib_type("enum", "EnumMeta"):
        node = _encode_enum(value, kind, depth, budget)
    if node is None:
        raise NotPlainData(f"not plain data: {kind.__name__}")
    return node


def _encode_datetime(value, kind, depth: int, budget: list[int]):
    """A datetime module value's node, None for another type."""
    if kind is _stdlib_type("datetime", "timedelta"):
        return ["Tr", [value.days, value.seconds, value.microseconds]]
    if kind is _stdlib_type("datetime", "date"):
        return ["Td", [value.year, value.month, value.day]]
    if kind is _stdlib_type("datetime", "timezone"):
        offset = value.utcoffset(None)
        named = value.tzname(None) != kind(offset).tzname(None)  # only a name given on purpose: timezone.utc stays utc
        return ["Tz", _encode(offset, depth - 1, budget), value.tzname(None) if named else None]
    clock = [value.hour, value.minute, value.second, value.microsecond] if kind in (
        _stdlib_type("datetime", "time"), _stdlib_type("datetime", "datetime")) else None
    if clock is None:
        return None
    # A time zone other than a fixed offset (zoneinfo) is not plain data: _encode refuses it.
    zone = ["N"] if value.tzinfo is None else _encode(value.tzinfo, depth - 1, budget)
    if kind is _stdlib_type("datetime", "time"):
        return ["Tt", clock, value.fold, zone]
    return ["TD", [value.year, value.month, value.day, *clock], value.fold, zone]


def _is_namedtuple(kind) -> bool:
    """A class made by `collections.namedtuple` or `typing.NamedTuple` (a direct subclass of tuple with field names)."""
    if type(kind) is not type or kind.__bases__ != (tuple,):  # no metaclass of the program's answers below
        return False
    fields = kind.__dict__.get("_fields")
    return type(fields) is tuple and all(type(name) is str for name in fields)


# An enum kind -> the builtin type its values are also instances of (enum's `_member_type_`).
_ENUM_KINDS = {"IntFlag": int, "Flag": object, "IntEnum": int, "StrEnum": str, "Enum": object}


def _encode_enum(value, kind, depth: int, budget: list[int]):
    enum = sys.modules["enum"]  # loaded: the value is of one of its classes
    names = [name for name in _ENUM_KINDS if hasattr(enum, name) and issubclass(kind, getattr(enum, name))]
    if not names or kind.__dict__.get("_member_type_") is not _ENUM_KINDS[names[0]]:
        raise NotPlainData(f"not plain data: an enum with a mixin of its own ({kind.__name__})")
    members = [[name, _value_of(member, depth, budget)] for name, member in dict.items(kind.__dict__["_member_map_"])]
    return ["En", names[0], kind.__name__, members, _value_of(value, depth, budget)]


def _value_of(member, depth: int, budget: list[int]) -> list:
    # Read from the member's own dict: a `value` property of the program's class says what it likes.
    return _encode(object.__getattribute__(member, "__dict__")["_value_"], depth - 1, budget)


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
    if tag == "y":
        return bytearray.fromhex(_text(args, 1)[0])
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
    if tag == "Ar":
        import array

        typecode, data = _text(args, 2)
        if typecode not in array.typecodes or len(typecode) != 1:
            raise ValueError("malformed value")
        decoded = array.array(typecode)
        decoded.frombytes(bytes.fromhex(data))
        return decoded
    if tag in ("Tr", "Td", "Tt", "TD", "Tz"):
        return _decode_datetime(tag, args, depth)
    if tag == "nt" and len(args) == 3:
        name, fields = args[0], args[1]
        if type(name) is not str or type(fields) is not list or any(type(field) is not str for field in fields):
            raise ValueError("malformed value")
        items = _items(args[2:], depth)
        return _namedtuple_class(name, tuple(fields))(*items)
    if tag == "En" and len(args) == 4 and type(args[0]) is str and type(args[1]) is str and type(args[2]) is list:
        cls = _enum_class(args[0], args[1], json.dumps(args[2]), depth)
        return cls(_decode(args[3], depth - 1))
    raise ValueError(f"malformed value (tag {tag!r:.20})")


def _ints(node, count: int) -> list:
    if type(node) is not list or len(node) != count or any(type(item) is not int for item in node):
        raise ValueError("malformed value")
    return node


def _decode_datetime(tag: str, args: list, depth: int):
    import datetime

    if tag == "Tr" and len(args) == 1:
        days, seconds, microseconds = _ints(args[0], 3)
        return datetime.timedelta(days, seconds, microseconds)
    if tag == "Td" and len(args) == 1:
        return datetime.date(*_ints(args[0], 3))
    if tag == "Tz" and len(args) == 2 and (args[1] is None or type(args[1]) is str):
        offset = _decode(args[0], depth - 1)
        if type(offset) is not datetime.timedelta:
            raise ValueError("malformed value")
        return datetime.timezone(offset) if args[1] is None else datetime.timezone(offset, args[1])
    if tag in ("Tt", "TD") and len(args) == 3 and args[1] in (0, 1) and type(args[1]) is int:
        zone = _decode(args[2], depth - 1)
        if zone is not None and type(zone) is not datetime.timezone:
            raise ValueError("malformed value")
        if tag == "Tt":
            return datetime.time(*_ints(args[0], 4), tzinfo=zone, fold=args[1])
        return datetime.datetime(*_ints(args[0], 7), tzinfo=zone, fold=args[1])
    raise ValueError("malformed value")


@functools.lru_cache(maxsize=256)
def _namedtuple_class(name: str, fields: tuple):
    import collections

    return collections.namedtuple(name, fields)


@functools.lru_cache(maxsize=256)
def _enum_class(kind: str, name: str, members: str, depth: int):
    """The enum `name` rebuilt from its `members` (as encoded: [[name, value], ...]), once per checker, so that
    two values of one enum compare as the program's did."""
    import enum

    pairs = json.loads(members)
    # A dunder "member" would become a method slot of the class (`__eq__`): never one.
    if kind not in _ENUM_KINDS or not hasattr(enum, kind) or type(pairs) is not list or any(
            type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str or pair[0].startswith("__")
            for pair in pairs):
        raise ValueError("malformed value")
    return getattr(enum, kind)(name, [(member, _decode(value, depth - 1)) for member, value in pairs])


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
