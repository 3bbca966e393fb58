"""The high-level turn API: one ``with`` block from enqueue to a settled outcome, never a requeue."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from planes import CONTENT_KEY, ENCRYPTION_KEY

from admission_plane import AdmissionPlane, Budget, BudgetWindow, InvalidInputError, Policy, RequestState, Usage
from admission_plane.migrate import upgrade
from admission_plane.service import wall_clock_ms
from admission_plane.store.status import read_status
from admission_plane.turns import Backoff, Turn, TurnNotAdmittedError, run_turn, spawn_child, turn

POLICY = Policy(2, 2, 0, 600_000, 30_000)
#: The two-seat policy with a per-minute budget of p/m (requests and tokens) and a provider-wide token budget.
BUDGETED = Policy(
    2,
    2,
    0,
    600_000,
    30_000,
    budgets=(
        Budget("p", "m", window_ms=60_000, max_requests=10, max_tokens=10_000),
        Budget("p", window_ms=3_600_000, max_tokens=100_000),
    ),
)
ESTIMATE = 1_500
ECHO = [sys.executable, "-I", "-S", "-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"]
FAST = Backoff(initial_ms=5, max_ms=20)


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[AdmissionPlane]:
    """A plane on a freshly migrated SQLite file, with both keys and a two-seat policy."""
    database = tmp_path / "admission.sqlite"
    upgrade(database)
    with AdmissionPlane(
        database, policy=POLICY, encryption_key=ENCRYPTION_KEY, content_fingerprint_key=CONTENT_KEY
    ) as opened:
        yield opened


@pytest.fixture
def budgeted(tmp_path: Path) -> Iterator[AdmissionPlane]:
    """A plane like ``plane`` whose policy has budgets for p/m and for p as a whole."""
    database = tmp_path / "budgeted.sqlite"
    upgrade(database)
    with AdmissionPlane(
        database, policy=BUDGETED, encryption_key=ENCRYPTION_KEY, content_fingerprint_key=CONTENT_KEY
    ) as opened:
        yield opened


def options(request_id: str = "r-1", **overrides: object) -> dict[str, object]:
    """Turn arguments for one request of agent-a on provider/model p/m."""
    values: dict[str, object] = {
        "request_id": request_id,
        "session_id": "session-1",
        "agent_id": "agent-a",
        "provider": "p",
        "model": "m",
        "prompt": "hello there",
        "backoff": FAST,
    }
    values.update(overrides)
    if "spawn" not in values and "command" not in values:
        values["command"] = ECHO
    return values


def kinds(plane: AdmissionPlane) -> list[str]:
    """The kinds of every journal event, oldest first."""
    return [event.kind for event in plane.read_sanitized_events(limit=1000)]


def counted(plane: AdmissionPlane) -> list[tuple[int, int, int]]:
    """``(requests, reserved tokens, used tokens)`` of every budget window now (p/m's, then p's)."""
    return [(w.requests, w.reserved_tokens, w.used_tokens) for w in plane.budget_status()]


def settlements(plane: AdmissionPlane) -> list[str]:
    """The state every ``budget_settled`` event settled a reservation to, oldest first."""
    return [event.to_state for event in plane.read_sanitized_events(limit=1000) if event.kind == "budget_settled"]


def test_turn_success_runs_the_whole_lifecycle_and_completes(plane: AdmissionPlane) -> None:
    """A turn is enqueued, admitted, started, dispatched, gets its prompt on stdin, and completes."""
    phases: list[str] = []
    with turn(plane, **options(progress=lambda _t, phase: phases.append(phase))) as live:
        assert live.child is not None
        assert live.child.stdout is not None
        reply = live.child.stdout.read()
        assert plane.get_request("r-1").state is RequestState.ACTIVE
    assert reply == b"HELLO THERE"
    assert live.state is RequestState.COMPLETED
    assert plane.get_request("r-1").state is RequestState.COMPLETED
    assert phases == ["enqueued", "admitted", "starting", "dispatch_intent", "active", "completed"]
    assert live.waited_ms is not None
    assert read_status(plane.engine, wall_clock_ms()).seats_in_use == 0
    assert kinds(plane) == [
        "request_enqueued",
        "request_admitted",
        "request_starting",
        "request_dispatch_intent",
        "request_active",
        "request_provider_terminal",
        "request_released",
    ]


def test_turn_records_the_dispatch_child_identity_with_the_intent(plane: AdmissionPlane) -> None:
    """While the turn runs, its lease carries the connector's and the spawned child's process identity."""
    with turn(plane, **options()) as live:
        (dispatch,) = plane.list_recoverable_dispatches()
        identity = dispatch.process_identity
        assert identity is not None
        assert identity.child.pid == live.pid
        assert identity.connector == plane.owner_identity
        assert live.child is not None
        live.child.communicate()


def test_exception_before_prompt_write_abandons_the_turn(plane: AdmissionPlane) -> None:
    """A failure after admission but before the prompt write abandons the lease as failed and frees the seat."""

    def broken_spawn() -> int:
        raise OSError("provider binary missing")

    with pytest.raises(OSError, match="provider binary missing"), turn(plane, **options(spawn=broken_spawn)):
        pytest.fail("the block must not run")
    assert plane.get_request("r-1").state is RequestState.FAILED
    assert plane.list_recoverable_dispatches() == ()
    assert kinds(plane)[-1] == "request_abandoned"
    assert kinds(plane).count("request_enqueued") == 1


def test_keyboard_interrupt_before_prompt_write_abandons_as_cancelled(plane: AdmissionPlane) -> None:
    """An interrupt before the prompt write ends the turn cancelled, not failed."""

    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), turn(plane, **options(spawn=interrupted)):
        pass
    assert plane.get_request("r-1").state is RequestState.CANCELLED


def test_exception_inside_the_block_marks_execution_recovery_required(plane: AdmissionPlane) -> None:
    """A failure after the prompt write keeps the seat as recovery_required, deletes the payload, and re-raises."""
    with pytest.raises(RuntimeError, match="connector bug"), turn(plane, **options()) as live:
        raise RuntimeError("connector bug")
    assert live.state is RequestState.RECOVERY_REQUIRED
    assert plane.get_request("r-1").state is RequestState.RECOVERY_REQUIRED
    (dispatch,) = plane.list_recoverable_dispatches()
    assert dispatch.phase is RequestState.RECOVERY_REQUIRED
    with pytest.raises(Exception, match="no payload is available"):
        plane.read_payload("r-1", wall_clock_ms())
    assert live.child is not None
    assert live.child.poll() is not None, "the spawned child is stopped when the turn is left"


def test_exception_while_writing_the_prompt_counts_as_after_the_write(plane: AdmissionPlane) -> None:
    """A prompt writer that fails part-way may have written: the turn is recovery_required, never abandoned."""

    def half_write(live: Turn, prompt: str) -> None:
        raise BrokenPipeError("child closed stdin")

    with pytest.raises(BrokenPipeError), turn(plane, **options(write_prompt=half_write)):
        pass
    assert plane.get_request("r-1").state is RequestState.RECOVERY_REQUIRED
    assert "request_abandoned" not in kinds(plane)


def test_block_can_fail_the_turn_with_provider_capacity(plane: AdmissionPlane) -> None:
    """``turn.fail("provider_capacity")`` ends the turn failed and cools its provider/model down."""
    with turn(plane, **options()) as live:
        assert live.child is not None
        live.child.communicate()
        live.fail("provider_capacity", http_status=529)
    assert plane.get_request("r-1").state is RequestState.FAILED
    cooldowns = read_status(plane.engine, wall_clock_ms()).cooldowns
    assert [(provider, model) for provider, model, _ in cooldowns] == [("p", "m")]


def test_block_can_cancel_the_turn(plane: AdmissionPlane) -> None:
    """``turn.cancel()`` ends the turn cancelled."""
    with turn(plane, **options()) as live:
        assert live.child is not None
        live.child.communicate()
        live.cancel()
    assert plane.get_request("r-1").state is RequestState.CANCELLED


def test_waiting_reports_the_queue_position_and_a_timeout_cancels_the_request(plane: AdmissionPlane) -> None:
    """A turn held back by a cooldown reports its position while queued and is cancelled when waiting times out."""
    now = wall_clock_ms()
    plane.set_capacity_cooldown("p", "m", now + 60_000, now)
    positions: list[int] = []

    def progress(live: Turn, phase: str) -> None:
        if phase == "queued" and live.snapshot is not None:
            positions.append(live.snapshot.position)

    with (
        pytest.raises(TurnNotAdmittedError, match="timed out"),
        turn(plane, **options(progress=progress, wait_timeout_ms=50)),
    ):
        pass
    assert positions
    assert set(positions) == {1}
    assert plane.get_request("r-1").state is RequestState.CANCELLED
    assert "request_admitted" not in kinds(plane)


def test_a_request_that_left_the_queue_is_never_re_enqueued(plane: AdmissionPlane) -> None:
    """Running a turn again with a finished request id fails instead of enqueuing the prompt again."""
    with turn(plane, **options()) as live:
        assert live.child is not None
        live.child.communicate()
    with pytest.raises(Exception, match="request is no longer queued"), turn(plane, **options()):
        pass
    assert kinds(plane).count("request_admitted") == 1


def test_heartbeats_run_in_the_background_while_the_turn_is_active(plane: AdmissionPlane) -> None:
    """The lease's heartbeat advances during the block without the caller doing anything."""
    with turn(plane, **options(heartbeat_interval_ms=10)) as live:
        first = plane.list_recoverable_dispatches()[0].heartbeat_at
        deadline = time.monotonic() + 10
        while plane.list_recoverable_dispatches()[0].heartbeat_at == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert plane.list_recoverable_dispatches()[0].heartbeat_at != first
        assert live.child is not None
        live.child.communicate()
    assert not live.lease_lost


def test_an_adopted_child_gets_the_prompt_from_a_custom_writer(plane: AdmissionPlane) -> None:
    """``spawn`` may return the pid of a process started elsewhere; ``write_prompt`` then delivers the prompt."""
    child = spawn_child(ECHO)

    def write(live: Turn, prompt: str) -> None:
        assert child.stdin is not None
        child.stdin.write(prompt.encode())
        child.stdin.close()
        child.stdin = None

    try:
        with turn(plane, **options(spawn=lambda: child.pid, write_prompt=write)) as live:
            assert live.child is None
            assert live.pid == child.pid
            out, _ = child.communicate()
        assert out == b"HELLO THERE"
        assert plane.get_request("r-1").state is RequestState.COMPLETED
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_run_turn_returns_the_handler_result(plane: AdmissionPlane) -> None:
    """``run_turn`` runs a handler inside the active turn and returns what it returns."""

    def handler(live: Turn) -> bytes:
        assert live.child is not None
        return live.child.communicate()[0]

    assert run_turn(plane, handler, **options()) == b"HELLO THERE"
    assert plane.get_request("r-1").state is RequestState.COMPLETED


def test_turn_needs_exactly_one_way_to_start_the_child(plane: AdmissionPlane) -> None:
    """Giving both ``command`` and ``spawn`` (or neither) is refused before anything is written."""
    with pytest.raises(ValueError, match="exactly one"):
        Turn(plane, **options(spawn=lambda: 1, command=ECHO))
    assert plane.read_sanitized_events() == ()


# --- budgets ------------------------------------------------------------------------------------------


def test_a_turn_reserves_its_estimate_and_settles_to_the_usage_it_records(budgeted: AdmissionPlane) -> None:
    """A turn's ``estimated_tokens`` (and one request) is reserved in every window of its key while it runs;
    ``record_usage`` in the block settles the reservation to the usage (``reconciled``), whatever it estimated."""
    with turn(budgeted, **options(estimated_tokens=ESTIMATE)) as live:
        assert counted(budgeted) == [(1, ESTIMATE, 0), (1, ESTIMATE, 0)]
        window = budgeted.budget_status()[0]
        assert isinstance(window, BudgetWindow)
        assert (window.remaining_requests, window.remaining_tokens) == (9, 10_000 - ESTIMATE)
        assert live.child is not None
        live.child.communicate()
        live.record_usage(input_tokens=300, output_tokens=200)
        assert live.usage == Usage(input_tokens=300, output_tokens=200)
    assert live.state is RequestState.COMPLETED
    assert counted(budgeted) == [(1, 0, 500), (1, 0, 500)]
    assert budgeted.budget_status()[0].remaining_tokens == 10_000 - 500
    assert settlements(budgeted) == ["reconciled"]


def test_usage_recorded_before_a_capacity_failure_still_reconciles(budgeted: AdmissionPlane) -> None:
    """The usage the block records settles the reservation whatever the outcome (here a capacity failure; a later
    ``record_usage`` replaces an earlier one)."""
    with turn(budgeted, **options(estimated_tokens=ESTIMATE)) as live:
        assert live.child is not None
        live.child.communicate()
        live.record_usage(input_tokens=1, output_tokens=1)
        live.record_usage(Usage(input_tokens=40, output_tokens=2))
        live.fail("provider_capacity", retry_after={"retry-after": "20"})
    assert budgeted.get_request("r-1").state is RequestState.FAILED
    assert counted(budgeted) == [(1, 0, 42), (1, 0, 42)]
    assert settlements(budgeted) == ["reconciled"]


def test_a_turn_that_records_no_usage_is_charged_at_its_estimate(budgeted: AdmissionPlane) -> None:
    """Without ``record_usage`` the reservation settles ``charged``: the estimate counts as used."""
    with turn(budgeted, **options(estimated_tokens=ESTIMATE)) as live:
        assert live.child is not None
        live.child.communicate()
    assert live.state is RequestState.COMPLETED
    assert counted(budgeted) == [(1, 0, ESTIMATE), (1, 0, ESTIMATE)]
    assert settlements(budgeted) == ["charged"]


def test_an_exception_before_the_prompt_write_refunds_the_reservation(budgeted: AdmissionPlane) -> None:
    """A turn abandoned before its prompt write (here its spawn fails) is refunded: its request and estimate,
    reserved at admission, leave every window."""
    seen: list[list[tuple[int, int, int]]] = []

    def broken_spawn() -> int:
        seen.append(counted(budgeted))
        raise OSError("provider binary missing")

    with (
        pytest.raises(OSError, match="provider binary missing"),
        turn(budgeted, **options(spawn=broken_spawn, estimated_tokens=ESTIMATE)),
    ):
        pytest.fail("the block must not run")
    assert seen == [[(1, ESTIMATE, 0), (1, ESTIMATE, 0)]], "the estimate was reserved before the spawn"
    assert counted(budgeted) == [(0, 0, 0), (0, 0, 0)]
    assert all(window.next_reset_at is None for window in budgeted.budget_status())
    assert settlements(budgeted) == ["refunded"]


def test_an_exception_after_the_prompt_write_retains_the_reservation(budgeted: AdmissionPlane) -> None:
    """A turn left by an exception after its prompt write is ``recovery_required``: the provider may have charged it,
    so its reservation stands (still counted as reserved, even with usage recorded) while it holds its seat, and is
    ``retained`` when the operator frees that seat."""

    def crash(live: Turn) -> None:
        live.record_usage(input_tokens=5)
        raise RuntimeError("connector bug")

    with (
        pytest.raises(RuntimeError, match="connector bug"),
        turn(budgeted, **options(estimated_tokens=ESTIMATE)) as live,
    ):
        crash(live)
    assert budgeted.get_request("r-1").state is RequestState.RECOVERY_REQUIRED
    assert counted(budgeted) == [(1, ESTIMATE, 0), (1, ESTIMATE, 0)]
    assert settlements(budgeted) == []
    (dispatch,) = budgeted.list_recoverable_dispatches()
    budgeted.release_lease(dispatch.fence.lease_id, wall_clock_ms())
    assert budgeted.get_request("r-1").state is RequestState.RECOVERY_REQUIRED
    assert counted(budgeted) == [(1, ESTIMATE, 0), (1, ESTIMATE, 0)]
    assert settlements(budgeted) == ["retained"]


@pytest.mark.parametrize(
    "bad",
    [
        {"input_tokens": -1},
        {"output_tokens": 2**41},
        {"input_tokens": 1.5},
        {"output_tokens": True},
        {"input_tokens": "10"},
        {"usage": Usage(), "input_tokens": 1},
        {"usage": 500},
    ],
    ids=["negative", "huge", "float", "bool", "text", "both", "not-a-usage"],
)
def test_record_usage_refuses_bad_values_in_the_block(budgeted: AdmissionPlane, bad: dict[str, object]) -> None:
    """A bad count (or a Usage with counts, or something else) raises InvalidInputError at the call, in the block;
    nothing is recorded, so the turn, once completed, is charged at its estimate."""
    with turn(budgeted, **options(estimated_tokens=ESTIMATE)) as live:
        with pytest.raises(InvalidInputError):
            live.record_usage(**bad)  # type: ignore[arg-type]
        assert live.usage is None
        assert live.child is not None
        live.child.communicate()
    assert live.state is RequestState.COMPLETED
    assert settlements(budgeted) == ["charged"]
    assert counted(budgeted) == [(1, 0, ESTIMATE), (1, 0, ESTIMATE)]


def test_spawned_children_lead_their_own_process_group(plane: AdmissionPlane) -> None:
    """``spawn_child`` starts the dispatch child in a new session, so the reaper can inspect its group."""
    child = spawn_child([sys.executable, "-c", "import time; time.sleep(5)"], stdout=subprocess.DEVNULL)
    try:
        import os

        assert os.getpgid(child.pid) == child.pid
        assert os.getsid(child.pid) == child.pid
    finally:
        child.kill()
        child.wait()


def test_a_turn_that_waited_is_started_by_its_admission(plane: AdmissionPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn that waits for a seat has its admission start the lease in the same transaction (one writing unit
    fewer under SQLite's write lock): it reports ``starting`` without calling ``mark_starting``, and the journal
    has its ``request_starting`` right after its ``request_admitted``."""
    now = wall_clock_ms()
    held = []
    for request_id in ("h-1", "h-2"):
        plane.enqueue_with_payload(**holder_fields(request_id, now))
        lease = plane.admit_request(request_id, now, plane.owner_identity.owner_instance_id)
        assert lease is not None
        held.append(lease)
    starts: list[object] = []
    real_start = plane.mark_starting
    monkeypatch.setattr(plane, "mark_starting", lambda *args: (starts.append(args), real_start(*args)))
    phases: list[str] = []

    def progress(_live: Turn, phase: str) -> None:
        phases.append(phase)
        if phase == "queued" and len(held) == 2:  # the turn waits: free one seat
            plane.abandon_before_prompt(held.pop(), wall_clock_ms(), "cancelled")

    with turn(plane, **options(progress=progress)) as live:
        assert live.child is not None
        live.child.communicate()
    assert live.state is RequestState.COMPLETED
    assert "queued" in phases
    assert phases[phases.index("admitted") :] == ["admitted", "starting", "dispatch_intent", "active", "completed"]
    assert starts == [], "the admission started the lease: mark_starting was never called"
    events = plane.read_sanitized_events(limit=1000)
    admitted = [i for i, event in enumerate(events) if event.kind == "request_admitted"][-1]
    assert events[admitted + 1].kind == "request_starting"
    assert events[admitted + 1].correlation_hmac == events[admitted].correlation_hmac


def holder_fields(request_id: str, now: int) -> dict[str, object]:
    """``enqueue_with_payload`` arguments for a request of another agent that only holds a seat."""
    return {
        "request_id": request_id,
        "session_id": f"session-{request_id}",
        "agent_id": f"agent-{request_id}",
        "fingerprint": "fp",
        "provider": "p",
        "model": "m",
        "now": now,
        "plaintext": "held",
        "expires_at": now + 600_000,
    }
