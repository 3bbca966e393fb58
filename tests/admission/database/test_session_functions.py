"""PostgreSQL: the admission index functions every pooled connection holds in its temporary schema.

A plane opened on PostgreSQL creates ``pg_temp.admission_plane_queue_add``,
``pg_temp.admission_plane_queue_remove`` (and ``pg_temp.admission_plane_expect_edge`` and ``_expect_sent``,
the checks of a lease edge sent with its commit) on each connection the pool opens
(:mod:`admission_plane.store.session_functions`) and keeps the admission index with one call of
them per change; with ``connect_args={"prepare_threshold": None}`` (behind a pooler) it creates
none and runs the chains of statements instead, as it does on a connection that cannot create
them. Both ways must leave exactly the same index: the same random queue operations are driven on
two databases, one plane each way, and after every step the maintained index tables must be equal
between them and equal to the index recomputed from the queue (``admission_index``).
"""

from __future__ import annotations

import logging
import re
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from admission_index import actual_index, assert_index_consistent, expected_index, index_differences
from dbutil import MIGRATION_TABLES, POSTGRES_ONLY, execute, libpq_url, scalar, table_dump, table_names
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st
from planes import CONTENT_KEY, ENCRYPTION_KEY, activate
from sqlalchemy import Engine, column, func, select, table
from sqlalchemy.event import listen

from admission_plane import AdmissionError, AdmissionPlane, AdmittedLease, Lane, LiveTurnCompletion, Policy
from admission_plane.migrate import upgrade
from admission_plane.store import group_commit, session_functions
from admission_plane.store.engine import create_admission_engine
from admission_plane.store.statements.queue import DELETE_ENTRY, INSERT_ENTRY, QUEUE_ADD, QUEUE_REMOVE
from admission_plane.store.tx import Scalar, Statement
from admission_plane.store.unit_of_work import UnitOfWork

pytestmark = pytest.mark.postgres

#: Engine options that turn the functions off (a transaction pooler keeps no session state).
STATEMENTS: dict[str, Any] = {"connect_args": {"prepare_threshold": None}}
#: Three seats, three starts, a short queue timeout (requests time out between steps) and two lanes.
POLICY = Policy(3, 3, 0, 5_000, 30_000, lanes=(Lane("default", 2), Lane("batch")))
KEYS: dict[str, Any] = {"encryption_key": ENCRYPTION_KEY, "content_fingerprint_key": CONTENT_KEY}
FUNCTIONS = [
    "admission_plane_blind_admissible",
    "admission_plane_blind_admissible_new",
    "admission_plane_expect_edge",
    "admission_plane_expect_sent",
    "admission_plane_queue_add",
    "admission_plane_queue_remove",
]
_PG_PROC = table("pg_proc", column("proname"), column("pronamespace"))
#: The functions in the connection's own temporary schema (none when it has no temporary schema).
TEMP_FUNCTIONS = Scalar[str](
    select(_PG_PROC.c.proname).where(_PG_PROC.c.pronamespace == func.pg_my_temp_schema()).order_by(_PG_PROC.c.proname)
)
#: Whether ``pg_temp.admission_plane_queue_remove(text)`` resolves on the connection.
REMOVE_RESOLVES = Scalar[bool](select(func.to_regprocedure("pg_temp.admission_plane_queue_remove(text)").is_not(None)))
PlaneOpener = Callable[..., AdmissionPlane]


@pytest.fixture
def open_plane() -> Iterator[PlaneOpener]:
    """Open planes on their own admission engines (options passed through); all closed and disposed afterwards.

    ``prepare`` is called with the engine before the plane opens its first connection.
    """
    opened: list[tuple[AdmissionPlane | None, Engine]] = []

    def factory(url: str, *, prepare: Callable[[Engine], None] | None = None, **engine_options: Any) -> AdmissionPlane:
        engine = create_admission_engine(url, **engine_options)
        opened.append((None, engine))
        if prepare is not None:
            prepare(engine)
        opened[-1] = (plane := AdmissionPlane(engine, policy=POLICY, **KEYS), engine)
        return plane

    yield factory
    for plane, engine in opened:
        if plane is not None:
            plane.close()
        engine.dispose()


def session_state(engine: Engine) -> tuple[bool, list[str], bool]:
    """On one pooled connection, in one unit of work: ``Tx.functions``, the functions of its temporary
    schema, and whether ``pg_temp.admission_plane_queue_remove(text)`` resolves."""
    with UnitOfWork(engine, read_only=True) as uow:
        resolves = uow.tx.scalar(REMOVE_RESOLVES)
        return uow.tx.functions, uow.tx.column(TEMP_FUNCTIONS), resolves is True


def put(plane: AdmissionPlane, request_id: str, now: int, **fields: Any) -> None:
    """Enqueue ``request_id`` with its payload at ``now`` (agent, session, key and lane overridable)."""
    values: dict[str, Any] = {"session_id": "session-1", "agent_id": "agent-a", "provider": "provider-1"}
    values.update(model="model-1", fingerprint="fp", plaintext=f"prompt {request_id}", expires_at=now + 60_000)
    plane.enqueue_with_payload(request_id=request_id, now=now, **{**values, **fields})


# --- which connections hold them ----------------------------------------------------------------------------------


@POSTGRES_ONLY
def test_a_postgres_plane_holds_the_functions_by_default_and_not_behind_a_pooler(
    open_plane: PlaneOpener, database_url: str
) -> None:
    """By default a unit of work's Tx.functions is True and both functions exist in its connection's temporary
    schema; with connect_args={"prepare_threshold": None} passed through, Tx.functions is False and none exist."""
    default = open_plane(database_url)
    assert session_state(default.engine) == (True, FUNCTIONS, True)
    pooled = open_plane(database_url, **STATEMENTS)
    assert session_state(pooled.engine) == (False, [], False)


@POSTGRES_ONLY
def test_a_plane_with_the_functions_changes_the_index_with_one_call_per_change(
    open_plane: PlaneOpener, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An enqueue and a cancellation each run QUEUE_ADD and QUEUE_REMOVE, and none of the statements of the chains,
    on a plane with the functions; the plane without them runs INSERT_ENTRY and DELETE_ENTRY and never the calls."""
    ran: list[Statement] = []
    compiled = Statement.compiled

    def spy(self: Statement, dialect: Any) -> tuple[str, dict[str, Any]]:
        ran.append(self)  # every statement a unit runs, at once or held back until its commit, is compiled here
        return compiled(self, dialect)

    monkeypatch.setattr(Statement, "compiled", spy)
    for plane, expected, absent in (
        (open_plane(database_url), [QUEUE_ADD, QUEUE_REMOVE], [INSERT_ENTRY, DELETE_ENTRY]),
        (open_plane(database_url, **STATEMENTS), [INSERT_ENTRY, DELETE_ENTRY], [QUEUE_ADD, QUEUE_REMOVE]),
    ):
        ran.clear()
        request_id = "with-functions" if expected[0] is QUEUE_ADD else "with-statements"
        put(plane, request_id, 1_000)
        plane.cancel_queued(request_id, 1_001)
        assert [statement for statement in ran if statement in (*expected, *absent)] == expected
        assert_index_consistent(database_url)


# --- the fallback -------------------------------------------------------------------------------------------------


def temp_functions(connection: psycopg.Connection[Any]) -> list[str]:
    """The functions in ``connection``'s temporary schema (its transaction, if it opened one, rolled back)."""
    found = connection.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = pg_my_temp_schema() ORDER BY proname"
    ).fetchall()
    connection.rollback()
    return [name for (name,) in found]


def _read_only(dbapi_connection: Any, _record: Any) -> None:
    """Make every transaction of the session read-only, as a read-only role does (no function can be created)."""
    _session_characteristics(dbapi_connection, "READ ONLY")


def _read_write(dbapi_connection: Any, _record: Any) -> None:
    _session_characteristics(dbapi_connection, "READ WRITE")


def _session_characteristics(dbapi_connection: Any, mode: str) -> None:
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    try:
        dbapi_connection.execute(f"SET SESSION CHARACTERISTICS AS TRANSACTION {mode}")
    finally:
        dbapi_connection.autocommit = autocommit


@POSTGRES_ONLY
def test_a_connection_that_cannot_create_the_functions_is_marked_without_them_and_nothing_is_logged(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """install() on a connection whose session is read-only records False in the record's info (the functions,
    and the gated commits' flush after the gate: ``store.group_commit``), logs nothing at WARNING or above, creates
    nothing and gives the connection back usable as it got it; on a writable connection it records True for both
    and the functions exist."""
    caplog.set_level(logging.DEBUG)
    conninfo = libpq_url(database_url)
    with psycopg.connect(conninfo) as connection:
        _read_only(connection, None)
        record = types.SimpleNamespace(info={})
        session_functions.install(connection, record)
        assert record.info == {session_functions.FUNCTIONS_KEY: False, group_commit.POSTGRES_FLUSH_INFO: False}
        assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert connection.autocommit is False
        assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert temp_functions(connection) == []
        _read_write(connection, None)
        session_functions.install(connection, record)
        assert record.info == {session_functions.FUNCTIONS_KEY: True, group_commit.POSTGRES_FLUSH_INFO: True}
        assert temp_functions(connection) == FUNCTIONS


@POSTGRES_ONLY
def test_a_connection_already_in_a_transaction_is_marked_without_them_and_left_as_it_was(database_url: str) -> None:
    """install() on a connection another connect listener left inside a transaction does not raise: it records
    False, creates nothing and leaves that transaction open and autocommit off, for its owner to end."""
    conninfo = libpq_url(database_url)
    with psycopg.connect(conninfo) as connection:
        connection.execute("SELECT 1")  # a transaction is now open
        record = types.SimpleNamespace(info={})
        session_functions.install(connection, record)
        assert record.info == {session_functions.FUNCTIONS_KEY: False, group_commit.POSTGRES_FLUSH_INFO: False}
        assert connection.autocommit is False
        assert connection.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        connection.rollback()
        assert temp_functions(connection) == []


@POSTGRES_ONLY
def test_a_plane_connection_plans_its_prepared_statements_generically_and_not_behind_a_pooler(
    open_plane: PlaneOpener, database_url: str
) -> None:
    """The plane's connections use generic plans for their prepared statements (plan_cache_mode
    force_generic_plan); behind a pooler (no prepared statements, no session state) the server's default stays."""
    show = Scalar[str](select(func.current_setting("plan_cache_mode")))
    for options, expected in (({}, "force_generic_plan"), (STATEMENTS, "auto")):
        plane = open_plane(database_url, **options)
        with UnitOfWork(plane.engine, read_only=True) as uow:
            assert uow.tx.scalar(show) == expected


@POSTGRES_ONLY
def test_a_plane_whose_connections_cannot_create_the_functions_admits_and_keeps_the_index(
    open_plane: PlaneOpener, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A plane on connections read-only while the pool opens them (so creating the functions fails, and they are
    writable afterwards) runs the statements: Tx.functions is False, it admits in the policy's order across
    groups, and the index stays consistent after every change; nothing is logged at WARNING or above."""
    caplog.set_level(logging.DEBUG)

    # What a role without the TEMPORARY privilege meets, without creating a role on the shared server.
    def unable(engine: Engine) -> None:
        listen(engine, "connect", _read_only, insert=True)  # before the library's own hook
        listen(engine, "connect", _read_write)  # after it

    plane = open_plane(database_url, prepare=unable)
    assert session_state(plane.engine) == (False, [], False)
    owner = plane.owner_identity.owner_instance_id
    put(plane, "r-3", 1_003, agent_id="agent-b")
    put(plane, "r-1", 1_001, session_id="session-2")
    put(plane, "r-2", 1_001, model="model-2")
    put(plane, "r-0", 1_001)
    put(plane, "r-4", 1_000, lane="batch")
    assert_index_consistent(database_url)
    plane.cancel_queued("r-0", 1_004)
    assert_index_consistent(database_url)
    admitted: list[str] = []
    for now in (1_005, 1_006, 1_007):
        lease = plane.admit_next(now, owner)
        assert lease is not None
        admitted.append(lease.request_id)
        assert_index_consistent(database_url)
    # The oldest (r-1 before r-2 at the same time), then the agent holding no seat, then the batch lane once the
    # default lane took its weight of two.
    assert admitted == ["r-1", "r-3", "r-4"]
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING] == []


# --- the functions and the statements keep the same index -----------------------------------------------------------

REQUESTS = tuple(f"r-{n:02}" for n in range(12))
#: Where a request queues: (lane, provider, model, agent, session).
A_S1 = (None, "provider-1", "model-1", "agent-a", "session-1")
A_S2 = (None, "provider-1", "model-1", "agent-a", "session-2")
B_S1 = (None, "provider-1", "model-1", "agent-b", "session-1")
#: The places share prefixes, the first most often, so a session holds several requests, an agent several sessions,
#: a key several agents, and a lane several keys.
PLACES = (
    *(A_S1,) * 4,
    A_S2,
    ("default", "provider-1", "model-1", "agent-a", "session-2"),
    B_S1,
    (None, "provider-1", "model-2", "agent-a", "session-1"),
    ("batch", "provider-1", "model-1", "agent-a", "session-1"),
    ("batch", "provider-2", "model-1", "agent-b", "session-2"),
)


@dataclass(frozen=True)
class Enqueue:
    """Enqueue at ``now - back`` (the same time as others, or older than those queued), with the payload or
    without."""

    request_id: str
    place: tuple[str | None, str, str, str, str]
    back: int
    ttl: int
    payload: bool


@dataclass(frozen=True)
class Persist:
    """Persist the payload of a request enqueued without one (it enters the index)."""

    request_id: str
    ttl: int


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class AdmitNext:
    pass


@dataclass(frozen=True)
class AdmitRequest:
    request_id: str


@dataclass(frozen=True)
class Finish:
    """Free the seat of one admitted lease: abandoned before its prompt, or activated and completed."""

    lease: int
    complete: bool


@dataclass(frozen=True)
class ReadPayload:
    """Read a payload; at or after its expiry it is deleted (the request leaves the index)."""

    request_id: str


@dataclass(frozen=True)
class Advance:
    """Let time pass (only this step and a completion do; past the 5 s queue timeout, the next admission times the
    queue out)."""

    ms: int


Step = Enqueue | Persist | Cancel | AdmitNext | AdmitRequest | Finish | ReadPayload | Advance
requests = st.sampled_from(REQUESTS)
ttls = st.sampled_from((1, 300, 60_000))


def _enqueues(payload: st.SearchStrategy[bool]) -> st.SearchStrategy[Enqueue]:
    return st.builds(Enqueue, requests, st.sampled_from(PLACES), st.sampled_from((0, 1, 3)), ttls, payload)


STEPS: dict[str, st.SearchStrategy[Step]] = {
    "enqueue": _enqueues(st.booleans()),
    "advance": st.builds(Advance, st.sampled_from((1, 1, 200, 6_000))),
    "admit_next": st.just(AdmitNext()),
    "persist": st.builds(Persist, requests, ttls),
    "cancel": st.builds(Cancel, requests),
    "admit_request": st.builds(AdmitRequest, requests),
    "finish": st.builds(Finish, st.integers(0, 5), st.booleans()),
    "read_payload": st.builds(ReadPayload, requests),
}
#: Enqueues three times as often as any other step, time and admissions twice, so the queue holds several groups.
KINDS = (
    ("enqueue",) * 3 + ("advance", "admit_next") * 2 + ("persist", "cancel", "admit_request", "finish", "read_payload")
)
steps = st.sampled_from(KINDS).flatmap(STEPS.__getitem__)
#: The queue an example starts from: requests with their payloads.
queues = st.lists(_enqueues(st.just(True)), min_size=4, max_size=10, unique_by=lambda enqueue: enqueue.request_id)


class Driver:
    """One plane and the leases it admitted, taking the steps; each step's outcome is comparable across planes."""

    def __init__(self, plane: AdmissionPlane) -> None:
        self.plane = plane
        self.owner = plane.owner_identity.owner_instance_id
        self.leases: list[AdmittedLease] = []

    def take(self, step: Step, now: int) -> object:
        """What ``step`` did at ``now``: its result, or the name of the AdmissionError that refused it."""
        try:
            return self._take(step, now)
        except AdmissionError as error:
            return type(error).__name__

    def _take(self, step: Step, now: int) -> object:
        plane = self.plane
        if isinstance(step, Enqueue):
            at = now - step.back
            lane, provider, model, agent, session = step.place
            fields: dict[str, Any] = {"request_id": step.request_id, "session_id": session, "agent_id": agent}
            fields.update(fingerprint="fp", provider=provider, model=model, now=at, lane=lane)
            if step.payload:
                return plane.enqueue_with_payload(**fields, plaintext=step.request_id, expires_at=at + step.ttl).existed
            return plane.enqueue(**fields).existed
        if isinstance(step, Persist):
            plane.persist_payload(step.request_id, step.request_id, now, now + step.ttl)
            return None
        if isinstance(step, Cancel):
            plane.cancel_queued(step.request_id, now)
            return None
        if isinstance(step, (AdmitNext, AdmitRequest)):
            if isinstance(step, AdmitNext):
                lease = plane.admit_next(now, self.owner)
            else:
                lease = plane.admit_request(step.request_id, now, self.owner)
            if lease is None:
                return None
            self.leases.append(lease)
            return lease.request_id
        if isinstance(step, Finish):
            if not self.leases:
                return "no lease"
            lease = self.leases.pop(step.lease % len(self.leases))
            if step.complete:
                activate(plane, lease, now)
                plane.complete_live_turn(lease, now + 4, LiveTurnCompletion("completed"))
            else:
                plane.abandon_before_prompt(lease, now, "cancelled")
            return lease.request_id
        if isinstance(step, ReadPayload):
            return plane.read_payload(step.request_id, now)
        return None  # Advance: the clock moved, nothing else


def empty(url: str, tables: list[str]) -> None:
    """Delete every row an example wrote (the migration's own rows stay)."""
    execute(url, *(f'DELETE FROM "{name}"' for name in tables), foreign_keys=False)


@pytest.fixture
def twins(database_url: str, postgres_url: str) -> Iterator[tuple[Engine, Engine]]:
    """Two migrated PostgreSQL databases, each with its admission engine: the first with the functions (the
    default), the second with ``prepare_threshold=None`` (statements). The examples share them, and the planes
    they open on them."""
    upgrade(postgres_url)
    engines = (create_admission_engine(database_url), create_admission_engine(postgres_url, **STATEMENTS))
    yield engines
    for engine in engines:
        engine.dispose()


@POSTGRES_ONLY
@settings(
    max_examples=20,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),  # explaining a failure re-runs it a hundred times
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(queue=queues, sequence=st.lists(steps, min_size=10, max_size=40))
# Every time: a head that departs is replaced by its group's oldest (enqueued_at, then request_id) at each level
# (session-1: r-05, then r-03, not the smallest id r-01; agent-a: r-03, not session-2's newer r-02), and an entry
# enqueued at its head's time with a smaller request_id becomes the head (session-2: r-02 after r-09).
@example(
    queue=[
        Enqueue("r-05", A_S1, 3, 60_000, True),
        Enqueue("r-01", A_S1, 0, 60_000, True),
        Enqueue("r-03", A_S1, 1, 60_000, True),
        Enqueue("r-09", A_S2, 0, 60_000, True),
        Enqueue("r-02", A_S2, 0, 60_000, True),
        Enqueue("r-08", B_S1, 0, 60_000, True),
    ],
    sequence=[AdmitNext(), AdmitNext(), Cancel("r-03"), Advance(1), Cancel("r-02"), AdmitNext()],
)
def test_the_functions_and_the_statements_keep_the_same_index(
    twins: tuple[Engine, Engine], database_url: str, postgres_url: str, queue: list[Enqueue], sequence: list[Step]
) -> None:
    """The same random enqueues (lanes, keys, agents, sessions; equal and older enqueue times; with the payload or
    later), admissions, cancellations, completions, queue time-outs and payload expiries on two migrated databases
    (emptied before each example), one plane with the functions and one with statements: every step has the same
    outcome on both, and after every step the index tables (queue_entries, queue_sessions, queue_agents,
    queue_keys) are identical between the two databases and equal to the index recomputed from the queue."""
    databases = (database_url, postgres_url)
    tables = [name for name in table_names(database_url) if name not in MIGRATION_TABLES]
    for database in databases:
        empty(database, tables)
    assert [session_state(engine)[0] for engine in twins] == [True, False]
    drivers: list[Driver] = []
    try:
        for engine in twins:
            drivers.append(Driver(AdmissionPlane(engine, policy=POLICY, **KEYS)))
        now, deepest = 10_000, 0
        for number, step in enumerate([*queue, *sequence]):
            now += step.ms if isinstance(step, Advance) else 0
            functions, statements = (driver.take(step, now) for driver in drivers)
            assert functions == statements, f"step {number} {step}: functions {functions!r}, statements {statements!r}"
            event(f"{type(step).__name__}: {_kind(functions)}")
            index = actual_index(database_url)
            assert index == actual_index(postgres_url), f"after step {number} {step}: the two indexes differ"
            for database in databases:  # assert_index_consistent, reading the index once
                assert expected_index(database) == index, f"after step {number} {step}: {index_differences(database)}"
            now += 4 if isinstance(step, Finish) and step.complete else 0  # its activation and completion took these
            deepest = max(deepest, len(index["queue_entries"]))
        event(f"at most {deepest} entries in the index")
    finally:
        for driver in drivers:
            driver.plane.close()


def _kind(outcome: object) -> str:
    """A step's outcome as a statistics label: the refusal, ``none``, or ``done``."""
    if isinstance(outcome, str) and outcome.endswith("Error"):
        return outcome
    return "none" if outcome is None else "done"


@POSTGRES_ONLY
def test_a_turn_behind_a_pooler_checks_its_moves_on_the_client_and_ends_as_with_the_functions(
    open_plane: PlaneOpener, database_url: str
) -> None:
    """Without the functions (behind a pooler) starting and the dispatch intent run their moves at once and check
    them on the client instead of sending them with the commit: a whole turn still ends completed, and a request
    that diverged from its lease refuses starting with the same error and nothing changed."""
    pooled = open_plane(database_url, **STATEMENTS)
    assert session_state(pooled.engine)[0] is False
    owner = pooled.owner_identity.owner_instance_id
    put(pooled, "whole", 1_000)
    lease = pooled.admit_request("whole", 1_001, owner)
    assert lease is not None
    activate(pooled, lease, 1_001)
    pooled.complete_live_turn(lease, 1_010, LiveTurnCompletion("completed"))
    assert scalar(database_url, "SELECT state FROM turn_requests WHERE request_id = 'whole'") == "completed"
    put(pooled, "diverged", 2_000)
    second = pooled.admit_request("diverged", 2_001, owner)
    assert second is not None
    execute(database_url, "UPDATE turn_requests SET state = 'recovery_required' WHERE request_id = 'diverged'")
    before = table_dump(database_url)
    with pytest.raises(AdmissionError, match="diverged at starting") as refused:
        pooled.mark_starting(second, 2_002)
    assert refused.value.__cause__ is None  # refused by the client's check, not by the server's
    assert table_dump(database_url) == before


def _generic_plan(cursor: Any, sql: str, values: dict[str, Any]) -> str:
    """The plan a plane's connection (``plan_cache_mode = force_generic_plan``) runs ``sql`` with, prepared on the
    server as the plane prepares it: its ``%(name)s`` parameters become ``$1``, ``$2``... in order of appearance."""
    names: list[str] = []
    for name in re.findall(r"%\((\w+)\)s", sql):
        if name not in names:
            names.append(name)
    prepared = re.sub(r"%\((\w+)\)s", lambda match: f"${names.index(match.group(1)) + 1}", sql)
    cursor.execute(f"PREPARE generic_probe AS {prepared}")
    try:
        cursor.execute(f"EXPLAIN EXECUTE generic_probe({', '.join(['%s'] * len(names))})", [values[n] for n in names])
        return "\n".join(row[0] for row in cursor.fetchall())
    finally:
        cursor.execute("DEALLOCATE generic_probe")


@POSTGRES_ONLY
def test_a_plane_connection_counts_its_churning_leases_without_a_bitmap_scan(
    open_plane: PlaneOpener, database_url: str
) -> None:
    """The plane's connections turn bitmap scans off (``enable_bitmapscan``; the server's default stays behind a
    pooler): the seat and start-window counts over ``leases``, whose index holds every dead row version since
    the last vacuum, are then planned as btree scans, which mark dead entries and skip them after, where a
    bitmap scan would walk them all on every execution. Checked on the generic plan of the start's count as
    the plane prepares it."""
    show = Scalar[str](select(func.current_setting("enable_bitmapscan")))
    for options, expected in (({}, "off"), (STATEMENTS, "on")):
        plane = open_plane(database_url, **options)
        with UnitOfWork(plane.engine, read_only=True) as uow:
            assert uow.tx.scalar(show) == expected
    plane = open_plane(database_url)
    count = "SELECT count(*) FROM leases WHERE phase IN (%(a)s::TEXT, %(b)s::TEXT, %(c)s::TEXT)"
    raw = plane.engine.raw_connection()
    try:
        cursor = psycopg.ClientCursor(raw.dbapi_connection)
        plan = _generic_plan(cursor, count, {"a": "admitted", "b": "starting", "c": "dispatch_intent"})
    finally:
        raw.close()
    assert "Bitmap" not in plan, plan


#: A plain join of the seat-holding leases with their requests, as the seat reads were written before.
_PLAIN_SEATS = (
    "SELECT count(*) FROM leases l JOIN turn_requests r ON r.request_id = l.request_id"
    " WHERE l.phase IN ('active', 'admitted', 'dispatch_intent', 'starting')"
)
#: Copies of every request (new ids), so the table holds as many as a short benchmark window leaves behind.
_COPY_REQUESTS = (
    "INSERT INTO turn_requests SELECT (jsonb_populate_record(NULL::turn_requests, to_jsonb(t)"
    " || jsonb_build_object('request_id', t.request_id || '-copy-' || g))).*"
    " FROM turn_requests t, generate_series(1, 1500) g"
)


@POSTGRES_ONLY
def test_the_seat_reads_reach_each_request_by_its_key_whatever_the_planner_knows(
    open_plane: PlaneOpener, database_url: str
) -> None:
    """The seat reads (``SELECT_SEATS`` on PostgreSQL, inside ``ADMISSION_READS``, and the blind admission's, in
    ``session_functions``) reach each lease's request through ``turn_requests``' key, one lease at a time, on a
    database whose tables were never analysed. A plain join is planned there as a hash join that reads the
    whole table, every request ever queued, for each admission and each look (checked: the same plan shows it,
    with 1 501 requests and one seat held)."""
    from admission_plane.store.statements.queue import SELECT_SEATS

    plane = open_plane(database_url)
    execute(database_url, "TRUNCATE turn_requests, leases CASCADE")
    put(plane, "held", 1_000)
    assert plane.admit_request("held", 1_000, plane.owner_identity.owner_instance_id) is not None
    execute(database_url, _COPY_REQUESTS)  # never analysed since: the planner sees pages, not rows
    sql, defaults = SELECT_SEATS.compiled(plane.engine.dialect)
    raw = plane.engine.raw_connection()
    plans = {}
    try:
        cursor = raw.dbapi_connection.cursor()
        for name, text, params in (
            ("SELECT_SEATS", sql, defaults),
            ("blind admission", f"SELECT count(*), array_agg(r.agent_id) {session_functions._SEATS}", None),
            ("plain join", _PLAIN_SEATS, None),
        ):
            cursor.execute(f"EXPLAIN {text}", params)
            plans[name] = "\n".join(row[0] for row in cursor.fetchall())
    finally:
        raw.close()
    assert "Hash Join" in plans["plain join"], plans["plain join"]  # what the seat reads must not be
    for name in ("SELECT_SEATS", "blind admission"):
        assert "Scan using turn_requests_pkey on turn_requests" in plans[name], (name, plans[name])
        assert "Seq Scan on turn_requests" not in plans[name], (name, plans[name])


#: The time-out check as it was written before: "any queued row past its deadline".
_ANY_ROW_EXPIRED = "SELECT 1 FROM turn_requests WHERE state = 'queued' AND deadline_at <= %(now)s::BIGINT LIMIT 1"


@POSTGRES_ONLY
def test_the_time_out_check_reads_one_index_entry_whatever_the_queue_depth(
    open_plane: PlaneOpener, database_url: str
) -> None:
    """Every admission and every waiter's look first asks whether a queued request is past its deadline
    (``ANY_EXPIRED``, inside ``ADMISSION_READS``; the blind admission's ``EARLIEST_PASSED_DEADLINE``). A plane's
    connections run generic plans, which cannot know ``now``: asked as "any queued row with ``deadline_at <= now``"
    on an analysed deep queue, the plan scanned the whole table on every call (2.1 ms of a 2.3 ms look at 10 000
    queued requests in ``benchmarks/test_depth_adversarial.py``, checked here on the old text). Asked as "is the
    earliest passed deadline", each is one step of ``turn_requests_state_deadline`` within the range of passed
    deadlines: a step from the first ``queued`` entry would walk the entries every request left there while it was
    queued, dead since and kept until a vacuum. The sweep that follows a "yes" (``SELECT_EXPIRED``, every queued row
    past its deadline) reads the same index's range, not the table."""
    from admission_plane.store.statements.admission import ADMISSION_READS, ANY_EXPIRED, SELECT_EXPIRED

    plane = open_plane(database_url)
    execute(database_url, "TRUNCATE turn_requests, leases CASCADE")
    put(plane, "queued", 1_000)
    execute(database_url, _COPY_REQUESTS.replace("1500", "5000"))  # 5 001 queued requests
    execute(database_url, "ANALYZE turn_requests")
    raw = plane.engine.raw_connection()
    plans = {}
    try:
        cursor = psycopg.ClientCursor(raw.dbapi_connection)
        for name, statement in (
            ("ANY_EXPIRED", ANY_EXPIRED),
            ("ADMISSION_READS", ADMISSION_READS),
            ("SELECT_EXPIRED", SELECT_EXPIRED),
        ):
            sql, defaults = statement.compiled(plane.engine.dialect)
            plans[name] = _generic_plan(cursor, sql, {**defaults, "now": 2_000, "request_id": "queued"})
        blind = f"SELECT {session_functions.EARLIEST_PASSED_DEADLINE.replace('p_now', '%(now)s::BIGINT')}"
        plans["blind admission"] = _generic_plan(cursor, blind, {"now": 2_000})
        plans["any row"] = _generic_plan(cursor, _ANY_ROW_EXPIRED, {"now": 2_000})
    finally:
        raw.close()
    assert "Seq Scan on turn_requests" in plans["any row"], plans["any row"]  # what the check must not be
    assert f"IF {session_functions.EARLIEST_PASSED_DEADLINE} IS NOT NULL THEN" in session_functions.INSTALL
    for name in ("ANY_EXPIRED", "ADMISSION_READS", "SELECT_EXPIRED", "blind admission"):
        assert "Scan on turn_requests_state_deadline" in plans[name].replace(" using ", " on "), (name, plans[name])
        assert "Seq Scan on turn_requests" not in plans[name], (name, plans[name])
        conditions = [line for line in plans[name].splitlines() if "Index Cond:" in line and "state = " in line]
        assert conditions, (name, plans[name])
        assert all("deadline_at <= " in line for line in conditions), (name, plans[name])
