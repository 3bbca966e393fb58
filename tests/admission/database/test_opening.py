"""PostgreSQL: a unit's ``BEGIN`` and gates travel with its first statement (``Tx.open``).

The opening is held back and sent with the unit's first statement in one round trip of the simple
query protocol, as ``EXECUTE`` of that statement prepared by name on the connection (``PREPARE``
once per connection, in a round trip of its own). These tests drive units on an engine of the
plane's own making and check what a user relies on: the values arrive exactly as given (any text,
bytes, ``NULL``), a statement the server cannot prepare alone still runs, a unit after a rolled-back
one still runs, and one whose named statement was deallocated behind the library's back runs again.

The statements a commit carries (``Tx.send``, ``Tx.defer``) are text the first time and are prepared by
name once the commit is over (``Tx.prepare_carried``); later commits carry them as ``EXECUTE``. The same
promises hold for them, and a failure while preparing after a commit never reaches the unit's caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dbutil import POSTGRES_ONLY, execute, query
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    LargeBinary,
    MetaData,
    Table,
    Text,
    bindparam,
    cast,
    insert,
    literal_column,
    select,
)

from admission_plane.store.engine import create_admission_engine
from admission_plane.store.tx import PREPARED_KEY, Statement, Tx
from admission_plane.store.unit_of_work import Gate, run

pytestmark = POSTGRES_ONLY
#: Three typed values back, as the unit's first statement: what arrives is what was given.
ECHO = Statement(
    select(
        cast(bindparam("text"), Text).label("text"),
        cast(bindparam("number"), BigInteger).label("number"),
        cast(bindparam("blob"), LargeBinary).label("blob"),
        cast(bindparam("text"), Text).label("again"),  # one name used twice: one parameter
    )
)
#: A parameter whose type nothing in the statement says: the server cannot prepare it alone (the driver, which
#: sends an integer's type with it, can run it).
UNTYPED = Statement(select(literal_column("1").label("one")).where(bindparam("flag").is_not(None)))


#: A table of the test's own for what commits carry (created by the ``carried`` fixture).
CARRIED_TABLE = Table(
    "carried_values", MetaData(), Column("text", Text), Column("number", BigInteger), Column("blob", LargeBinary)
)
CARRY = Statement(
    insert(CARRIED_TABLE).values(text=bindparam("text"), number=bindparam("number"), blob=bindparam("blob"))
)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine configured as a plane configures it (session functions, generic plans), one pooled connection."""
    made = create_admission_engine(database_url, pool_size=1, max_overflow=0)
    yield made
    made.dispose()


def prepared_names(engine: Engine) -> dict[str, Any]:
    """The statements prepared by name on the pool's connection, as the library recorded them."""
    with engine.connect() as connection:
        return dict(connection.connection.info.get(PREPARED_KEY, {}))


def server_statements(engine: Engine) -> set[str]:
    """The names of the statements prepared on the pool's connection, as the server lists them."""
    with engine.connect() as connection:
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        cursor.execute("SELECT name FROM pg_prepared_statements", prepare=False)
        return {row[0] for row in cursor.fetchall()}


def echo(engine: Engine, values: dict[str, Any], gate: Gate = Gate.LEASE) -> tuple[Any, ...] | None:
    return run(engine, lambda tx: tx.row(ECHO, values), gate=gate)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))),
    number=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    blob=st.one_of(st.none(), st.binary(max_size=64)),
    gate=st.sampled_from(list(Gate)),
)
def test_the_first_statement_gets_its_values_exactly_as_given(
    engine: Engine, text: str, number: int, blob: bytes | None, gate: Gate
) -> None:
    """Any text (quotes, backslashes, ``$1``, ``%s``, non-ASCII), any 64-bit integer, bytes or ``NULL`` arrive
    unchanged through ``EXECUTE``'s literals, under every gate."""
    row = echo(engine, {"text": text, "number": number, "blob": blob}, gate)
    assert row is not None
    assert row == (text, number, None if blob is None else blob, text)


def test_a_unit_prepares_its_first_statement_once_per_connection(engine: Engine) -> None:
    """The first unit prepares its first statement by name; later units reuse it (one name, on the server too)."""
    for number in range(3):
        assert echo(engine, {"text": "a", "number": number, "blob": None}) == ("a", number, None, "a")
    known = prepared_names(engine)
    assert len(known) == 1
    ((name, parameters),) = known.values()
    assert parameters == ("text", "number", "blob")
    assert name in server_statements(engine)


def test_a_statement_the_server_cannot_prepare_alone_runs_after_the_opening(engine: Engine) -> None:
    """A first statement whose parameter type only the driver's value gives is run as before, after the opening
    in a round trip of its own, and is not tried again."""
    for _ in range(2):
        assert run(engine, lambda tx: tx.scalar(UNTYPED, {"flag": 7}), gate=Gate.LEASE) == 1
    assert list(prepared_names(engine).values()) == [None]


class Refused(Exception):
    """What the test's unit raises after its first statement."""


def test_a_unit_after_a_rolled_back_one_prepares_its_statement_again(engine: Engine) -> None:
    """A unit that fails after its first statement is rolled back (and psycopg then deallocates every prepared
    statement of the session); the next unit prepares its first statement again, under a new name, and runs."""
    assert echo(engine, {"text": "a", "number": 1, "blob": None}) is not None
    before = set(prepared_names(engine).values())

    def refused(tx: Tx) -> None:
        tx.row(ECHO, {"text": "b", "number": 2, "blob": None})
        raise Refused

    with pytest.raises(Refused):
        run(engine, refused, gate=Gate.LEASE)
    assert prepared_names(engine) == {}
    assert echo(engine, {"text": "c", "number": 3, "blob": b"x"}) == ("c", 3, b"x", "c")
    after = set(prepared_names(engine).values())
    assert after
    assert after.isdisjoint(before)


def test_a_unit_whose_statement_was_deallocated_behind_its_back_runs_again(engine: Engine) -> None:
    """Something else deallocates the connection's statements (``DEALLOCATE ALL`` on it): the next unit's
    ``EXECUTE`` fails, the unit is rolled back and run again from the start, and succeeds."""
    assert echo(engine, {"text": "a", "number": 1, "blob": None}) is not None
    with engine.connect() as connection:
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        cursor.execute("DEALLOCATE ALL", prepare=False)
    assert server_statements(engine) == set()
    assert echo(engine, {"text": "d", "number": 4, "blob": None}) == ("d", 4, None, "d")


@pytest.fixture
def carried(database_url: str) -> Iterator[str]:
    """``carried_values``, created for the test and dropped after it."""
    execute(database_url, "CREATE TABLE carried_values (text TEXT, number BIGINT, blob BYTEA)")
    yield database_url
    execute(database_url, "DROP TABLE carried_values")


def carry(engine: Engine, values: dict[str, Any]) -> None:
    """One unit that only sends ``CARRY``: the opening, the insert and ``COMMIT`` in one round trip."""
    run(engine, lambda tx: tx.send(CARRY, values), gate=Gate.LEASE)


def test_what_a_commit_carries_is_prepared_after_it_and_executed_by_name_after_that(
    engine: Engine, carried: str
) -> None:
    """The first commit carries the insert as text and prepares it after the commit; the next ones carry
    ``EXECUTE`` of it, with awkward values (quotes, a statement separator, backslashes, ``NULL``, zero bytes)
    arriving exactly as given, every row once."""
    values = [
        {"text": "it's; COMMIT; --", "number": -(2**63), "blob": b"\x00\x00'"},
        {"text": "\\ $1 %s \u00e9\u4e2d", "number": 2**63 - 1, "blob": None},
        {"text": "", "number": 0, "blob": b""},
    ]
    carry(engine, values[0])
    known = prepared_names(engine)
    assert len(known) == 1
    ((name, parameters),) = known.values()
    assert parameters == ("text", "number", "blob")
    assert name in server_statements(engine)
    for each in values[1:]:
        carry(engine, each)
    assert prepared_names(engine) == known  # executed by name, not prepared again
    rows = query(carried, "SELECT text, number, blob FROM carried_values")
    assert sorted(rows, key=repr) == sorted(((v["text"], v["number"], v["blob"]) for v in values), key=repr)


def test_a_commit_whose_carried_statement_was_deallocated_behind_its_back_runs_again(
    engine: Engine, carried: str
) -> None:
    """Something else deallocates the connection's statements after the insert was prepared: the commit's
    ``EXECUTE`` fails before ``COMMIT`` runs, the unit is rolled back and run again, and its row is written
    exactly once."""
    carry(engine, {"text": "first", "number": 1, "blob": None})
    assert prepared_names(engine)
    with engine.connect() as connection:
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        cursor.execute("DEALLOCATE ALL", prepare=False)
    carry(engine, {"text": "second", "number": 2, "blob": None})
    assert sorted(query(carried, "SELECT text, number FROM carried_values")) == [("first", 1), ("second", 2)]


def test_a_failure_while_preparing_after_a_commit_does_not_reach_the_caller(
    engine: Engine, carried: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unit has committed when the carried statements are prepared: a driver error then (simulated here, as
    a connection lost at that instant cannot be timed) is not the unit's; it returns, its row is written, and
    the statement is carried as text until it is prepared."""
    import psycopg

    def lost(self: Tx, sql: str) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(Tx, "_prepared", lost)
    carry(engine, {"text": "committed", "number": 1, "blob": None})
    monkeypatch.undo()
    assert query(carried, "SELECT text FROM carried_values") == [("committed",)]
    assert prepared_names(engine) == {}
    carry(engine, {"text": "again", "number": 2, "blob": None})
    assert len(prepared_names(engine)) == 1
