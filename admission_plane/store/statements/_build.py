"""Small builders the statement modules share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from sqlalchemy import SQLColumnExpression, bindparam, literal_column
from sqlalchemy.sql.elements import BindParameter, ColumnElement
from sqlalchemy.sql.expression import Delete, Update

from ..model import Lease

StatementT = TypeVar("StatementT", Update, Delete)


def P(key: str) -> BindParameter[Any]:
    """The named bind parameter ``key``, supplied per call (its type comes from the column it meets)."""
    return bindparam(key)


def lit(value: str) -> ColumnElement[str]:
    """A constant string rendered inline (values come from our own enums, never from input)."""
    return literal_column("'" + value.replace("'", "''") + "'")


def one_of(column: SQLColumnExpression[str], values: Iterable[str]) -> ColumnElement[bool]:
    """``column IN (...)`` over constants rendered inline, in a stable order."""
    return column.in_([lit(value) for value in sorted(values)])


def fenced(statement: StatementT) -> StatementT:
    """Restrict an update or delete of ``leases`` to the fence (lease id, owner, generation)."""
    return statement.where(
        Lease.lease_id == P("lease_id"),
        Lease.owner_instance_id == P("owner_instance_id"),
        Lease.generation == P("generation"),
    )


def one() -> ColumnElement[int]:
    """The constant ``1`` of an existence probe."""
    return literal_column("1")


__all__ = ["BindParameter", "P", "fenced", "lit", "one", "one_of"]
