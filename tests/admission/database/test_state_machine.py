"""Random operation sequences on a real SQLite file keep the admission plane's invariants.

A :class:`hypothesis.stateful.RuleBasedStateMachine` drives valid and invalid calls of every
lifecycle operation with a monotonically increasing ``now``. After every step: seats never
exceed the policy, a lease's phase mirrors its request's state, no request returns to
``queued``, terminal states never change, no payload survives ``active`` or a terminal state,
the journal is append-only and allowlisted, and the schema still passes its integrity check.
Every refused operation (an :class:`AdmissionError`, or a dispatch intent not committed)
leaves every table exactly as it was.

Policy v2: requests are enqueued in random lanes (known or not), sessions and provider/model
keys; live revisions with random lanes, keyed limits and per-session limits are set, and
admission is paused and resumed (everything, a lane, a key). Every admission must respect every
limit of the revision in force when it was made (global seats and starts, per provider/model,
per provider, starts per provider, per session) and no paused scope; lowering a limit preempts
nothing, so the seats held never exceed the highest seat limit ever in force. After every step
the admission index equals the one recomputed from the queue.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from typing import Any

import attrs
import pytest
from admission_index import INDEX_TABLES, index_differences
from dbutil import query, table_dump
from fake_proc import FakeProc
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from journal_replay import read_journal, replay
from planes import CONTENT_KEY, ENCRYPTION_KEY

from admission_plane import (
    AdmissionError,
    AdmissionPlane,
    AdmittedLease,
    ConnectorIdentity,
    DispatchRecord,
    KeyLimit,
    Lane,
    LeaseFence,
    LiveTurnCompletion,
    LiveTurnFailure,
    PayloadExpiredError,
    Policy,
)
from admission_plane.evidence import capture, read_boot_id
from admission_plane.states import SEAT_PHASES, START_WINDOW_PHASES, TERMINAL_STATES, FailureCategory
from admission_plane.store.schema_check import check_schema

POLICY = Policy(2, 1, 50, 20_000, 1_000)
OTHER_OWNER = "0b7e5a9c-3d2f-4e1a-9c8b-7a6f5e4d3c2b"
REQUEST_IDS = tuple(f"req-{n}" for n in range(6))
AGENTS = ("agent-a", "agent-b")
MODELS = ("model-x", "model-y")
PROMPTS = ("prompt one", "prompt two")
AFTER_DISPATCH = frozenset({"active", "provider_terminal", *TERMINAL_STATES})
_REFUSED = object()
SESSIONS = ("session", "session-2")
PROVIDERS = ("provider", "provider-2")
#: ``None``: the policy's default lane; ``"unknown"`` is never a lane of any policy (refused at enqueue).
LANES = (None, "default", "batch", "unknown")
#: The durable row's bounds: a live revision's start interval is at least 2 s and its cooldown at least 30 s.
revisions = st.builds(
    Policy,
    max_active_turns=st.integers(1, 3),
    max_concurrent_starts=st.integers(1, 2),
    min_start_interval_ms=st.just(2_000),
    queue_timeout_ms=st.sampled_from((20_000, 60_000)),
    capacity_cooldown_ms=st.just(30_000),
    lanes=st.sampled_from(
        (
            (Lane("default"),),
            (Lane("default", 2), Lane("batch")),
            (Lane("batch"), Lane("default")),
            (Lane("batch", 3),),
        )
    ),
    key_limits=st.lists(
        st.sampled_from(
            (
                KeyLimit("provider", MODELS[0], max_active_turns=1),
                KeyLimit("provider", max_active_turns=2),
                KeyLimit("provider-2", max_concurrent_starts=1),
                KeyLimit("provider-2", MODELS[1], max_active_turns=1),
            )
        ),
        unique=True,
        max_size=3,
    ).map(tuple),
    max_turns_per_session=st.sampled_from((None, 1, 2)),
    session_overflow=st.sampled_from(("wait", "refuse")),
)
#: A pause scope: everything, a lane, or a provider/model key.
scopes = st.sampled_from(
    (
        {},
        {"lane": "default"},
        {"lane": "batch"},
        {"provider": "provider", "model": MODELS[0]},
        {"provider": "provider-2", "model": MODELS[1]},
    )
)

completions = st.one_of(
    st.sampled_from(("completed", "cancelled", "failed")).map(LiveTurnCompletion),
    st.sampled_from(list(FailureCategory)).map(lambda c: LiveTurnCompletion("failed", LiveTurnFailure(c))),
)


@functools.cache
def migrated_template() -> str:
    """One migrated database file per test process, copied for every example."""
    from admission_plane.migrate import upgrade

    directory = tempfile.mkdtemp(prefix="admission-template-")
    atexit.register(shutil.rmtree, directory, True)
    path = os.path.join(directory, "template.sqlite")
    upgrade(path)
    return path


class AdmissionMachine(RuleBasedStateMachine):
    """Random lifecycle calls against one plane on a fresh database file."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="admission-sm-")
        self.path = os.path.join(self.directory, "admission.sqlite")
        shutil.copyfile(migrated_template(), self.path)
        self.plane = AdmissionPlane(
            self.path, policy=POLICY, encryption_key=ENCRYPTION_KEY, content_fingerprint_key=CONTENT_KEY
        )
        me = self.plane.owner_identity
        self.connectors = {
            me.owner_instance_id: me,
            OTHER_OWNER: ConnectorIdentity(owner_instance_id=OTHER_OWNER, created_at=me.created_at, process=me.process),
        }
        self.child = capture(os.getpid())
        self.other_child = attrs.evolve(self.child, start_time_ticks=str(int(self.child.start_time_ticks) + 1))
        # No process is listed, so the reaper finds every recorded process gone on this host's real boot id.
        self.readers = FakeProc(boot_id=_boot_id() + "\n")
        self.now = 1_000
        self.leases: list[AdmittedLease] = []
        self.prompts: dict[str, str] = {}
        self.states: dict[str, str] = {}
        self.event_count = 0
        self.policy = POLICY  # the policy in force (the plane's own until a revision is set)
        self.seat_ceiling = POLICY.max_active_turns  # the highest seat limit ever in force
        self.paused: list[dict[str, str]] = []

    def teardown(self) -> None:
        self.plane.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- helpers ---------------------------------------------------------------------------------

    def attempt(self, label: str, operation: Any) -> Any:
        """Run one operation; if it is refused, prove that it changed nothing."""
        before = table_dump(self.path)
        try:
            result = operation()
        except PayloadExpiredError:
            # The expired payload is deleted, and with it the request's place in the admission index (a
            # queued request without its payload is not admissible); nothing else changes.
            event(f"{label}: expired")
            after = table_dump(self.path)
            changed = {"turn_payloads", *INDEX_TABLES}
            assert {k: v for k, v in after.items() if k not in changed} == {
                k: v for k, v in before.items() if k not in changed
            }
            assert len(after["turn_payloads"]) == len(before["turn_payloads"]) - 1
            self.check_index(f"{label} (expired)")
            return _REFUSED
        except AdmissionError as error:
            event(f"{label}: refused ({type(error).__name__})")
            assert table_dump(self.path) == before
            return _REFUSED
        event(f"{label}: {'none' if result is None else 'done'}")
        return result

    def tick(self, advance: int) -> int:
        self.now += advance
        return self.now

    # --- queue -----------------------------------------------------------------------------------

    @initialize(count=st.integers(1, 4), agents=st.lists(st.sampled_from(AGENTS), min_size=4, max_size=4))
    def a_queue_to_start_from(self, count: int, agents: list[str]) -> None:
        for request_id, agent in zip(REQUEST_IDS[:count], agents, strict=False):
            self.plane.enqueue_with_payload(
                request_id=request_id,
                session_id="session",
                agent_id=agent,
                fingerprint="fp",
                provider="provider",
                model=MODELS[0],
                now=self.now,
                plaintext=PROMPTS[0],
                expires_at=self.now + 60_000,
            )
            self.prompts[request_id] = PROMPTS[0]

    @rule(
        request_id=st.sampled_from(REQUEST_IDS),
        agent=st.sampled_from(AGENTS),
        model=st.sampled_from(MODELS),
        prompt=st.sampled_from(PROMPTS),
        ttl=st.one_of(st.integers(1, 60_000), st.integers(-5, 0)),
        advance=st.integers(0, 400),
        session=st.sampled_from(SESSIONS),
        provider=st.sampled_from(PROVIDERS),
        lane=st.sampled_from(LANES),
    )
    def enqueue(
        self,
        request_id: str,
        agent: str,
        model: str,
        prompt: str,
        ttl: int,
        advance: int,
        session: str,
        provider: str,
        lane: str | None,
    ) -> None:
        now = self.tick(advance)
        result = self.attempt(
            "enqueue_with_payload",
            lambda: self.plane.enqueue_with_payload(
                request_id=request_id,
                session_id=session,
                agent_id=agent,
                fingerprint="fp",
                provider=provider,
                model=model,
                now=now,
                plaintext=prompt,
                expires_at=now + ttl,
                lane=lane,
            ),
        )
        if result is not _REFUSED:
            self.prompts.setdefault(request_id, prompt)
        elif lane == "unknown" or (lane is not None and lane not in {x.name for x in self.policy.lanes}):
            event("enqueue: an unknown lane refused")

    @rule(request_id=st.sampled_from(REQUEST_IDS), agent=st.sampled_from(AGENTS), advance=st.integers(0, 400))
    def enqueue_then_persist(self, request_id: str, agent: str, advance: int) -> None:
        """Enqueue without a payload (not admissible yet), then persist it (it enters the admission index)."""
        now = self.tick(advance)
        fields = {"session_id": "session", "agent_id": agent, "fingerprint": "fp", "provider": "provider-2"}
        enqueued = self.attempt(
            "enqueue", lambda: self.plane.enqueue(request_id=request_id, **fields, model=MODELS[1], now=now)
        )
        if enqueued is _REFUSED:
            return
        self.check_index("enqueue without a payload")
        persisted = self.attempt(
            "persist_payload", lambda: self.plane.persist_payload(request_id, PROMPTS[1], now, now + 60_000)
        )
        if persisted is not _REFUSED:
            self.prompts.setdefault(request_id, PROMPTS[1])

    # --- policy v2: live revisions, pause and resume --------------------------------------------------

    @rule(revision=revisions, advance=st.integers(0, 400))
    def set_policy(self, revision: Policy, advance: int) -> None:
        now = self.tick(advance)
        result = self.attempt("set_policy", lambda: self.plane.set_policy(revision, now=now))
        assert result is not _REFUSED, "a revision inside the durable bounds is always accepted"
        self.policy = revision
        self.seat_ceiling = max(self.seat_ceiling, revision.max_active_turns)
        assert self.plane.current_policy().policy == revision

    @rule(scope=scopes, advance=st.integers(0, 400))
    def pause(self, scope: dict[str, str], advance: int) -> None:
        now = self.tick(advance)
        changed = self.plane.pause(**scope, now=now)
        assert changed == (scope not in self.paused)
        if changed:
            self.paused.append(scope)

    @rule(scope=scopes, advance=st.integers(0, 400))
    def resume(self, scope: dict[str, str], advance: int) -> None:
        now = self.tick(advance)
        changed = self.plane.resume(**scope, now=now)
        assert changed == (scope in self.paused)
        if changed:
            self.paused.remove(scope)

    @rule(request_id=st.sampled_from(REQUEST_IDS), advance=st.integers(0, 400))
    def cancel_queued(self, request_id: str, advance: int) -> None:
        now = self.tick(advance)
        self.attempt("cancel_queued", lambda: self.plane.cancel_queued(request_id, now))

    @rule(request_id=st.sampled_from(REQUEST_IDS), advance=st.integers(0, 400))
    def read_payload(self, request_id: str, advance: int) -> None:
        now = self.tick(advance)
        state = self.states.get(request_id)
        result = self.attempt("read_payload", lambda: self.plane.read_payload(request_id, now))
        if state in AFTER_DISPATCH:
            assert result is _REFUSED
        if result is not _REFUSED:
            assert result == self.prompts[request_id]

    @rule(model=st.sampled_from(MODELS), length=st.integers(-10, 3_000), advance=st.integers(0, 400))
    def set_capacity_cooldown(self, model: str, length: int, advance: int) -> None:
        now = self.tick(advance)
        self.attempt(
            "set_capacity_cooldown", lambda: self.plane.set_capacity_cooldown("provider", model, now + length, now)
        )

    # --- admission -------------------------------------------------------------------------------

    @rule(owner=st.sampled_from(("mine", "other")), advance=st.integers(0, 400))
    def admit_next(self, owner: str, advance: int) -> None:
        now = self.tick(advance)
        lease = self.attempt("admit_next", lambda: self.plane.admit_next(now, self._owner(owner)))
        if isinstance(lease, AdmittedLease):
            self.check_admission(lease)
            self.leases.append(lease)

    @rule(
        request_id=st.sampled_from(REQUEST_IDS), owner=st.sampled_from(("mine", "other")), advance=st.integers(0, 400)
    )
    def admit_request(self, request_id: str, owner: str, advance: int) -> None:
        now = self.tick(advance)
        lease = self.attempt("admit_request", lambda: self.plane.admit_request(request_id, now, self._owner(owner)))
        if isinstance(lease, AdmittedLease):
            assert lease.request_id == request_id
            self.check_admission(lease)
            self.leases.append(lease)

    def check_admission(self, lease: AdmittedLease) -> None:
        """The admission just made respects every limit of the policy in force and no paused scope covers it."""
        policy = self.policy
        [(lane, provider, model, session)] = query(
            self.path,
            "SELECT lane, provider, model, session_id FROM turn_requests WHERE request_id = ?",
            (lease.request_id,),
        )
        for scope in self.paused:
            assert scope not in ({}, {"lane": lane}, {"provider": provider, "model": model}), f"admitted in {scope}"
        holders = query(
            self.path,
            "SELECT l.phase, r.provider, r.model, r.session_id FROM leases l JOIN turn_requests r USING (request_id)",
        )
        seats = [holder for holder in holders if holder[0] in SEAT_PHASES]
        starts = [holder for holder in seats if holder[0] in START_WINDOW_PHASES]
        assert len(seats) <= policy.max_active_turns, "global seats"
        assert len(starts) <= policy.max_concurrent_starts, "global starts"
        for limit in policy.key_limits:
            if limit.provider != provider or limit.model not in (None, model):
                continue
            of_key = [seat for seat in seats if seat[1] == provider and limit.model in (None, seat[2])]
            if limit.max_active_turns is not None:
                assert len(of_key) <= limit.max_active_turns, f"seats of {limit}"
            if limit.max_concurrent_starts is not None:
                assert len([seat for seat in of_key if seat[0] in START_WINDOW_PHASES]) <= limit.max_concurrent_starts
        if policy.max_turns_per_session is not None:
            assert len([seat for seat in seats if seat[3] == session]) <= policy.max_turns_per_session, "session"
        event(
            f"admitted under {'a revision' if policy is not POLICY else 'the plane policy'}"
            f" with{'' if policy.key_limits else 'out'} key limits"
            f" and{'' if policy.max_turns_per_session else ' no'} session limit"
        )
        if self.paused:
            event("admitted while some scope is paused")

    def check_index(self, after: str) -> None:
        differences = index_differences(self.path)
        assert not differences, f"after {after}: the admission index disagrees with the queue: {differences}"

    def _owner(self, choice: str) -> str:
        return OTHER_OWNER if choice == "other" else self.plane.owner_identity.owner_instance_id

    # --- lease lifecycle -------------------------------------------------------------------------

    @precondition(lambda self: self.leases)
    @rule(
        data=st.data(),
        advance=st.integers(0, 400),
        operation=st.sampled_from(
            (
                "mark_starting",
                "mark_dispatch_intent",
                "mark_active",
                "mark_dispatch_ambiguous",
                "mark_execution_recovery_required",
                "release_exited_recovery_seat",
            )
        ),
    )
    def transition(self, data: st.DataObject, advance: int, operation: str) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        now = self.tick(advance)
        self.attempt(operation, lambda: getattr(self.plane, operation)(lease, now))

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), completion=completions, advance=st.integers(0, 400))
    def drive_forward(self, data: st.DataObject, completion: LiveTurnCompletion, advance: int) -> None:
        """Take a live lease one step along the happy path (so sequences reach the later phases)."""
        live = {row["lease_id"] for row in _rows_as_dicts(self.path, "leases")}
        lease = data.draw(st.sampled_from([x for x in self.leases if x.lease_id in live] or self.leases))
        now = self.tick(advance)
        phase = next(
            (row["phase"] for row in _rows_as_dicts(self.path, "leases") if row["lease_id"] == lease.lease_id), None
        )
        if phase == "admitted":
            self.attempt("mark_starting", lambda: self.plane.mark_starting(lease, now))
        elif phase == "starting":
            result = self.plane.commit_dispatch_intent(self._record(lease, "valid"))
            event(f"drive_forward dispatch intent: {result.status} {result.reason or ''}")
            assert result.ok
        elif phase == "dispatch_intent":
            payload = self.attempt("read_payload", lambda: self.plane.read_payload(lease.request_id, now))
            assert payload is _REFUSED or payload == self.prompts[lease.request_id]
            self.attempt("mark_active", lambda: self.plane.mark_active(lease, now))
        elif phase == "active":
            self.attempt("complete_live_turn", lambda: self.plane.complete_live_turn(lease, now, completion))

    def _record(self, lease: AdmittedLease, variant: str) -> DispatchRecord:
        owner = lease.owner_instance_id
        if variant == "wrong_owner":
            owner = next(o for o in self.connectors if o != lease.owner_instance_id)
        return DispatchRecord(
            request_id=next(r for r in REQUEST_IDS if r != lease.request_id)
            if variant == "wrong_request"
            else lease.request_id,
            lease_id=lease.lease_id,
            generation=lease.generation + (1 if variant == "wrong_generation" else 0),
            owner_instance_id=owner,
            connector=self.connectors[owner],
            child=self.other_child if variant == "other_child" else self.child,
            prompt_channel="stdin",
        )

    @precondition(lambda self: self.leases)
    @rule(
        data=st.data(),
        variant=st.sampled_from(("valid", "valid", "other_child", "wrong_generation", "wrong_request", "wrong_owner")),
    )
    def commit_dispatch_intent(self, data: st.DataObject, variant: str) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        record = self._record(lease, variant)
        before = table_dump(self.path)
        result = self.plane.commit_dispatch_intent(record)
        event(f"commit_dispatch_intent {variant}: {result.status} {result.reason or ''}")
        assert result.reason != "transaction_fault"
        if not result.ok or result.idempotent:
            assert table_dump(self.path) == before

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), outcome=st.sampled_from(("failed", "cancelled", "completed")), advance=st.integers(0, 400))
    def abandon_before_prompt(self, data: st.DataObject, outcome: str, advance: int) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        now = self.tick(advance)
        self.attempt("abandon_before_prompt", lambda: self.plane.abandon_before_prompt(lease, now, outcome))

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), completion=completions, advance=st.integers(0, 400))
    def complete_live_turn(self, data: st.DataObject, completion: LiveTurnCompletion, advance: int) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        now = self.tick(advance)
        self.attempt("complete_live_turn", lambda: self.plane.complete_live_turn(lease, now, completion))

    @precondition(lambda self: self.leases)
    @rule(
        data=st.data(), fence=st.sampled_from(("right", "wrong_generation", "wrong_owner")), advance=st.integers(0, 400)
    )
    def heartbeat(self, data: st.DataObject, fence: str, advance: int) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        now = self.tick(advance)
        presented = LeaseFence(
            lease.lease_id,
            lease.generation + (1 if fence == "wrong_generation" else 0),
            "not-the-owner" if fence == "wrong_owner" else lease.owner_instance_id,
        )
        result = self.attempt("heartbeat", lambda: self.plane.heartbeat(presented, now))
        if fence != "right":
            assert result is _REFUSED

    # --- time and the reaper ---------------------------------------------------------------------

    @rule(advance=st.one_of(st.integers(0, 3_000), st.just(25_000)))
    def let_time_pass(self, advance: int) -> None:
        self.tick(advance)

    @rule(advance=st.integers(0, 6_000))
    def reap_with_everything_gone(self, advance: int) -> None:
        now = self.tick(advance)
        seats_before = self._seat_leases()
        summary = self.plane.reap_suspects(now, self.readers)
        event(f"reap: released {min(summary.released, 1)}+, settled {min(summary.queued_settled, 1)}+")
        assert summary.inspected == seats_before
        assert summary.released + summary.retained == summary.inspected

    # --- invariants ------------------------------------------------------------------------------

    def _seat_leases(self) -> int:
        return sum(1 for lease in _rows_as_dicts(self.path, "leases") if lease["phase"] in SEAT_PHASES)

    @invariant()
    def every_invariant_holds(self) -> None:
        dump = table_dump(self.path)
        requests = {row[0]: row for row in dump["turn_requests"]}
        states = {request_id: _state_of(row) for request_id, row in requests.items()}

        leases = _rows_as_dicts(self.path, "leases")
        assert sum(1 for lease in leases if lease["phase"] in SEAT_PHASES) <= self.seat_ceiling
        for lease in leases:
            assert states[lease["request_id"]] == lease["phase"]

        for request_id, state in states.items():
            previous = self.states.get(request_id)
            if previous is not None and previous != "queued":
                assert state != "queued", f"{request_id} went back to queued from {previous}"
            if previous in TERMINAL_STATES:
                assert state == previous, f"{request_id} left terminal {previous} for {state}"
        self.states = states

        payload_requests = {_payload_request(row) for row in dump["turn_payloads"]}
        for request_id, state in states.items():
            if state in AFTER_DISPATCH:
                assert request_id not in payload_requests, f"payload of a {state} request survived"

        events = list(read_journal(self.plane))
        assert len(events) >= self.event_count
        self.event_count = len(events)
        journal = replay(events)
        assert journal.requeued == ()
        assert journal.admitted_twice == ()
        assert journal.discontinuities == ()
        assert journal.max_seat_holders <= self.seat_ceiling
        self.check_index("the step")

        with self.plane.engine.connect() as connection:
            check_schema(connection)
            connection.rollback()


@functools.cache
def _columns(path: str, table: str) -> tuple[str, ...]:
    from dbutil import query

    return tuple(row[1] for row in query(path, f'PRAGMA table_info("{table}")'))


def _rows_as_dicts(path: str, table: str) -> list[dict[str, Any]]:
    from dbutil import query

    names = _columns(migrated_template(), table)
    return [dict(zip(names, row, strict=True)) for row in query(path, f'SELECT * FROM "{table}"')]


def _state_of(row: tuple[Any, ...]) -> str:
    return row[_columns(migrated_template(), "turn_requests").index("state")]


def _payload_request(row: tuple[Any, ...]) -> str:
    return row[_columns(migrated_template(), "turn_payloads").index("request_id")]


def _boot_id() -> str:
    from admission_plane.evidence import LIVE_READERS

    return read_boot_id(LIVE_READERS)


AdmissionMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# When an example fails, Hypothesis shrinks it for up to 300 s (its own cap) before reporting it: the suite's
# 300 s per-test timeout would cut that short and hide the failing steps behind a timeout.
TestAdmissionStateMachine = pytest.mark.timeout(480)(AdmissionMachine.TestCase)
TestAdmissionStateMachine.__doc__ = "Random valid and invalid operation sequences never break an admission invariant."
