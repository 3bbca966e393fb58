"""The two errors of this package: a refused operation, named by its bare code, and a malformed record.

Every refusal is a :class:`TmuxOwnerError` whose ``code`` (and ``str()``) is the bare code
the original TypeScript implementation (the seed) throws, e.g. ``generation_replay``,
``immutable_record_conflict``, ``immutable_record_corrupt``, ``verdict_lock_contended``.
"""

from __future__ import annotations

INVALID_RECORD = "invalid_record"


class TmuxOwnerError(Exception):
    """A lifecycle operation refused; ``code`` (and ``str()``) is the seed's bare code."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code

    def __str__(self) -> str:
        return self.code


class InvalidRecordError(TmuxOwnerError, ValueError):
    """A value does not have the exact shape the seed accepts for a record; ``record`` names the record or field."""

    def __init__(self, record: str) -> None:
        super().__init__(INVALID_RECORD)
        self.record = record

    def __str__(self) -> str:
        return f"{INVALID_RECORD}: {self.record}"
