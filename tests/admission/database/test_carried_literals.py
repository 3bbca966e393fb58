"""PostgreSQL: the literals a commit carries, written by the library where the driver's would not differ.

What a unit's commit carries travels as literal SQL text (``Tx.closing``); most of it is ``EXECUTE`` of a
statement prepared by name, with plain values (text, integers, ``NULL``, booleans, the ``StrEnum`` states).
Those literals are written by ``admission_plane.store.tx.plain_literal`` instead of psycopg's
``ClientCursor.mogrify`` (which costs a cursor and an adaptation per value). This checks, with
property-based fuzzing, that each literal it writes is exactly the driver's, that the server reads it back as
the value, and that the values it leaves to the driver (a backslash, a zero byte, bytes) are left to it.
"""

from __future__ import annotations

from typing import Any

import pytest
from dbutil import POSTGRES_ONLY, pg_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission_plane.states import RequestState
from admission_plane.store.tx import plain_literal, plain_literals

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(),
    st.text(),
    st.text(alphabet="'\\\"%$;-\n\t\x00é😀", max_size=12),
    st.sampled_from(list(RequestState)),
    st.binary(max_size=8),
)


@pytest.fixture
def raw(database_url: str) -> Any:
    """A psycopg connection to the test database (the driver the literals must agree with)."""
    connection = pg_engine(database_url).raw_connection()
    try:
        yield connection.dbapi_connection
    finally:
        connection.close()


@POSTGRES_ONLY
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=VALUES)
def test_a_plain_literal_is_the_drivers_and_reads_back_as_the_value(raw: Any, value: object) -> None:
    """Whatever the value, ``plain_literal`` either leaves it to the driver (``None``) or writes exactly the
    driver's literal, which the server reads back as the value."""
    from psycopg import ClientCursor

    literal = plain_literal(value)
    if isinstance(value, str) and ("\\" in value or "\x00" in value):
        assert literal is None
    if isinstance(value, bytes):
        assert literal is None
    if literal is None:
        return
    with ClientCursor(raw) as cursor:
        assert literal == cursor.mogrify("%s", [value])
    with raw.cursor() as cursor:
        cursor.execute(f"SELECT ({literal})::text", prepare=False)
        (read,) = cursor.fetchone()
    if value is None:
        assert read is None
    elif isinstance(value, bool):
        assert read == ("true" if value else "false")
    elif isinstance(value, int):
        assert int(read) == int(value)
    else:
        assert read == str.__str__(value)  # type: ignore[arg-type]


@settings(max_examples=400, deadline=None)
@given(values=st.lists(VALUES, max_size=8))
def test_plain_literals_are_plain_literal_of_each_value(values: list[object]) -> None:
    """The commit's fast path writes each value exactly as ``plain_literal`` does, and leaves the whole
    statement to the driver (``None``) as soon as one value has no plain literal."""
    each = [plain_literal(value) for value in values]
    assert plain_literals(values) == (None if None in each else each)


@POSTGRES_ONLY
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.binary(max_size=64))
def test_bytes_are_written_as_the_driver_writes_them_and_read_back(raw: Any, value: bytes) -> None:
    """On a connection with ``standard_conforming_strings`` on (PostgreSQL's default), the commit writes
    ``bytes`` exactly as the driver would, and the server reads the literal back as the same bytes; without
    ``bytea`` they are left to the driver."""
    from psycopg import ClientCursor

    assert raw.pgconn.parameter_status(b"standard_conforming_strings") == b"on"
    assert plain_literals([value]) is None
    written = plain_literals([value], bytea=True)
    assert written is not None
    with ClientCursor(raw) as cursor:
        assert written == [cursor.mogrify("%s", [value])]
    with raw.cursor() as cursor:
        cursor.execute(f"SELECT {written[0]}", prepare=False)
        assert cursor.fetchone() == (value,)
