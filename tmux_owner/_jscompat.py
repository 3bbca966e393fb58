"""JavaScript's string, number and JSON rules, as the original TypeScript implementation (the seed) sees them.

Every record is compact JSON, byte-identical to ``JSON.stringify``; lengths count UTF-16
units or UTF-8 bytes where the seed does; numbers are JavaScript's safe integers.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeGuard
from urllib.parse import quote

MAX_SAFE_INTEGER = 2**53 - 1
# Bounds the seed puts on text: one protocol line (a request, a response, a bootstrap
# receipt) and one sanitised diagnostic.
MAX_LINE_BYTES = 16 * 1024
MAX_DIAGNOSTIC_CHARS = 512

# Python's str.strip() is not JavaScript's trim: it also strips U+001C..U+001F and U+0085,
# and keeps U+FEFF.
_JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")


def utf8_length(text: str) -> int:
    """Length in UTF-8 bytes (a lone surrogate counts as its three encoded bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def js_length(value: str) -> int:
    """``String.prototype.length``: UTF-16 code units (a non-BMP character counts 2)."""
    return len(value.encode("utf-16-le")) // 2


def js_trim(value: str) -> str:
    """JavaScript's ``String.prototype.trim``."""
    return value.strip(_JS_WHITESPACE)


def encode_uri_component(value: str) -> str:
    """JavaScript's ``encodeURIComponent`` (leaves ``A-Z a-z 0-9 - _ . ! ~ * ' ( )``)."""
    return quote(value, safe="-_.!~*'()")


def safe_diagnostic(value: str) -> str:
    """The seed's ``safeDiagnostic``: non-printable-ASCII becomes ``?``, cut to 512 characters.

    JavaScript replaces per UTF-16 unit, so a character outside the BMP becomes ``??``;
    after the replacement every character is one unit, so the cut matches ``slice``.
    """
    cleaned = _NOT_PRINTABLE_ASCII.sub(lambda match: "??" if ord(match.group()) > 0xFFFF else "?", value)
    return cleaned[:MAX_DIAGNOSTIC_CHARS]


def is_safe_integer(value: object) -> TypeGuard[int | float]:
    """``Number.isSafeInteger``: an int (never a bool) within +-(2**53 - 1).

    An integral float such as ``12.0`` is accepted, as JavaScript cannot tell it
    from ``12``; JSON parsed by :func:`loads` yields ``12.0`` only for ``12.0`` text.
    """
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer() and abs(value) <= MAX_SAFE_INTEGER
    return False


def js_number(value: Any) -> Any:
    """Store an integral float as the int JavaScript would have parsed (``12.0`` is ``12``)."""
    if isinstance(value, float) and value.is_integer() and is_safe_integer(value):
        return int(value)
    return value


def dumps(value: Any) -> str:
    """Serialise exactly as JavaScript's ``JSON.stringify`` (compact, non-ASCII raw)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps_line(value: Any) -> bytes:
    """The on-disk form of a record: compact JSON, one trailing newline, UTF-8."""
    return (dumps(value) + "\n").encode("utf-8")


def loads(text: str | bytes) -> Any:
    """Parse JSON as JavaScript's ``JSON.parse`` would, but refuse NaN/Infinity and lone surrogates.

    Every refusal is a ``ValueError``, including nesting too deep for Python's recursive
    parser: no record the package reads is more than a few levels deep, so such text is
    malformed input, never an internal failure.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError as error:
        raise ValueError("JSON nested too deeply") from error
    _reject_surrogates(value)
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _reject_surrogates(value: Any) -> None:
    # Iterative, so a structure the parser accepted never exhausts the stack here.
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ValueError("lone surrogate in JSON string") from error
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
