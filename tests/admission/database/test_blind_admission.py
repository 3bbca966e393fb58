"""PostgreSQL: an admission sent whole with its commit, the server deciding it (issue 16).

Under a simple policy (no keyed or session limit, no budget, no start interval) a waiter's admission reads
nothing first: ``BEGIN``, the admission gate, the reservation guarded by
``pg_temp.admission_plane_blind_admissible`` and ``COMMIT`` travel in one round trip, so the gate is held for the
server's work only. The function must answer exactly as the Python rule
(:func:`admission_plane.service._admission.admit_in_transaction`): never admit what the rule would not (a
replayed or unfair seat), and, in the cases it decides, admit what the rule would (or the fast path is only
slower). Outside them it refuses, nothing commits, and the admission takes the long way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from admission_index import assert_index_consistent
from dbutil import POSTGRES_ONLY, event_kinds, is_postgres, libpq_url, query, reset_postgres, scalar, table_dump
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st
from planes import SEAT_PHASES, PlaneFactory, activate, enqueue

from admission_plane import (
    AdmissionPlane,
    AdmittedLease,
    InvalidInputError,
    KeyLimit,
    Lane,
    LiveTurnCompletion,
    Policy,
    RequestState,
)
from admission_plane.service._admission import _admit, admit_in_transaction
from admission_plane.service._selection import RANK_HORIZON
from admission_plane.store.unit_of_work import Gate

LANES = (Lane("default"), Lane("batch"))
AGENTS = ("agent-0", "agent-1", "agent-2", "agent-3")
MODELS = ("m0", "m1", "m2")
TIMEOUT_MS = 60_000


# --- the function against the rule ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Enqueue:
    agent: int
    model: int
    session: int
    batch: bool
    back: int  # enqueued this many ms before now: equal and older enqueue times


@dataclass(frozen=True)
class AdmitNext:
    pass


@dataclass(frozen=True)
class Activate:
    lease: int


@dataclass(frozen=True)
class Finish:
    lease: int


@dataclass(frozen=True)
class Cool:
    model: int
    ms: int


@dataclass(frozen=True)
class Pause:
    scope: str  # "all", "lane" (default), "batch" or a model


@dataclass(frozen=True)
class Advance:
    ms: int


Step = Enqueue | AdmitNext | Activate | Finish | Cool | Pause | Advance

steps = st.one_of(
    st.builds(
        Enqueue,
        agent=st.integers(0, len(AGENTS) - 1),
        model=st.integers(0, len(MODELS) - 1),
        session=st.integers(0, 1),
        batch=st.sampled_from([False, False, False, True]),
        back=st.sampled_from([0, 0, 1, 5]),
    ),
    st.just(AdmitNext()),
    st.builds(Activate, lease=st.integers(0, 7)),
    st.builds(Finish, lease=st.integers(0, 7)),
    st.builds(Cool, model=st.integers(0, len(MODELS) - 1), ms=st.sampled_from([1, 40_000])),
    st.builds(Pause, scope=st.sampled_from(["all", "default", "batch", *MODELS])),
    st.builds(Advance, ms=st.sampled_from([1, 30_000, 70_000])),
)


def _policy(seats: int, starts: int | None = None) -> Policy:
    return Policy(seats, seats if starts is None else starts, 0, TIMEOUT_MS, 30_000, lanes=LANES)


policies = st.builds(_policy, st.integers(1, 5), st.integers(1, 5))


def state(plane: AdmissionPlane, request_id: str) -> str:
    stored = plane.get_request(request_id)
    assert stored is not None
    return stored.state


class _Rollback(Exception):
    def __init__(self, result: object) -> None:
        self.result = result


def rule_admits(plane: AdmissionPlane, request_id: str, now: int, parallel: bool) -> bool:
    """Whether the Python rule admits ``request_id`` now (the long way, in a unit rolled back after)."""
    ctx = plane._ctx
    owner = plane.owner_identity.owner_instance_id

    def work(tx: Any) -> None:
        raise _Rollback(admit_in_transaction(ctx, tx, now, owner, request_id, parallel=parallel))

    try:
        ctx.run(work, gate=Gate.ADMISSION)
    except _Rollback as outcome:
        lease = outcome.result
        assert lease is None or lease.request_id == request_id
        return lease is not None
    raise AssertionError("the unit was not rolled back")


def _assumed(plane: AdmissionPlane, now: int, parallel: bool) -> tuple[object, ...]:
    """The blind functions' parameters after the request's place: what the plane assumes of the policy."""
    policy = plane.current_policy()
    max_starts = policy.policy.max_concurrent_starts
    return (now, policy.revision, plane.policy.max_active_turns, max_starts, parallel, RANK_HORIZON)


def _answer(connection: psycopg.Connection[Any], function: str, arguments: tuple[object, ...]) -> bool:
    placeholders = ", ".join(["%s"] * len(arguments))
    row = connection.execute(f"SELECT pg_temp.{function}({placeholders})", arguments).fetchone()
    assert row is not None
    return bool(row[0])


def server_admits(
    connection: psycopg.Connection[Any], plane: AdmissionPlane, request_id: str, now: int, parallel: bool
) -> bool:
    """The server's answer (``admission_plane_blind_admissible``) with what the plane assumes of the policy."""
    return _answer(connection, "admission_plane_blind_admissible", (request_id, *_assumed(plane, now, parallel)))


def server_admits_entering(
    connection: psycopg.Connection[Any], plane: AdmissionPlane, request_id: str, now: int, parallel: bool
) -> bool | None:
    """``admission_plane_blind_admissible_new`` for ``request_id`` as its enqueue asks it, before the request is
    in the admission index: taken out of the index (and its place given) in a transaction rolled back after.
    ``None`` when the request is not in the index."""
    place = connection.execute(
        "SELECT lane, provider, model, agent_id, enqueued_at FROM queue_entries WHERE request_id = %s", (request_id,)
    ).fetchone()
    if place is None:
        return None
    arguments = (request_id, *place, *_assumed(plane, now, parallel))
    with connection.transaction(force_rollback=True):
        connection.execute("SELECT pg_temp.admission_plane_queue_remove(%s)", (request_id,))
        left = connection.execute("SELECT count(*) FROM queue_entries WHERE request_id = %s", (request_id,))
        assert left.fetchone() == (0,)
        return _answer(connection, "admission_plane_blind_admissible_new", arguments)


def in_scope(database_url: str, request_id: str, now: int) -> bool:
    """Whether the state is one the function decides (else it must refuse, and the long way decides): no request
    to time out, one lane queued, neither everything nor the request's lane paused, its agent holding no seat (the
    rule then turns to the agents holding seats, fewest first, which the server leaves to the long way)."""
    lane = scalar(database_url, "SELECT lane FROM queue_entries WHERE request_id = ?", (request_id,))
    if lane is None:
        return True  # not admissible either way
    expired = scalar(
        database_url, "SELECT count(*) FROM turn_requests WHERE state = 'queued' AND deadline_at <= ?", (now,)
    )
    lanes = scalar(database_url, "SELECT count(DISTINCT lane) FROM queue_keys")
    blocking = scalar(
        database_url,
        "SELECT count(*) FROM admission_pauses WHERE lane = ? OR (lane = '' AND provider = '')",
        (lane,),
    )
    seated = scalar(
        database_url,
        "SELECT count(*) FROM leases l JOIN turn_requests r ON r.request_id = l.request_id"
        f" WHERE l.phase IN ({', '.join(repr(phase) for phase in SEAT_PHASES)})"
        " AND r.agent_id = (SELECT agent_id FROM queue_entries WHERE request_id = ?)",
        (request_id,),
    )
    return expired == 0 and lanes == 1 and blocking == 0 and seated == 0


@pytest.fixture
def server(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection holding the session functions (created as the pool creates them)."""
    from admission_plane.store import session_functions

    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        connection.execute(session_functions.INSTALL, prepare=False)
        yield connection


@POSTGRES_ONLY
@settings(
    max_examples=60,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(policy=policies, sequence=st.lists(steps, min_size=4, max_size=30))
# Each holds one part of the function to the rule (it fails when that part is removed or loosened):
# free seats for every idle agent ahead and for it (r-03 has two ahead, two seats; with three, only as a waiter),
@example(
    policy=_policy(2), sequence=[Enqueue(0, 0, 0, False, 0), Enqueue(1, 0, 0, False, 0), Enqueue(2, 0, 0, False, 0)]
)
@example(
    policy=_policy(3), sequence=[Enqueue(0, 0, 0, False, 0), Enqueue(1, 0, 0, False, 0), Enqueue(2, 0, 0, False, 0)]
)
# an agent holding a seat is not ahead (r-03 takes the free seat), and a request of one is not admitted (r-02),
@example(
    policy=_policy(2),
    sequence=[Enqueue(0, 0, 0, False, 5), AdmitNext(), Enqueue(0, 0, 0, False, 4), Enqueue(1, 0, 0, False, 0)],
)
@example(
    policy=_policy(3),
    sequence=[Enqueue(0, 0, 0, False, 5), AdmitNext(), Enqueue(0, 0, 0, False, 4), Enqueue(1, 0, 0, False, 0)],
)
# a paused key's agents are not ahead, a cooling key admits nothing, a request past its deadline is not admitted,
@example(policy=_policy(1), sequence=[Enqueue(0, 0, 0, False, 5), Enqueue(1, 1, 0, False, 0), Pause("m0")])
@example(policy=_policy(1), sequence=[Enqueue(0, 0, 0, False, 0), Cool(0, 40_000)])
@example(policy=_policy(1), sequence=[Enqueue(0, 0, 0, False, 0), Advance(70_000)])
# and a second lane queued leaves the weighted share to the rule.
@example(policy=_policy(3), sequence=[Enqueue(0, 0, 0, False, 0), Enqueue(1, 0, 0, True, 0)])
def test_the_server_admits_exactly_what_the_rule_admits(
    make_plane: PlaneFactory,
    database_url: str,
    server: psycopg.Connection[Any],
    policy: Policy,
    sequence: list[Step],
) -> None:
    """Random queues (two lanes, four agents, three keys, two sessions, equal and older enqueue times), seats held
    in and past the start window, cooldowns, pauses and queue time-outs: for every request, as a waiter
    (``parallel``) and as ``admit_request``, the server never admits what the rule does not, and where it decides
    (``in_scope``) it admits exactly what the rule admits; asked for a request not yet in the index, as an enqueue asks
    (``admission_plane_blind_admissible_new``), it answers as for the request in the index. Then one waiter's real
    admission sent whole commits exactly when the server said so."""
    reset_postgres(database_url)
    plane = make_plane(policy=policy)
    try:
        check(plane, database_url, server, sequence)
    finally:
        plane.close()


def check(plane: AdmissionPlane, database_url: str, server: psycopg.Connection[Any], sequence: list[Step]) -> None:
    owner = plane.owner_identity.owner_instance_id
    now, number = 100_000, 0
    leases: list[AdmittedLease] = []
    for step in sequence:
        if isinstance(step, Enqueue):
            number += 1
            enqueue(
                plane,
                f"r-{number:02}",
                AGENTS[step.agent],
                now - step.back,
                model=MODELS[step.model],
                session_id=f"s-{step.agent}-{step.session}",
                lane="batch" if step.batch else "default",
                expires_at=now + 10 * TIMEOUT_MS,
            )
        elif isinstance(step, AdmitNext):
            lease = plane.admit_next(now, owner)
            if lease is not None:
                leases.append(lease)
        elif isinstance(step, Activate) and leases:
            lease = leases[step.lease % len(leases)]
            if state(plane, lease.request_id) == RequestState.ADMITTED:
                activate(plane, lease, now)  # out of the start window, still holding its seat
        elif isinstance(step, Finish) and leases:
            lease = leases.pop(step.lease % len(leases))
            if state(plane, lease.request_id) == RequestState.ACTIVE:
                plane.complete_live_turn(lease, now, LiveTurnCompletion("completed"))
            else:
                plane.abandon_before_prompt(lease, now, "cancelled")
        elif isinstance(step, Cool):
            plane.set_capacity_cooldown("antigravity", MODELS[step.model], now + step.ms, now)
        elif isinstance(step, Pause):
            if step.scope == "all":
                plane.pause(now=now)
            elif step.scope in ("default", "batch"):
                plane.pause(lane=step.scope, now=now)
            else:
                plane.pause(provider="antigravity", model=step.scope, now=now)
        elif isinstance(step, Advance):
            now += step.ms
    requests = [row[0] for row in query(database_url, "SELECT request_id FROM turn_requests ORDER BY request_id")]
    decided = []
    for request_id in [*requests, "no-such-request"]:
        for parallel in (True, False):
            server_says = server_admits(server, plane, request_id, now, parallel)
            rule_says = rule_admits(plane, request_id, now, parallel)
            assert not server_says or rule_says, f"the server admits {request_id} (parallel={parallel}), the rule not"
            entering = server_admits_entering(server, plane, request_id, now, parallel)
            # An enqueue asks before its request is in the index (``SENT_BLIND_TRY``): the same answer.
            assert entering is None or entering == server_says, f"{request_id} (parallel={parallel}) entering"
            if in_scope(database_url, request_id, now):
                assert server_says == rule_says, f"{request_id} (parallel={parallel}): server {server_says}"
                if server_says and parallel:
                    decided.append(request_id)
    event(f"admitted by the server: {min(len(decided), 3)}")
    if decided:  # the real unit, sent whole: it commits exactly what the server decided
        plane._ctx.owner_recorded = True
        lease = _admit(plane._ctx, now, owner, decided[-1], True, long_way=False)
        assert lease is not None
        assert lease.request_id == decided[-1]
        assert state(plane, decided[-1]) == RequestState.ADMITTED


# --- the admission sent whole, and its long way --------------------------------------------------------------------

ROOMY = Policy(8, 8, 0, 1_800_000, 30_000)


def refused_sent(database_url: str) -> int:
    """How many fallbacks a refusal below must cause: one on PostgreSQL, none on SQLite (always the long way)."""
    return 1 if is_postgres(database_url) else 0


def first_turn(plane: AdmissionPlane) -> None:
    """The connector's first turns: its record is written, so the next admissions may be sent whole, and one was
    (its statement is prepared on the connection after its first commit)."""
    owner = plane.owner_identity.owner_instance_id
    for request_id in ("first", "second"):
        enqueue(plane, request_id, "agent-first", 1_000)
        lease = plane.admit_request(request_id, 1_000, owner)
        assert lease is not None
        plane.abandon_before_prompt(lease, 1_001, "cancelled")


@POSTGRES_ONLY
def test_a_waiters_first_attempt_is_one_round_trip(
    make_plane: PlaneFactory, database_url: str, statements: list[str]
) -> None:
    """With a free seat, ``wait_for_admission`` admits in one round trip: ``BEGIN``, the admission gate, the
    reservation the server decided and ``COMMIT`` in one message, and the lease it returns is the committed one."""
    plane = make_plane(policy=ROOMY, clock=lambda: 2_000)
    first_turn(plane)
    enqueue(plane, "r", "agent-1", 2_000)
    statements.clear()
    lease = plane.wait_for_admission("r", plane.owner_identity.owner_instance_id, timeout_ms=1_000)
    assert lease is not None
    assert len(statements) == 1, "\n\n".join(statements)
    assert statements[0].startswith("BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock(")
    assert statements[0].endswith("COMMIT")
    assert state(plane, "r") == RequestState.ADMITTED
    assert query(database_url, "SELECT lease_id, generation FROM leases WHERE request_id = 'r'") == [
        (lease.lease_id, lease.generation)
    ]


@POSTGRES_ONLY
@pytest.mark.parametrize("cooling", [RANK_HORIZON, RANK_HORIZON + 1])
def test_the_server_reads_a_bounded_number_of_keys_ahead(
    make_plane: PlaneFactory, database_url: str, server: psycopg.Connection[Any], fallbacks: list[str], cooling: int
) -> None:
    """Cooling keys ahead of a request hold nothing back in the rule, which admits it past any number of them. The
    server admits it past ``RANK_HORIZON`` of them and refuses past more, without reading them (the long way
    decides and admits it): no queue makes the function read every key under the admission gate (before the
    bound, 2 000 cooling keys took it 6.8 ms)."""
    plane = make_plane(policy=ROOMY, clock=lambda: 2_000)
    first_turn(plane)
    for index in range(cooling):
        enqueue(plane, f"cool-{index}", f"agent-{index}", 1_000 + index, model=f"m-{index}")
        plane.set_capacity_cooldown("antigravity", f"m-{index}", 10**12, 1_000 + index)
    enqueue(plane, "warm", "agent-warm", 2_000, model="m-warm")
    assert rule_admits(plane, "warm", 2_000, parallel=True)
    assert server_admits(server, plane, "warm", 2_000, parallel=True) is (cooling <= RANK_HORIZON)
    fallbacks.clear()
    lease = plane.wait_for_admission("warm", plane.owner_identity.owner_instance_id, timeout_ms=1_000)
    assert lease is not None
    assert lease.request_id == "warm"
    assert len(fallbacks) == (0 if cooling <= RANK_HORIZON else 1)
    assert all(state(plane, f"cool-{index}") == RequestState.QUEUED for index in range(cooling))


def test_a_request_to_time_out_sends_the_admission_the_long_way(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str]
) -> None:
    """A queued request past its deadline: the server refuses the admission sent whole (only the long way times
    requests out), and the long way times it out and admits the waiter's request, as on SQLite."""
    plane = make_plane(policy=Policy(4, 4, 0, 1_000, 30_000), clock=lambda: 3_500)
    first_turn(plane)
    enqueue(plane, "stale", "agent-1", 2_000, expires_at=10_000_000)
    enqueue(plane, "fresh", "agent-2", 3_500, expires_at=10_000_000)
    fallbacks.clear()
    lease = plane.wait_for_admission("fresh", plane.owner_identity.owner_instance_id, timeout_ms=1_000)
    assert lease is not None
    assert lease.request_id == "fresh"
    assert state(plane, "stale") == RequestState.QUEUE_TIMEOUT
    assert len(fallbacks) == refused_sent(database_url)


def test_a_revision_set_by_another_plane_refuses_the_admission_sent_whole_once(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str]
) -> None:
    """The server checks the policy revision the plane assumed: after another plane's revision (one seat, a start
    interval), a waiter's first attempt sent whole is refused, and its look and the long way admit under the
    revision; the next waiter's is not sent whole (a start interval is for the long way) and waits for the seat."""
    plane = make_plane(policy=ROOMY, clock=lambda: 2_002)
    first_turn(plane)
    owner = plane.owner_identity.owner_instance_id
    enqueue(plane, "a", "agent-1", 2_000)
    enqueue(plane, "b", "agent-2", 2_001)
    revised = Policy(1, 1, 2_000, 1_800_000, 30_000)
    make_plane(policy=revised).set_policy(revised, now=2_001)
    fallbacks.clear()
    assert plane.wait_for_admission("a", owner, timeout_ms=0) is not None
    assert len(fallbacks) == refused_sent(database_url)
    assert plane.wait_for_admission("b", owner, timeout_ms=0) is None  # one seat, held
    assert len(fallbacks) == refused_sent(database_url)


def test_a_soft_drain_refuses_the_admission_sent_whole(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str]
) -> None:
    """Another plane's soft drain (its durable policy claimed at three seats, draining to one) admits nothing:
    the server refuses a waiter's first attempt sent whole, and its look finds no seat to take; once the drain
    completed, the request is admitted."""
    durable = Policy(3, 3, 2_000, 1_800_000, 30_000)
    drainer = make_plane(policy=durable)
    owner = drainer.owner_identity.owner_instance_id
    drainer.claim_durable_policy(durable, owner, 900)
    plane = make_plane(policy=Policy(3, 3, 0, 1_800_000, 30_000), clock=lambda: 2_004)
    first_turn(plane)
    enqueue(plane, "held", "agent-1", 2_000)
    held = plane.admit_request("held", 2_001, plane.owner_identity.owner_instance_id)
    assert held is not None
    drainer.begin_soft_drain_to_1(owner, 2_002)
    enqueue(plane, "r", "agent-2", 2_003)
    fallbacks.clear()
    assert plane.wait_for_admission("r", plane.owner_identity.owner_instance_id, timeout_ms=0) is None
    assert len(fallbacks) == refused_sent(database_url)
    assert state(plane, "r") == RequestState.QUEUED
    plane.abandon_before_prompt(held, 2_005, "cancelled")  # the last seat: the drain completes
    assert query(database_url, "SELECT drain_state, max_active_turns FROM policy_state") == [("steady", 1)]
    assert plane.admit_request("r", 2_006, plane.owner_identity.owner_instance_id) is not None


@POSTGRES_ONLY
def test_a_policy_the_server_does_not_decide_is_never_sent_whole(
    make_plane: PlaneFactory, statements: list[str], fallbacks: list[str]
) -> None:
    """Under a keyed limit (or a session limit, a budget, a start interval) the admission reads first, as before:
    ``admit_request`` is its look and the two round trips of the admission, and nothing is refused."""
    policy = Policy(4, 4, 0, 1_800_000, 30_000, key_limits=(KeyLimit("antigravity", "model-test", 2),))
    plane = make_plane(policy=policy)
    first_turn(plane)
    enqueue(plane, "r", "agent-1", 2_000)
    statements.clear()
    assert plane.admit_request("r", 2_001, plane.owner_identity.owner_instance_id) is not None
    assert len(statements) == 3, statements
    assert fallbacks == []


# --- an enqueue that admits its request too (``admit_as``) ----------------------------------------------------------


def enqueue_admitting(plane: AdmissionPlane, request_id: str, agent_id: str, now: int, **overrides: Any) -> Any:
    """``enqueue_with_payload`` asked to admit the request under the plane's own owner instance."""
    return enqueue(plane, request_id, agent_id, now, admit_as=plane.owner_identity.owner_instance_id, **overrides)


def request_events(database_url: str) -> list[tuple[str, str, str]]:
    """The journal's request edges, in sequence order (the first turns' included)."""
    return [event for event in event_kinds(database_url) if event[0].startswith("request_")]


def test_an_enqueue_asked_to_admit_does_both_in_one_commit(
    make_plane: PlaneFactory, database_url: str, statements: list[str]
) -> None:
    """With a free seat, ``enqueue_with_payload(admit_as=...)`` queues and admits the request in one transaction
    (on PostgreSQL in one round trip, the admission decided by the server): the lease it returns is the committed
    one, the journal holds the enqueue and then the admission, and the request left the admission index."""
    plane = make_plane(policy=ROOMY)
    first_turn(plane)
    warm = enqueue_admitting(plane, "warm", "agent-0", 1_500).admitted  # its statements prepared after its commit
    assert warm is not None
    plane.abandon_before_prompt(warm, 1_501, "cancelled")
    before = len(request_events(database_url))
    statements.clear()
    result = enqueue_admitting(plane, "r", "agent-1", 2_000)
    if is_postgres(database_url):
        assert len(statements) == 1, "\n\n".join(statements)
    assert not result.existed
    lease = result.admitted
    assert lease is not None
    assert lease.request_id == "r"
    assert lease.owner_instance_id == plane.owner_identity.owner_instance_id
    assert state(plane, "r") == RequestState.ADMITTED
    assert query(database_url, "SELECT lease_id, generation FROM leases WHERE request_id = 'r'") == [
        (lease.lease_id, lease.generation)
    ]
    assert request_events(database_url)[before:] == [
        ("request_enqueued", "absent", "queued"),
        ("request_admitted", "queued", "admitted"),
    ]
    assert_index_consistent(database_url)
    plane.mark_starting(lease, 2_001)  # the lease is the plane's to drive


def test_an_enqueue_the_rule_does_not_admit_is_only_enqueued(make_plane: PlaneFactory, database_url: str) -> None:
    """With the one seat held, the enqueue asked to admit queues the request and admits nothing: no lease, no
    admission in the journal, the request in the admission index; once the seat is freed a wait admits it. A
    replay of the enqueue is answered as a replay and admits nothing either."""
    plane = make_plane(policy=Policy(1, 1, 0, 1_800_000, 30_000), clock=lambda: 2_010)
    first_turn(plane)
    enqueue(plane, "held", "agent-0", 2_000)
    held = plane.admit_request("held", 2_000, plane.owner_identity.owner_instance_id)
    assert held is not None
    before = len(request_events(database_url))
    result = enqueue_admitting(plane, "r", "agent-1", 2_001)
    assert result.admitted is None
    assert state(plane, "r") == RequestState.QUEUED
    assert query(database_url, "SELECT count(*) FROM leases WHERE request_id = 'r'") == [(0,)]
    assert request_events(database_url)[before:] == [("request_enqueued", "absent", "queued")]
    assert_index_consistent(database_url)
    replay = enqueue_admitting(plane, "r", "agent-1", 2_001)
    assert replay.existed
    assert replay.admitted is None
    plane.abandon_before_prompt(held, 2_002, "cancelled")
    lease = plane.wait_for_admission("r", plane.owner_identity.owner_instance_id, timeout_ms=1_000)
    assert lease is not None
    assert_index_consistent(database_url)


def test_an_enqueue_under_a_policy_the_server_does_not_decide_admits_only_on_sqlite(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Under a keyed limit, SQLite admits the request inside the enqueue's write lock (the long way), while
    PostgreSQL only enqueues it (its enqueue runs beside others; the admission gate is for the admission): the
    waiter then admits it as before."""
    policy = Policy(4, 4, 0, 1_800_000, 30_000, key_limits=(KeyLimit("antigravity", "model-test", 2),))
    plane = make_plane(policy=policy, clock=lambda: 2_001)
    first_turn(plane)
    result = enqueue_admitting(plane, "r", "agent-1", 2_000)
    if is_postgres(database_url):
        assert result.admitted is None
        assert state(plane, "r") == RequestState.QUEUED
        assert plane.wait_for_admission("r", plane.owner_identity.owner_instance_id, timeout_ms=1_000) is not None
    else:
        assert result.admitted is not None
    assert state(plane, "r") == RequestState.ADMITTED


def test_a_bad_admit_as_is_refused_and_changes_nothing(make_plane: PlaneFactory, database_url: str) -> None:
    """``admit_as`` must be an identifier: anything else raises ``InvalidInputError`` before anything is written."""
    plane = make_plane(policy=ROOMY)
    before = table_dump(database_url)
    for bad in ("", " spaced ", "x" * 1_000, 42):
        with pytest.raises(InvalidInputError):
            enqueue(plane, "r", "agent-1", 2_000, admit_as=bad)
    assert table_dump(database_url) == before
