"""Plain data across the sandbox's pipes: the one format the checker and the program's side share.

Stdlib only, never imported by the package: :mod:`.sandbox_launcher` reads this file's text and
runs it in the checker, and prepends it to the harness that runs in the program's interpreter.

Only plain data crosses: None, bool, int, float, complex, str, bytes, Fraction, Decimal, and lists, tuples, dicts,
sets and frozensets of them. A value of any other type (a function, a class instance, a
generator) stays where it is and crosses as a reference the other side can only call, read
attributes of, iterate, measure and print (``["r", id]``). A subclass of a plain type crosses as
its base type's own content (read with the base type's methods), so an ``int`` whose ``__eq__``
always says True arrives as the plain int it holds. The decoder trusts nothing: wrong tags,
shapes, depths or sizes are a ``WireError``.

The two directions travel differently, so the program's side imports no ``json`` (its ``re``
import would cost every test's process its start-up): the checker's requests (trusted) go as
length-prefixed ``marshal`` frames; the program's answers come back as JSON lines written by
:func:`to_json`, which the checker reads with the strict JSON parser and :func:`decode`.
"""

import marshal
import sys

try:
    from _json import encode_basestring_ascii as _quoted  # the C function json itself uses
except ImportError:  # another Python: the pure one
    from json.encoder import encode_basestring_ascii as _quoted

MAX_DEPTH = 64


class WireError(ValueError):
    """A message that is not plain data in this format."""


class Ref:
    """A value that stayed on the other side, by its number there."""

    __slots__ = ("id",)

    def __init__(self, ref_id):
        self.id = ref_id


def encode(value, keep, depth=0, odd=None):
    """``value`` as JSON-able tagged data; ``keep(obj) -> id`` for what is not plain data.
    ``odd`` (a set) collects the names of plain-typed values whose type changes comparison."""
    if depth > MAX_DEPTH:
        raise WireError("nested too deep")
    kind = type(value)
    if value is None:
        return ["n"]
    if kind is bool:
        return ["b", int(value)]
    numbers = sys.modules.get("fractions"), sys.modules.get("decimal")  # their values exist only once imported
    if numbers[0] is not None and kind is numbers[0].Fraction:  # the exact types only: a subclass may lie
        return ["q", int.__repr__(value.numerator), int.__repr__(value.denominator)]
    if numbers[1] is not None and kind is numbers[1].Decimal:
        return ["D", numbers[1].Decimal.__str__(value)]
    for base, tag in ((int, "i"), (float, "f"), (complex, "c"), (str, "s"), (bytes, "y")):
        if issubclass(kind, base):  # type(), never __class__ (a property can claim any class)
            if kind is not base and odd is not None and _compares_oddly(kind, base):
                odd.add(kind.__name__)
            return _scalar(value, base, tag)
    for base, tag in ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F")):
        if issubclass(kind, base):
            if kind is not base and odd is not None and _compares_oddly(kind, base):
                odd.add(kind.__name__)
            return [tag, [encode(v, keep, depth + 1, odd) for v in base.__iter__(value)]]
    if issubclass(kind, dict):
        if kind is not dict and odd is not None and _compares_oddly(kind, dict):
            odd.add(kind.__name__)
        return ["d", [[encode(k, keep, depth + 1, odd), encode(v, keep, depth + 1, odd)] for k, v in dict.items(value)]]
    return ["r", keep(value)]


def _compares_oddly(kind, base):
    return any(getattr(kind, name, None) is not getattr(base, name, None) for name in ("__eq__", "__ne__", "__bool__"))


def _scalar(value, base, tag):
    if base is int:
        return [tag, int.__repr__(value)]
    if base is float:
        return [tag, float.hex(value)]
    if base is complex:
        return [tag, float.hex(value.real), float.hex(value.imag)]
    if base is str:
        return [tag, str.__getitem__(value, slice(None))]
    return [tag, bytes.hex(bytes.__getitem__(value, slice(None)))]


def decode(data, depth=0, ref=Ref):
    """The plain value of tagged ``data``; a reference becomes ``ref(id)`` (a :class:`Ref`)."""
    if depth > MAX_DEPTH:
        raise WireError("nested too deep")
    if not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise WireError("not a tagged value")
    tag, rest = data[0], data[1:]
    try:
        if tag == "n" and not rest:
            return None
        if tag == "b" and rest in ([0], [1]):
            return bool(rest[0])
        if tag == "i" and _strings(rest, 1) and len(rest[0]) <= 5000:
            return int(rest[0])
        if tag == "f" and _strings(rest, 1):
            return float.fromhex(rest[0])
        if tag == "c" and _strings(rest, 2):
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
        if tag == "q" and _strings(rest, 2) and max(map(len, rest)) <= 5000:
            import fractions  # noqa: PLC0415  (each test's process starts with this file: import only if used)

            return fractions.Fraction(int(rest[0]), int(rest[1]))
        if tag == "D" and _strings(rest, 1) and len(rest[0]) <= 5000:
            import decimal  # noqa: PLC0415  (as fractions above)

            return decimal.Decimal(rest[0])
        if tag == "s" and _strings(rest, 1):
            return rest[0]
        if tag == "y" and _strings(rest, 1):
            return bytes.fromhex(rest[0])
        if tag == "r" and len(rest) == 1 and type(rest[0]) is int:
            return ref(rest[0])
        if tag in "ltSF" and len(rest) == 1 and isinstance(rest[0], list):
            items = [decode(v, depth + 1, ref) for v in rest[0]]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d" and len(rest) == 1 and isinstance(rest[0], list):
            pairs = rest[0]
            if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise WireError("a dict item is not a pair")
            return {decode(k, depth + 1, ref): decode(v, depth + 1, ref) for k, v in pairs}
    except (TypeError, ValueError, ArithmeticError) as err:  # an unhashable key, a bad number
        raise WireError(f"bad {tag!r} value: {err}") from None
    raise WireError(f"unknown tag or shape {tag!r}")


def _strings(rest, n):
    return len(rest) == n and all(isinstance(s, str) for s in rest)


def to_json(value):
    """A message of lists, strings and ints as one JSON line (bytes); the program's answers."""
    return (_json_text(value) + "\n").encode()


def _json_text(value):
    kind = type(value)
    if kind is str:
        return _quoted(value)
    if kind is int:
        return int.__repr__(value)
    if kind is list:
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    raise TypeError(f"a {kind.__name__} in a message")


def loads(line):
    """One answer of the program's side: a JSON list whose first item is a string (the checker's)."""
    import json  # noqa: PLC0415  (the checker's only: the program's side must not pay for it)

    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as err:
        raise WireError(f"not JSON: {err}") from None
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise WireError("not a message")
    return message


def frame(message):
    """A request as a length-prefixed marshal frame: from the checker only (marshal trusts its input)."""
    data = marshal.dumps(message)
    return len(data).to_bytes(4, "big") + data


def read_frame(stream):
    """The next request from ``stream`` (a buffered binary file), or None at its end."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    return marshal.loads(stream.read(int.from_bytes(head, "big")))
