"""The high-level turn API: one ``with`` block from enqueue to a settled outcome, never a requeue."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from planes import CONTENT_KEY, ENCRYPTION_KEY

from admission_plane import AdmissionPlane, Policy, RequestState
from admission_plane.migrate import upgrade
from admission_plane.service import wall_clock_ms
from admission_plane.store.status import read_status
from admission_plane.turns import Backoff, Turn, TurnNotAdmittedError, run_turn, spawn_child, turn

POLICY = Policy(2, 2, 0, 600_000, 30_000)
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
