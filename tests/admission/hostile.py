"""Hostile values for the fuzz tests, and the ``Arg`` record that says which of them an argument must refuse.

Every argument of a fuzzed call is an :class:`Arg`: a strategy of valid values, a strategy of
values the argument must refuse (``wrong``: the call raises ``InvalidInputError``), and a
strategy of unusual values of the right type that it may accept or refuse (``odd``: any
documented outcome). A fuzz test makes one argument hostile (``wrong`` or ``odd``) and keeps
every other one valid, so each check is reached with the value under test.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from pathlib import PurePosixPath
from typing import Any

import attrs
from hypothesis import strategies as st

from admission_plane.errors import AdmissionError, InvalidInputError

MAX_SAFE = 2**53 - 1
#: A string of 100 000 characters (a huge argument; every identifier refuses it).
HUGE = "x" * 100_000
#: Every character, lone surrogates and controls included.
ANY_CHARACTER = st.characters(exclude_categories=())
ANY_TEXT = st.text(ANY_CHARACTER, max_size=20)


class Opaque:
    """An object of no useful type (no attributes, not callable)."""

    def __repr__(self) -> str:
        return "Opaque()"


#: Containers nested a few levels deep, of scalars of every kind.
NESTED = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(ANY_CHARACTER, max_size=4)
    | st.binary(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
#: Scalars and objects that are neither text nor an integer nor callable.
OTHER_TYPES = st.one_of(
    st.none(),
    st.binary(max_size=8),
    st.binary(max_size=8).map(bytearray),
    st.sampled_from([b"", b"x" * 64, b"\x00", memoryview(b"abc"), Opaque(), 1j, PurePosixPath("x"), frozenset({1})]),
    NESTED.filter(lambda value: isinstance(value, list | tuple | dict)),
)
#: Numbers that are not a safe ``int``: floats (NaN, infinities, integral ones), bools, decimals, fractions.
NOT_AN_INT = st.one_of(
    st.booleans(),
    st.floats(),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5_000.0, 1.5, Decimal(5_000), Fraction(5_000, 1), 5e300]),
    st.sampled_from(["5000", "0", "-1", " 5", "1e3", "nan", ""]),
)
#: Integers outside 0..2**53 - 1 (the range of every timestamp and count).
OUT_OF_RANGE = st.one_of(
    st.sampled_from([-1, -(2**53), MAX_SAFE + 1, 2**53 + 1, 2**63, 2**63 - 1, 2**64, -(2**63) - 1, 10**400]),
    st.integers(max_value=-1),
    st.integers(min_value=MAX_SAFE + 1),
)
#: Strings no identifier accepts: empty, blank, padded, with NUL, controls or lone surrogates, too long, huge.
BAD_IDENTIFIER_TEXT = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "\t",
            " x",
            "x ",
            "x\n",
            "a\0b",
            "\0",
            "\x01",
            "\x7f",
            "a\x1fb",
            "\ud800",
            "a\udcffb",
            "\ufeff\ud83d",
            "y" * 257,
            HUGE,
        ]
    ),
    st.tuples(ANY_TEXT, st.sampled_from(["\0", "\n", "\x1b", "\ud800", "\udfff"]), ANY_TEXT).map("".join),
)
#: Text that may or may not be a valid value (the call may accept it or refuse it, either as documented).
ODD_TEXT = st.one_of(
    ANY_TEXT, st.sampled_from(["x", "0", "-1", "head", "é", "\u00a0x", "x" * 256, "NULL", "'; DROP TABLE leases; --"])
)
NOT_TEXT = st.one_of(OTHER_TYPES, NOT_AN_INT.filter(lambda value: not isinstance(value, str)), st.integers())
NOT_AN_INT_AT_ALL = st.one_of(OTHER_TYPES, NOT_AN_INT)
NOT_CALLABLE = st.one_of(OTHER_TYPES, NOT_AN_INT, st.integers(), ANY_TEXT)
UUID4 = st.uuids(version=4).map(str)
#: What no child's argv is: no list or tuple, an empty one, one with an empty program, NUL, a lone surrogate, bytes.
NOT_A_COMMAND = st.one_of(
    OTHER_TYPES.filter(lambda value: not isinstance(value, list | tuple)),
    NOT_AN_INT,
    ANY_TEXT,
    st.sampled_from([[], [""], ["a\0b"], [1], [b"true"], ["\ud800"], [None], ["true", 2], ("",), ["true", "\0"]]),
)


@attrs.frozen
class Arg:
    """One argument of a fuzzed call: its valid values, the values it must refuse, and odd ones it may take."""

    valid: st.SearchStrategy[Any]
    wrong: st.SearchStrategy[Any] = attrs.field(factory=st.nothing)
    odd: st.SearchStrategy[Any] = attrs.field(factory=st.nothing)


def hostile(arg: Arg) -> st.SearchStrategy[tuple[str, Any]]:
    """``("wrong", value)`` or ``("odd", value)`` for ``arg``."""
    return st.one_of(arg.wrong.map(lambda value: ("wrong", value)), arg.odd.map(lambda value: ("odd", value)))


def attempt(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, AdmissionError | None]:
    """``call``'s result and ``None``, or ``None`` and the :class:`AdmissionError` it raised (anything else escapes)."""
    try:
        return call(*args, **kwargs), None
    except AdmissionError as error:
        return None, error


def assert_documented(error: AdmissionError, kind: str) -> None:
    """A refusal of a value the argument must refuse is an ``InvalidInputError``; every refusal is one line."""
    if kind == "wrong":
        assert isinstance(error, InvalidInputError), f"{type(error).__name__}: {error}"
    assert len(str(error).splitlines()) <= 1, f"a message of more than one line: {error}"


def hostile_targets(args: dict[str, Arg]) -> list[str]:
    """The arguments that have hostile values to try."""
    return [name for name, arg in args.items() if not (arg.wrong.is_empty and arg.odd.is_empty)]


def draw_arguments(data: st.DataObject, args: dict[str, Arg], target: str) -> tuple[dict[str, Any], str]:
    """Valid values for every argument but ``target``, a hostile one for it; and how hostile (``wrong``/``odd``)."""
    values: dict[str, Any] = {}
    kind = "valid"
    for name, arg in args.items():
        if name == target:
            kind, values[name] = data.draw(hostile(arg), label=name)
        else:
            values[name] = data.draw(arg.valid, label=name)
    return values, kind


def timestamp(valid: st.SearchStrategy[int]) -> Arg:
    """A non-negative safe integer of milliseconds."""
    return Arg(valid, wrong=st.one_of(NOT_AN_INT_AT_ALL, OUT_OF_RANGE), odd=st.integers(0, MAX_SAFE))


def identifier(valid: st.SearchStrategy[str]) -> Arg:
    """A single-line identifier of 1..256 characters."""
    return Arg(valid, wrong=st.one_of(NOT_TEXT, BAD_IDENTIFIER_TEXT), odd=ODD_TEXT)


def one_of_values(valid: list[Any], wrong: st.SearchStrategy[Any]) -> Arg:
    """An argument with a few valid values (``wrong`` must be refused; any other text is odd)."""
    return Arg(st.sampled_from(valid), wrong=wrong, odd=ODD_TEXT)


def callable_arg(valid: Callable[..., Any], *, optional: bool = False) -> Arg:
    """A callback: anything not callable (``None`` too, unless ``optional``) is refused."""
    wrong = NOT_CALLABLE.filter(lambda value: not (optional and value is None))
    return Arg(st.just(valid), wrong=wrong, odd=st.sampled_from([print, len, object, lambda *_: None]))


def random_uuid() -> str:
    """A fresh lowercase UUID v4."""
    return str(uuid.uuid4())


__all__ = [
    "ANY_TEXT",
    "BAD_IDENTIFIER_TEXT",
    "HUGE",
    "MAX_SAFE",
    "NESTED",
    "NOT_AN_INT",
    "NOT_AN_INT_AT_ALL",
    "NOT_A_COMMAND",
    "NOT_CALLABLE",
    "NOT_TEXT",
    "ODD_TEXT",
    "OTHER_TYPES",
    "OUT_OF_RANGE",
    "UUID4",
    "Arg",
    "Opaque",
    "assert_documented",
    "attempt",
    "callable_arg",
    "draw_arguments",
    "hostile",
    "hostile_targets",
    "identifier",
    "one_of_values",
    "random_uuid",
    "timestamp",
]
