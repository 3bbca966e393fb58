"""Admission policy v2 (issue 13): lanes, fair share by seats held, keyed limits, the per-session limit, live
policy revisions, pause and resume, the doorbell for each new way capacity frees, and the admission index.

Every test runs on an SQLite file and on PostgreSQL (the ``make_plane`` fixture), except the ones that read the
SQLite doorbell's counters. After most scenarios the admission index is compared with the one recomputed from
the queue (:mod:`admission_index`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from admission_index import assert_index_consistent
from dbutil import count, event_kinds, execute, query, request_state, table_dump
from planes import Clock, PlaneFactory, activate, admit, enqueue

from admission_plane import (
    AdmissionConflictError,
    AdmissionPlane,
    AdmissionRuntimeError,
    AdmittedLease,
    EnqueueResult,
    InvalidInputError,
    KeyLimit,
    Lane,
    LiveTurnCompletion,
    Pause,
    Policy,
    PolicyRevision,
    RequestState,
    SessionLimitError,
)
from admission_plane.service import _admission, _wake
from admission_plane.store.doorbell import EVERYONE_STEP, Chimes

OWNER = "owner-a"
DONE = LiveTurnCompletion("completed")
SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
#: Eight seats and starts, no start interval: only the rule under test holds a request back.
ROOMY = Policy(8, 8, 0, 1_800_000, 30_000)
TWO_LANES = (Lane("interactive"), Lane("batch"))
#: A live revision must pass the durable row's bounds, which require a start interval of at least 2 s.
LIVE = Policy(8, 8, 2_000, 1_800_000, 30_000)


def policy(**fields: Any) -> Policy:
    """:data:`ROOMY` with the given fields changed."""
    return attrs.evolve(ROOMY, **fields)


def live(**fields: Any) -> Policy:
    """:data:`LIVE` with the given fields changed."""
    return attrs.evolve(LIVE, **fields)


def put(plane: AdmissionPlane, request_id: str, now: int, **fields: Any) -> EnqueueResult:
    """Enqueue with a payload: agent ``agent-<request_id>``, session ``s-<request_id>``, provider ``p1``, model
    ``m1`` unless ``fields`` say otherwise."""
    fields.setdefault("agent_id", f"agent-{request_id}")
    fields.setdefault("session_id", f"s-{request_id}")
    fields.setdefault("provider", "p1")
    fields.setdefault("model", "m1")
    return enqueue(plane, request_id, now=now, **fields)


def admitted(plane: AdmissionPlane, now: int) -> str | None:
    """Admit the rule's choice; its request id, or ``None``."""
    lease = plane.admit_next(now, OWNER)
    return None if lease is None else lease.request_id


def hold(plane: AdmissionPlane, request_id: str, now: int, **fields: Any) -> AdmittedLease:
    """Enqueue ``request_id`` and take it to ``active`` (it holds a seat, but no start slot)."""
    put(plane, request_id, now, **fields)
    lease = plane.admit_request(request_id, now + 1, plane.owner_identity.owner_instance_id)
    assert lease is not None, f"{request_id} should be admitted at once"
    activate(plane, lease, now + 1)
    return lease


def cancel(plane: AdmissionPlane, lease: AdmittedLease, now: int) -> None:
    """Free the seat of a lease still before its prompt."""
    plane.abandon_before_prompt(lease, now, "cancelled")


def lanes_of(database: str) -> dict[str, str]:
    return dict(query(database, "SELECT request_id, lane FROM turn_requests"))


# --- lanes -----------------------------------------------------------------------------------------------------------


def test_a_request_names_its_lane_and_omitting_it_means_the_first_lane(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """A request joins the lane it names; one that names none joins the policy's first lane."""
    plane = make_plane(policy=policy(lanes=TWO_LANES))
    put(plane, "named", 10, lane="batch")
    put(plane, "unnamed", 11)
    plane.enqueue(
        request_id="bare",
        session_id="s",
        agent_id="a",
        fingerprint="f",
        provider="p1",
        model="m1",
        now=12,
        lane="batch",
    )
    assert lanes_of(database_url) == {"named": "batch", "unnamed": "interactive", "bare": "batch"}
    assert_index_consistent(database_url)


def test_a_request_for_a_lane_the_policy_does_not_name_is_refused_and_nothing_is_written(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Enqueueing into an unknown lane raises InvalidInputError and writes nothing."""
    plane = make_plane(policy=policy(lanes=TWO_LANES))
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match="request lane is not a lane of the admission policy"):
        put(plane, "lost", 10, lane="nope")
    with pytest.raises(InvalidInputError, match="request lane"):
        put(plane, "bad", 10, lane="two\nlines")
    assert table_dump(database_url) == before


def test_replaying_an_enqueue_in_another_lane_is_a_conflict_and_the_same_lane_is_idempotent(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """The lane is part of a request's metadata: the same lane (named or by default) replays, another conflicts."""
    plane = make_plane(policy=policy(lanes=TWO_LANES))
    put(plane, "r", 10)
    assert plane.enqueue_with_payload(
        request_id="r",
        session_id="s-r",
        agent_id="agent-r",
        fingerprint="fingerprint-1",
        provider="p1",
        model="m1",
        now=10,
        plaintext="prompt for r",
        expires_at=10 + ROOMY.queue_timeout_ms + 1,
        lane="interactive",
    ).existed
    before = table_dump(database_url)
    with pytest.raises(AdmissionConflictError):
        put(plane, "r", 10, lane="batch")
    assert table_dump(database_url) == before


def test_a_higher_lane_goes_before_older_requests_of_a_lower_lane(make_plane: PlaneFactory, database_url: str) -> None:
    """Lanes are served in priority order: a newer interactive request is admitted before older batch ones."""
    plane = make_plane(policy=policy(lanes=(Lane("interactive", weight=3), Lane("batch"))))
    put(plane, "batch-old", 10, lane="batch")
    put(plane, "batch-older", 5, lane="batch")
    put(plane, "interactive-new", 20, lane="interactive")
    assert admitted(plane, 30) == "interactive-new"
    assert_index_consistent(database_url)


def test_a_lane_with_work_is_served_its_weight_share_while_a_higher_lane_stays_saturated(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Starvation freedom: with weights 3 and 1 and the interactive lane never empty, every round of four
    admissions gives three seats to interactive and one to batch, in that order."""
    plane = make_plane(policy=policy(lanes=(Lane("interactive", weight=3), Lane("batch"))))
    for n in range(4):
        put(plane, f"batch-{n}", n, lane="batch")  # the oldest requests of all
    for n in range(12):
        put(plane, f"interactive-{n}", 100 + n, lane="interactive")
    order = []
    for step in range(12):
        lease = admit(plane, 1_000 + step)
        order.append(lease.request_id)
        cancel(plane, lease, 1_000 + step)  # the seat frees: only the lanes' shares decide
        assert_index_consistent(database_url)
    interactive = iter(f"interactive-{n}" for n in range(9))
    batch = iter(f"batch-{n}" for n in range(3))
    assert order == [next(lane) for lane in [interactive, interactive, interactive, batch] * 3], "FIFO in each lane"
    assert sorted(
        row[0] for row in query(database_url, "SELECT request_id FROM turn_requests WHERE state = 'queued'")
    ) == [
        "batch-3",
        "interactive-10",
        "interactive-11",
        "interactive-9",
    ]


def test_a_lane_alone_with_work_takes_every_seat_whatever_its_weight(make_plane: PlaneFactory) -> None:
    """The weighted share only splits seats between lanes that have eligible work: a lone lower lane takes them all."""
    plane = make_plane(policy=policy(lanes=(Lane("interactive", weight=5), Lane("batch"))))
    for n in range(4):
        put(plane, f"batch-{n}", n, lane="batch")
    assert [admitted(plane, 100 + n) for n in range(4)] == [f"batch-{n}" for n in range(4)]


def test_a_paused_higher_lane_leaves_the_seats_to_the_lower_lane(make_plane: PlaneFactory, database_url: str) -> None:
    """While the interactive lane is paused, batch requests are admitted; on resume interactive goes first again."""
    plane = make_plane(policy=policy(lanes=TWO_LANES))
    put(plane, "interactive-1", 10, lane="interactive")
    put(plane, "batch-1", 20, lane="batch")
    put(plane, "batch-2", 21, lane="batch")
    assert plane.pause(lane="interactive", now=30)
    assert admitted(plane, 31) == "batch-1"
    assert plane.resume(lane="interactive", now=32)
    assert admitted(plane, 33) == "interactive-1"
    assert_index_consistent(database_url)


# --- fair share inside a lane ----------------------------------------------------------------------------------------


def test_the_agent_holding_the_fewest_seats_goes_first_then_the_oldest_request(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Agents without a seat first, then agents by the seats they hold (fewest first), the oldest request among
    equals: A holds 2 seats, B 1, C none, so C's request goes first, then the oldest of B's and C's (1 seat
    each), then B's, then A's oldest-queued request last."""
    plane = make_plane(policy=ROOMY)
    hold(plane, "a-held-1", 1, agent_id="A")
    hold(plane, "a-held-2", 2, agent_id="A")
    hold(plane, "b-held", 3, agent_id="B")
    put(plane, "a-next", 10, agent_id="A")
    put(plane, "c-first", 14, agent_id="C")
    put(plane, "c-second", 15, agent_id="C")
    put(plane, "b-next", 20, agent_id="B")
    order = [admitted(plane, 100 + n) for n in range(4)]
    assert order == ["c-first", "c-second", "b-next", "a-next"]
    assert_index_consistent(database_url)


def test_fair_share_counts_seats_across_lanes_keys_and_sessions(make_plane: PlaneFactory) -> None:
    """An agent's seats count whatever their key or session: A holds a seat on another provider, so B's newer
    request goes first."""
    plane = make_plane(policy=ROOMY)
    hold(plane, "a-held", 1, agent_id="A", provider="p2", model="m9", session_id="elsewhere")
    put(plane, "a-next", 10, agent_id="A")
    put(plane, "b-next", 20, agent_id="B")
    assert admitted(plane, 100) == "b-next"


# --- keyed limits ----------------------------------------------------------------------------------------------------


def test_a_provider_model_limit_holds_back_only_that_key(make_plane: PlaneFactory, database_url: str) -> None:
    """With p1/m1 limited to one active turn and that seat held, p1/m1's older requests wait while p1/m2 and p2/m1
    requests are admitted; freeing the seat admits p1/m1's oldest."""
    plane = make_plane(policy=policy(key_limits=(KeyLimit("p1", "m1", max_active_turns=1),)))
    held = hold(plane, "held", 1)
    put(plane, "p1-m1-old", 10)
    put(plane, "p1-m2", 20, model="m2")
    put(plane, "p2-m1", 30, provider="p2")
    assert [admitted(plane, 100), admitted(plane, 101), admitted(plane, 102)] == ["p1-m2", "p2-m1", None]
    assert request_state(database_url, "p1-m1-old") == "queued"
    plane.complete_live_turn(held, 103, DONE)
    assert admitted(plane, 104) == "p1-m1-old"
    assert_index_consistent(database_url)


def test_a_provider_limit_counts_every_model_of_the_provider(make_plane: PlaneFactory) -> None:
    """A provider-wide limit of 2 counts the seats of all its models; another provider is not affected."""
    plane = make_plane(policy=policy(key_limits=(KeyLimit("p1", max_active_turns=2),)))
    hold(plane, "m1-held", 1)
    hold(plane, "m2-held", 2, model="m2")
    put(plane, "m3", 10, model="m3")
    put(plane, "other", 20, provider="p2")
    assert [admitted(plane, 100), admitted(plane, 101)] == ["other", None]


def test_concurrent_starts_per_provider_count_only_leases_in_the_start_window(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """With p1 limited to one concurrent start, a second p1 request waits while the first lease is admitted and is
    admitted once it is active; p2 is not held back meanwhile."""
    plane = make_plane(policy=policy(key_limits=(KeyLimit("p1", max_concurrent_starts=1),)))
    put(plane, "p1-first", 10)
    put(plane, "p1-second", 11, model="m2")
    put(plane, "p2", 12, provider="p2")
    first = admit(plane, 100)
    assert first.request_id == "p1-first"
    assert admitted(plane, 101) == "p2"
    assert admitted(plane, 102) is None
    activate(plane, first, 103)
    assert admitted(plane, 110) == "p1-second"
    assert_index_consistent(database_url)


def test_a_request_held_back_by_its_keys_limit_never_holds_back_another_key(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Twenty older requests of a full key do not stand in the way of a newer request of another key: even a
    targeted admission of it succeeds, and a waiter's look says it may be admitted now."""
    plane = make_plane(policy=policy(key_limits=(KeyLimit("p1", "m1", max_active_turns=1),)))
    hold(plane, "held", 1)
    for n in range(20):
        put(plane, f"full-{n}", 10 + n, agent_id=f"agent-{n % 3}")
    put(plane, "free", 100, provider="p2")
    verdict = plane._ctx.run(lambda tx: _admission.look(plane._ctx, tx, "free", 200), read_only=True)
    assert verdict is _admission.Verdict.WRITE
    lease = plane.admit_request("free", 200, OWNER)
    assert lease is not None
    assert lease.request_id == "free"
    blocked = plane._ctx.run(lambda tx: _admission.look(plane._ctx, tx, "full-0", 201), read_only=True)
    assert blocked == _wake.Wake(queue=1, seats=True, starts=True), "a full key waits for a seat or a start"
    assert_index_consistent(database_url)


# --- the per-session limit -------------------------------------------------------------------------------------------


def test_a_session_at_its_limit_waits_while_other_sessions_are_admitted(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """With one turn per session ("wait"), a session's second request stays queued behind its running turn while a
    newer request of another session is admitted; when the turn ends the second request goes."""
    plane = make_plane(policy=policy(max_turns_per_session=1))
    running = hold(plane, "s1-first", 1, session_id="s1", agent_id="A")
    put(plane, "s1-second", 10, session_id="s1", agent_id="B")
    put(plane, "s2-first", 20, session_id="s2", agent_id="C")
    assert [admitted(plane, 100), admitted(plane, 101)] == ["s2-first", None]
    plane.complete_live_turn(running, 102, DONE)
    assert admitted(plane, 103) == "s1-second"
    assert_index_consistent(database_url)


def test_a_session_limit_of_two_admits_two_and_holds_the_third(make_plane: PlaneFactory) -> None:
    """max_turns_per_session=2: the same session gets two seats at once, never three."""
    plane = make_plane(policy=policy(max_turns_per_session=2))
    for n in range(3):
        put(plane, f"r{n}", 10 + n, session_id="s1")
    assert [admitted(plane, 100 + n) for n in range(3)] == ["r0", "r1", None]


def test_a_session_at_its_limit_is_refused_at_enqueue_with_its_own_error_and_nothing_is_written(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """With session_overflow="refuse", a request beyond the limit (queued and seated turns count) raises
    SessionLimitError and writes nothing; a replay of an accepted request is still idempotent, and once the turn
    ends the session accepts a new one."""
    plane = make_plane(policy=policy(max_turns_per_session=1, session_overflow="refuse"))
    put(plane, "first", 10, session_id="s1")
    before = table_dump(database_url)
    with pytest.raises(SessionLimitError, match="session already has the most turns the admission policy allows"):
        put(plane, "second", 11, session_id="s1")
    assert table_dump(database_url) == before
    assert put(plane, "first", 10, session_id="s1").existed, "a replay is not a new turn of the session"
    put(plane, "other-session", 12, session_id="s2")
    lease = plane.admit_request("first", 20, OWNER)
    assert lease is not None
    with pytest.raises(SessionLimitError):
        put(plane, "second", 21, session_id="s1")
    cancel(plane, lease, 22)
    put(plane, "second", 23, session_id="s1")
    assert request_state(database_url, "second") == "queued"
    assert_index_consistent(database_url)


# --- live policy -----------------------------------------------------------------------------------------------------


def test_a_revision_is_numbered_kept_in_history_and_journalled_without_identifiers(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Before any revision the current policy is the plane's own at revision 0; each set_policy is the next
    revision, current and first in the history, journalled as policy_revised over the policy row's correlation."""
    plane = make_plane(policy=ROOMY)
    assert plane.current_policy() == PolicyRevision(0, 0, ROOMY)
    assert plane.policy_history() == ()
    first = live(lanes=TWO_LANES, key_limits=(KeyLimit("p1", "m1", max_active_turns=2),))
    second = live(max_active_turns=2, max_turns_per_session=1, session_overflow="refuse")
    assert plane.set_policy(first, now=100) == PolicyRevision(1, 100, first)
    assert plane.set_policy(second, now=200) == PolicyRevision(2, 200, second)
    assert plane.current_policy() == PolicyRevision(2, 200, second)
    assert make_plane(policy=Policy()).current_policy() == PolicyRevision(2, 200, second), "any plane reads it"
    assert plane.policy_history() == (PolicyRevision(2, 200, second), PolicyRevision(1, 100, first))
    assert plane.policy_history(limit=1) == (PolicyRevision(2, 200, second),)
    assert event_kinds(database_url) == [("policy_revised", "policy_steady", "policy_steady")] * 2
    journal = query(database_url, "SELECT DISTINCT correlation_hmac FROM events")
    assert journal == [(plane._ctx.keys.correlation("policy-state"),)]
    documents = " ".join(row[0] for row in query(database_url, "SELECT document FROM policy_revisions"))
    assert "interactive" in documents, "the document is the policy itself (names of lanes and keys included)"
    assert "interactive" not in str(query(database_url, "SELECT * FROM events"))


def test_a_policy_the_durable_row_refuses_is_not_set_and_nothing_is_written(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """set_policy refuses values outside the durable bounds (and a non-policy) with InvalidInputError, writing
    nothing; history's limit must be 1 to 1000."""
    plane = make_plane(policy=ROOMY)
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match="durable admission policy min_start_interval_ms"):
        plane.set_policy(ROOMY, now=10)
    with pytest.raises(InvalidInputError, match="durable admission policy capacity_cooldown_ms"):
        plane.set_policy(live(capacity_cooldown_ms=1), now=10)
    with pytest.raises(InvalidInputError, match=r"policy must be an admission_plane\.Policy"):
        plane.set_policy(ROOMY.to_json(), now=10)  # type: ignore[arg-type]
    for bad in (0, 1001, True):
        with pytest.raises(InvalidInputError, match="policy history limit"):
            plane.policy_history(limit=bad)
    assert table_dump(database_url) == before


def test_a_revision_set_by_one_plane_is_in_force_for_another_at_its_next_transaction(make_plane: PlaneFactory) -> None:
    """A connector opened with its own (8-seat) policy applies a revision another connector set, without reopening."""
    plane = make_plane(policy=ROOMY)
    operator = make_plane(policy=ROOMY)
    hold(plane, "held", 1)
    put(plane, "waiting", 10)
    operator.set_policy(live(max_active_turns=1), now=20)
    assert admitted(plane, 10_000) is None
    operator.set_policy(live(max_active_turns=2), now=10_001)
    assert admitted(plane, 10_002) == "waiting"


def test_lowering_the_seat_limit_preempts_no_running_turn_and_admission_waits_until_it_holds(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Three running turns survive a revision to one seat and complete normally; nothing is admitted until fewer than
    one seat is held."""
    plane = make_plane(policy=policy(max_active_turns=3))
    running = [hold(plane, f"run-{n}", n, agent_id=f"agent-{n}") for n in range(3)]
    put(plane, "waiting", 10)
    plane.set_policy(live(max_active_turns=1), now=20)
    assert count(database_url, "leases", "phase = 'active'") == 3
    for n, lease in enumerate(running):
        assert admitted(plane, 10_000 + 10 * n) is None
        plane.heartbeat(lease, 10_001 + 10 * n)
        plane.complete_live_turn(lease, 10_002 + 10 * n, DONE)
    assert admitted(plane, 10_100) == "waiting"
    assert [request_state(database_url, f"run-{n}") for n in range(3)] == ["completed"] * 3


def test_lowering_a_key_limit_waits_until_the_key_is_below_it_and_raising_it_admits_at_once(
    make_plane: PlaneFactory,
) -> None:
    """A key limit lowered below the key's seats admits nothing of that key until they drop below it; raised
    again, the next request of the key is admitted at the next transaction."""
    plane = make_plane(policy=ROOMY)
    first = hold(plane, "k-1", 1)
    hold(plane, "k-2", 2)
    put(plane, "k-3", 10)
    plane.set_policy(live(key_limits=(KeyLimit("p1", "m1", max_active_turns=1),)), now=20)
    assert admitted(plane, 10_000) is None
    plane.complete_live_turn(first, 10_001, DONE)
    assert admitted(plane, 10_002) is None, "one seat of the key is still held: the limit of one holds only now"
    plane.set_policy(live(key_limits=(KeyLimit("p1", "m1", max_active_turns=3),)), now=10_003)
    assert admitted(plane, 10_004) == "k-3"


def test_a_lane_the_new_revision_no_longer_names_still_drains_after_the_named_lanes(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Requests queued in a lane a revision dropped are not lost: they are admitted after the lanes it names, and new
    requests can no longer join that lane."""
    plane = make_plane(policy=policy(lanes=TWO_LANES))
    put(plane, "old-batch", 1, lane="batch")
    plane.set_policy(live(lanes=(Lane("interactive"),)), now=5)
    put(plane, "interactive", 10)
    with pytest.raises(InvalidInputError, match="not a lane"):
        put(plane, "new-batch", 11, lane="batch")
    assert [admitted(plane, 10_000), admitted(plane, 20_000)] == ["interactive", "old-batch"]
    assert_index_consistent(database_url)


def test_a_revision_ends_a_soft_drain_in_progress(make_plane: PlaneFactory, database_url: str) -> None:
    """The original's soft drain still starts on a claimed three-seat policy; a revision set meanwhile ends it
    (journalled from draining to steady) and its seat limit is in force at once."""
    seed = Policy(3, 1, 2_000, 1_800_000, 30_000)
    plane = make_plane(policy=seed)
    plane.claim_durable_policy(seed, OWNER, 1)
    held = hold(plane, "held", 10)
    put(plane, "waiting", 20)
    plane.begin_soft_drain_to_1(OWNER, 30)
    assert admitted(plane, 5_000) is None
    plane.set_policy(attrs.evolve(seed, max_active_turns=2), now=5_001)
    assert query(database_url, "SELECT drain_state, max_active_turns, revision FROM policy_state") == [("steady", 2, 1)]
    assert event_kinds(database_url)[-1] == ("policy_revised", "policy_soft_draining_to_1", "policy_steady")
    assert admitted(plane, 10_000) == "waiting"
    plane.complete_live_turn(held, 10_001, DONE)


def test_the_seed_operations_keep_working_for_a_seed_shaped_revision(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """A seed-shaped revision of three seats can be asserted like a claimed policy, drained to one seat, and the
    policy in force then reports the one seat admission uses."""
    seed = Policy(3, 1, 2_000, 1_800_000, 30_000)
    plane = make_plane(policy=seed)
    plane.set_policy(seed, now=1)
    plane.assert_durable_policy_match(seed, OWNER, 2)
    with pytest.raises(AdmissionRuntimeError, match="does not match"):
        plane.assert_durable_policy_match(ROOMY, OWNER, 2)
    held = [hold(plane, f"held-{n}", 10 + 3_000 * n, agent_id=f"agent-{n}") for n in range(2)]
    put(plane, "waiting", 3_100)
    plane.begin_soft_drain_to_1(OWNER, 3_200)
    plane.complete_live_turn(held[0], 3_300, DONE)
    assert admitted(plane, 5_000) is None
    plane.complete_live_turn(held[1], 5_001, DONE)
    assert query(database_url, "SELECT drain_state, max_active_turns FROM policy_state") == [("steady", 1)]
    assert plane.current_policy().policy.max_active_turns == 1
    assert admitted(plane, 10_000) == "waiting"
    put(plane, "second", 10_001)
    assert admitted(plane, 20_000) is None, "one seat after the drain"


# --- pause and resume ------------------------------------------------------------------------------------------------


def test_a_global_pause_stops_admission_but_not_running_turns_and_resume_restarts_it(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """While everything is paused nothing is admitted (targeted or not), a running turn goes through its whole
    lifecycle, and after resume the queue is admitted again; pause and resume are journalled by scope kind only."""
    plane = make_plane(policy=ROOMY)
    put(plane, "running", 1)
    lease = admit(plane, 2)
    put(plane, "waiting", 3)
    assert plane.pause(now=10) is True
    assert plane.pause(now=11) is False, "already paused"
    assert plane.pauses() == (Pause(None, None, None, 10),)
    assert plane.pauses()[0].scope == "all"
    assert admitted(plane, 12) is None
    assert plane.admit_request("waiting", 12, OWNER) is None
    activate(plane, lease, 13)
    plane.complete_live_turn(lease, 20, DONE)
    assert plane.resume(now=30) is True
    assert plane.resume(now=31) is False, "not paused any more"
    assert plane.pauses() == ()
    assert admitted(plane, 32) == "waiting"
    kinds = [kind for kind in event_kinds(database_url) if kind[0].startswith("admission_")]
    assert kinds == [("admission_paused", "admitting", "paused_all"), ("admission_resumed", "paused_all", "admitting")]


def test_a_key_pause_holds_back_only_that_provider_model(make_plane: PlaneFactory, database_url: str) -> None:
    """Pausing p1/m1 leaves its requests queued while other keys (p1/m2 included) are admitted; resuming admits
    them."""
    plane = make_plane(policy=ROOMY)
    put(plane, "paused-key", 1)
    put(plane, "same-provider", 2, model="m2")
    assert plane.pause(provider="p1", model="m1", now=5)
    assert plane.pauses() == (Pause(None, "p1", "m1", 5),)
    assert [admitted(plane, 10), admitted(plane, 11)] == ["same-provider", None]
    assert plane.resume(provider="p1", model="m1", now=12)
    assert admitted(plane, 13) == "paused-key"
    assert ("admission_paused", "admitting", "paused_key") in event_kinds(database_url)


def test_queue_timeouts_still_apply_while_admission_is_paused(make_plane: PlaneFactory, database_url: str) -> None:
    """A request whose queue deadline passes while everything is paused times out at the next admission attempt."""
    plane = make_plane(policy=policy(queue_timeout_ms=1_000))
    put(plane, "late", 10)
    plane.pause(now=20)
    assert admitted(plane, 2_000) is None
    assert request_state(database_url, "late") == "queue_timeout"
    assert_index_consistent(database_url)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"lane": "x", "provider": "p1", "model": "m1"}, "a pause names a lane or a provider/model key, not both"),
        ({"provider": "p1"}, "a key pause names both its provider and its model"),
        ({"model": "m1"}, "a key pause names both its provider and its model"),
        ({"lane": ""}, "pause lane"),
        ({"lane": "x", "now": -1}, "pause timestamp"),
    ],
)
def test_a_pause_with_an_invalid_scope_is_refused_and_nothing_is_written(
    plane: AdmissionPlane, database_url: str, arguments: dict[str, Any], message: str
) -> None:
    """A pause names everything, one lane, or one provider/model key; anything else is invalid input."""
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=message):
        plane.pause(**arguments)
    assert table_dump(database_url) == before


# --- the doorbell for every new way capacity frees (SQLite: the counters are read directly) --------------------------


def chimes(plane: AdmissionPlane) -> Chimes:
    reading = plane._ctx.doorbell.read() if plane._ctx.doorbell is not None else None
    assert reading is not None, "an SQLite file plane has a doorbell"
    return reading


def record_looks(plane: AdmissionPlane, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of sleeps so far at every admission look the plane runs."""
    looks: list[int] = []
    original = _admission.look

    def look(ctx: Any, tx: Any, request_id: str, *args: Any, **options: Any) -> Any:
        if ctx is plane._ctx:
            looks.append(len(clock.sleeps))
        return original(ctx, tx, request_id, *args, **options)

    monkeypatch.setattr(_admission, "look", look)
    return looks


def wait_until_freed(
    plane: AdmissionPlane, clock: Clock, monkeypatch: pytest.MonkeyPatch, request_id: str, free: Callable[[], object]
) -> list[int]:
    """Wait for ``request_id`` with a fallback of a minute, calling ``free`` at the fifth doorbell read; the looks."""
    looks = record_looks(plane, clock, monkeypatch)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 5:
            free()

    lease = plane.wait_for_admission(request_id, "me", sleep=sleep, fallback_ms=60_000, timeout_ms=30_000)
    assert lease is not None, "the waiter was never admitted"
    assert lease.request_id == request_id
    return looks


@SQLITE_ONLY
def test_a_waiter_held_back_by_its_keys_limit_looks_again_when_a_seat_of_the_key_frees(
    make_plane: PlaneFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The freed seat of a full key rings the doorbell and the waiter looks again at once (not after the fallback)."""
    clock = Clock()
    limited = policy(key_limits=(KeyLimit("p1", "m1", max_active_turns=1),))
    plane = make_plane(policy=limited, clock=clock)
    holder = make_plane(policy=limited)
    held = hold(holder, "held", 500)
    put(plane, "mine", 900)
    looks = wait_until_freed(plane, clock, monkeypatch, "mine", lambda: holder.complete_live_turn(held, 1_000, DONE))
    assert looks == [0, 5]


@SQLITE_ONLY
def test_a_waiter_held_back_by_its_sessions_limit_looks_again_when_the_sessions_turn_ends(
    make_plane: PlaneFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's freed slot rings the doorbell and the waiter of that session looks again at once."""
    clock = Clock()
    limited = policy(max_turns_per_session=1)
    plane = make_plane(policy=limited, clock=clock)
    holder = make_plane(policy=limited)
    held = hold(holder, "held", 500, session_id="s1", agent_id="A")
    put(plane, "mine", 900, session_id="s1", agent_id="B")
    looks = wait_until_freed(plane, clock, monkeypatch, "mine", lambda: holder.complete_live_turn(held, 1_000, DONE))
    assert looks == [0, 5]


@SQLITE_ONLY
def test_a_resume_rings_for_everyone_and_wakes_a_paused_waiter(
    make_plane: PlaneFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pausing rings nothing (it frees nothing); resuming adds a change for everyone, and a waiter held back by the
    pause looks again at once."""
    clock = Clock()
    plane = make_plane(policy=ROOMY, clock=clock)
    operator = make_plane(policy=ROOMY)
    put(plane, "mine", 900)
    before = chimes(plane)
    operator.pause(lane="default", now=950)
    assert chimes(plane) == before
    looks = wait_until_freed(plane, clock, monkeypatch, "mine", lambda: operator.resume(lane="default", now=1_000))
    assert looks == [0, 5]
    after = chimes(plane)
    assert after.since(before).seats >= EVERYONE_STEP


@SQLITE_ONLY
def test_a_raised_limit_rings_for_everyone_and_wakes_a_waiter_on_a_full_plane(
    make_plane: PlaneFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A revision raising the seat limit adds a change for everyone; the waiter on a full plane looks again at once."""
    clock = Clock(now=10_000)  # past the start interval of the held turn
    one = policy(max_active_turns=1)
    plane = make_plane(policy=one, clock=clock)
    operator = make_plane(policy=one)
    hold(operator, "held", 500)
    put(plane, "mine", 900)
    before = chimes(plane)
    looks = wait_until_freed(
        plane, clock, monkeypatch, "mine", lambda: operator.set_policy(live(max_active_turns=2), now=10_001)
    )
    assert looks == [0, 5]
    assert chimes(plane).since(before).queue >= EVERYONE_STEP


# --- the admission index ---------------------------------------------------------------------------------------------


def test_the_admission_index_follows_the_queue_through_every_way_in_and_out(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """After every operation the index is exactly the queued requests with a payload and their groups' heads: entry
    by payload (with or after enqueue), exit by admission, cancellation, queue time-out and a dead owner's
    settlement, with several requests per session, agent and key so heads move."""
    plane = make_plane(policy=policy(lanes=TWO_LANES, queue_timeout_ms=10_000))
    steps: list[tuple[str, Callable[[], object]]] = []
    for n in range(6):
        fields = {"agent_id": f"agent-{n % 2}", "session_id": f"s-{n % 3}", "lane": ("interactive", "batch")[n % 2]}
        steps.append((f"enqueue r{n}", lambda n=n, f=fields: put(plane, f"r{n}", 100 - n, **f)))
    steps.append(
        (
            "enqueue without payload",
            lambda: plane.enqueue(
                request_id="bare",
                session_id="s-0",
                agent_id="agent-0",
                fingerprint="f",
                provider="p1",
                model="m1",
                now=50,
            ),
        )
    )
    steps.append(("persist payload", lambda: plane.persist_payload("bare", "prompt", 60, 20_000)))
    steps.append(("admit", lambda: admit(plane, 200)))
    steps.append(("cancel a head", lambda: plane.cancel_queued("r5", 201)))
    steps.append(("cancel a non-head", lambda: plane.cancel_queued("r0", 202)))
    steps.append(
        (
            "settle a dead owner",
            lambda: plane.settle_queued_owner_death("r3", plane.owner_identity.owner_instance_id, 203),
        )
    )
    steps.append(("time out the rest", lambda: plane.admit_next(50_000, OWNER)))
    for name, step in steps:
        step()
        try:
            assert_index_consistent(database_url)
        except AssertionError as error:
            raise AssertionError(f"after {name}: {error}") from None
    assert count(database_url, "queue_entries") == 0
    assert count(database_url, "turn_requests", "state = 'queue_timeout'") >= 1


def test_an_expired_payload_read_while_queued_takes_the_request_out_of_the_index(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """A queued request whose expired payload is deleted by a read is no longer admissible (as in the original, which
    admits only requests with a payload) and a new payload puts it back."""
    plane = make_plane(policy=ROOMY)
    put(plane, "expiring", 10, expires_at=20)
    put(plane, "other", 11)
    with pytest.raises(Exception, match="expired"):
        plane.read_payload("expiring", 30)
    assert_index_consistent(database_url)
    assert admitted(plane, 40) == "other"
    assert admitted(plane, 41) is None
    plane.persist_payload("expiring", "again", 42, 100_000)
    assert_index_consistent(database_url)
    assert admitted(plane, 43) == "expiring"


def test_the_index_check_notices_a_corrupted_index(plane: AdmissionPlane, database_url: str) -> None:
    """The consistency helper is not vacuous: a moved head and a stray entry are both reported."""
    put(plane, "r1", 10, session_id="s")
    put(plane, "r2", 11, session_id="s")
    assert_index_consistent(database_url)
    execute(database_url, "UPDATE queue_sessions SET head_request_id = 'r2', head_enqueued_at = 11")
    with pytest.raises(AssertionError, match="queue_sessions"):
        assert_index_consistent(database_url)
    execute(database_url, "UPDATE queue_sessions SET head_request_id = 'r1', head_enqueued_at = 10")
    execute(database_url, "DELETE FROM turn_payloads WHERE request_id = 'r2'")
    with pytest.raises(AssertionError, match="queue_entries"):
        assert_index_consistent(database_url)


def test_a_request_state_other_than_queued_never_stays_in_the_index(plane: AdmissionPlane, database_url: str) -> None:
    """Admitted requests leave the index in the admitting transaction."""
    put(plane, "r1", 10)
    lease = admit(plane, 20)
    assert query(database_url, "SELECT COUNT(*) FROM queue_entries WHERE request_id = 'r1'") == [(0,)]
    assert plane.get_request("r1").state is RequestState.ADMITTED
    cancel(plane, lease, 21)
