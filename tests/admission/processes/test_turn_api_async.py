"""The asyncio turn API: the sync turn API's contract on both dialects, and cancellation at every phase."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import pytest

from admission_plane import AdmissionPlane, InvalidInputError, Policy, RequestState
from admission_plane.aio import AsyncAdmissionPlane, AsyncTurn, spawn_child
from admission_plane.service import wall_clock_ms
from admission_plane.store.status import read_status
from admission_plane.turns import Backoff, TurnNotAdmittedError

T = TypeVar("T")
POLICY = Policy(2, 2, 0, 600_000, 30_000)
ECHO = [sys.executable, "-I", "-S", "-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"]
FAST = Backoff(initial_ms=5, max_ms=20)
S = RequestState


@pytest.fixture
def plane(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A two-seat plane on the test database (SQLite file or PostgreSQL) with both keys."""
    return make_plane(policy=POLICY)


@pytest.fixture
def run(plane: AdmissionPlane) -> Callable[[Callable[[AsyncAdmissionPlane], Awaitable[T]]], T]:
    """Run a scenario in a fresh event loop with an async plane wrapping ``plane`` (closed afterwards)."""

    def runner(scenario: Callable[[AsyncAdmissionPlane], Awaitable[T]]) -> T:
        async def main() -> T:
            async with AsyncAdmissionPlane(plane) as aplane:
                return await scenario(aplane)

        return asyncio.run(main())

    return runner


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


def seats(plane: AdmissionPlane) -> int:
    """Seats held now."""
    return read_status(plane.engine, wall_clock_ms()).seats_in_use


def state(plane: AdmissionPlane, request_id: str = "r-1") -> RequestState:
    """The stored state of ``request_id``."""
    stored = plane.get_request(request_id)
    assert stored is not None
    return stored.state


async def communicate(live: AsyncTurn) -> bytes:
    """The child's whole stdout, once it exited."""
    assert live.child is not None
    out, _ = await live.child.communicate()
    return out


def test_async_turn_runs_the_whole_lifecycle_and_completes(plane: AdmissionPlane, run: Any) -> None:
    """An async turn is enqueued, admitted, started, dispatched, gets its prompt on stdin, and completes."""
    phases: list[str] = []

    async def scenario(aplane: AsyncAdmissionPlane) -> tuple[bytes, AsyncTurn]:
        async with aplane.turn(**options(progress=lambda _t, phase: phases.append(phase))) as live:
            assert state(plane) is S.ACTIVE
            return await communicate(live), live

    reply, live = run(scenario)
    assert reply == b"HELLO THERE"
    assert live.state is S.COMPLETED
    assert state(plane) is S.COMPLETED
    assert phases == ["enqueued", "admitted", "starting", "dispatch_intent", "active", "completed"]
    assert live.waited_ms is not None
    assert seats(plane) == 0
    assert kinds(plane) == [
        "request_enqueued",
        "request_admitted",
        "request_starting",
        "request_dispatch_intent",
        "request_active",
        "request_provider_terminal",
        "request_released",
    ]


def test_async_turn_records_the_child_identity_and_its_own_session(plane: AdmissionPlane, run: Any) -> None:
    """The lease carries the connector's and the asyncio child's identity; the child leads its own session."""
    import os

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        lingering = [sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(60)"]
        async with aplane.turn(**options(command=lingering)) as live:
            (dispatch,) = plane.list_recoverable_dispatches()
            identity = dispatch.process_identity
            assert identity is not None
            assert identity.child.pid == live.pid
            assert identity.connector == plane.owner_identity
            assert os.getsid(live.pid) == live.pid
            assert os.getpgid(live.pid) == live.pid
        assert live.child is not None
        assert live.child.returncode is not None, "leaving the block stops the child's group"

    run(scenario)


def test_exception_before_the_prompt_write_abandons_the_async_turn(plane: AdmissionPlane, run: Any) -> None:
    """A failing spawn abandons the lease as failed, frees the seat, and re-raises."""

    def broken_spawn() -> int:
        raise OSError("provider binary missing")

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        with pytest.raises(OSError, match="provider binary missing"):
            async with aplane.turn(**options(spawn=broken_spawn)):
                pytest.fail("the block must not run")

    run(scenario)
    assert state(plane) is S.FAILED
    assert plane.list_recoverable_dispatches() == ()
    assert kinds(plane)[-1] == "request_abandoned"


def test_exception_inside_the_async_block_marks_recovery_required(plane: AdmissionPlane, run: Any) -> None:
    """A failure after the prompt write keeps the seat as recovery_required and stops the child."""

    async def scenario(aplane: AsyncAdmissionPlane) -> AsyncTurn:
        with pytest.raises(RuntimeError, match="connector bug"):
            async with aplane.turn(**options()) as live:
                raise RuntimeError("connector bug")
        return live

    live = run(scenario)
    assert live.state is S.RECOVERY_REQUIRED
    (dispatch,) = plane.list_recoverable_dispatches()
    assert dispatch.phase is S.RECOVERY_REQUIRED
    assert live.child is not None
    assert live.child.returncode is not None, "the spawned child is stopped when the turn is left"


def test_a_failing_async_prompt_writer_counts_as_after_the_write(plane: AdmissionPlane, run: Any) -> None:
    """A prompt writer that fails part-way may have written: recovery_required, never abandoned."""

    async def half_write(live: AsyncTurn, prompt: str) -> None:
        raise BrokenPipeError("child closed stdin")

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        with pytest.raises(BrokenPipeError):
            async with aplane.turn(**options(write_prompt=half_write)):
                pass

    run(scenario)
    assert state(plane) is S.RECOVERY_REQUIRED
    assert "request_abandoned" not in kinds(plane)


@pytest.mark.parametrize("decision", ["fail", "cancel"])
def test_the_async_block_chooses_the_outcome(plane: AdmissionPlane, run: Any, decision: str) -> None:
    """``fail("provider_capacity")`` ends the turn failed with a cooldown; ``cancel()`` ends it cancelled."""

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        async with aplane.turn(**options()) as live:
            await communicate(live)
            if decision == "fail":
                live.fail("provider_capacity", http_status=529)
            else:
                live.cancel()

    run(scenario)
    assert state(plane) is (S.FAILED if decision == "fail" else S.CANCELLED)
    cooldowns = read_status(plane.engine, wall_clock_ms()).cooldowns
    assert [(p, m) for p, m, _ in cooldowns] == ([("p", "m")] if decision == "fail" else [])


def test_async_waiting_reports_the_position_and_a_timeout_cancels(plane: AdmissionPlane, run: Any) -> None:
    """A turn held back by a cooldown reports its position while queued and is cancelled when waiting times out."""
    now = wall_clock_ms()
    plane.set_capacity_cooldown("p", "m", now + 60_000, now)
    positions: list[int] = []

    def progress(live: AsyncTurn, phase: str) -> None:
        if phase == "queued" and live.snapshot is not None:
            positions.append(live.snapshot.position)

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        with pytest.raises(TurnNotAdmittedError, match="timed out"):
            async with aplane.turn(**options(progress=progress, wait_timeout_ms=50)):
                pass

    run(scenario)
    assert positions
    assert set(positions) == {1}
    assert state(plane) is S.CANCELLED
    assert "request_admitted" not in kinds(plane)


def test_a_finished_request_is_never_re_enqueued_by_an_async_turn(plane: AdmissionPlane, run: Any) -> None:
    """Running an async turn again with a finished request id fails instead of enqueuing the prompt again."""

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        async with aplane.turn(**options()) as live:
            await communicate(live)
        with pytest.raises(Exception, match="request is no longer queued"):
            async with aplane.turn(**options()):
                pass

    run(scenario)
    assert kinds(plane).count("request_admitted") == 1


def test_async_heartbeats_run_in_a_task(plane: AdmissionPlane, run: Any) -> None:
    """The lease's heartbeat advances during the block without the caller doing anything."""

    async def scenario(aplane: AsyncAdmissionPlane) -> AsyncTurn:
        async with aplane.turn(**options(heartbeat_interval_ms=10)) as live:
            first = plane.list_recoverable_dispatches()[0].heartbeat_at
            for _ in range(1000):
                if plane.list_recoverable_dispatches()[0].heartbeat_at != first:
                    break
                await asyncio.sleep(0.01)
            assert plane.list_recoverable_dispatches()[0].heartbeat_at != first
            await communicate(live)
        return live

    assert not run(scenario).lease_lost


def test_an_adopted_child_gets_the_prompt_from_an_async_writer(plane: AdmissionPlane, run: Any) -> None:
    """``spawn`` may return a pid started elsewhere; an async ``write_prompt`` then delivers the prompt."""

    async def scenario(aplane: AsyncAdmissionPlane) -> bytes:
        child = await spawn_child(ECHO)

        async def write(live: AsyncTurn, prompt: str) -> None:
            assert child.stdin is not None
            child.stdin.write(prompt.encode())
            child.stdin.close()

        async with aplane.turn(**options(spawn=lambda: child.pid, write_prompt=write)) as live:
            assert live.child is None
            assert live.pid == child.pid
            out, _ = await child.communicate()
        return out

    assert run(scenario) == b"HELLO THERE"
    assert state(plane) is S.COMPLETED


def test_async_run_turn_and_wait_for_admission(plane: AdmissionPlane, run: Any) -> None:
    """``run_turn`` returns the handler's result; ``wait_for_admission`` admits a queued request."""

    async def scenario(aplane: AsyncAdmissionPlane) -> bytes:
        reply = await aplane.run_turn(communicate, **options())
        now = wall_clock_ms()
        await aplane.call(
            plane.enqueue_with_payload,
            request_id="r-2",
            session_id="s",
            agent_id="agent-b",
            fingerprint="f",
            provider="p",
            model="m",
            now=now,
            plaintext="x",
            expires_at=now + 600_000,
        )
        lease = await aplane.wait_for_admission("r-2", plane.owner_identity.owner_instance_id, timeout_ms=10_000)
        assert lease is not None
        assert lease.request_id == "r-2"
        return reply

    assert run(scenario) == b"HELLO THERE"
    assert state(plane) is S.COMPLETED
    assert state(plane, "r-2") is S.ADMITTED


def test_async_turn_refuses_bad_options_before_writing(plane: AdmissionPlane, run: Any) -> None:
    """Both ``command`` and ``spawn`` (or neither) are refused before anything is written, as in the sync API."""

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        with pytest.raises(ValueError, match="exactly one"):
            aplane.turn(**options(spawn=lambda: 1, command=ECHO))

    run(scenario)
    assert plane.read_sanitized_events() == ()


def test_many_async_turns_share_the_seats_without_a_thread_each(plane: AdmissionPlane, run: Any) -> None:
    """Twenty concurrent turns on two seats all complete, never above two seats, using the executor's threads only."""
    peak_threads: list[int] = []

    async def scenario(aplane: AsyncAdmissionPlane) -> list[RequestState | None]:
        async def one(index: int) -> RequestState | None:
            async with aplane.turn(**options(f"r-{index}", agent_id=f"agent-{index % 4}")) as live:
                peak_threads.append(threading.active_count())
                await communicate(live)
            return live.state

        return list(await asyncio.gather(*(one(index) for index in range(20))))

    before = threading.active_count()
    assert run(scenario) == [S.COMPLETED] * 20
    # The executor's 4 workers, asyncio's child watcher and PostgreSQL's doorbell listener at most.
    assert max(peak_threads) <= before + 4 + 3
    assert seats(plane) == 0


def test_async_turns_run_under_anyio(plane: AdmissionPlane) -> None:
    """Under ``anyio.run`` (asyncio backend) a turn completes and a cancel scope's deadline while queued cancels it."""
    now = wall_clock_ms()

    async def main() -> bytes:
        async with AsyncAdmissionPlane(plane) as aplane:
            async with aplane.turn(**options()) as live:
                reply = await communicate(live)
            await aplane.call(plane.set_capacity_cooldown, "p", "m", now + 60_000, now)
            with anyio.move_on_after(0.2) as scope:
                async with aplane.turn(**options("r-2")):
                    pytest.fail("the cooldown holds the turn back")
            assert scope.cancelled_caught
            return reply

    assert anyio.run(main, backend="asyncio") == b"HELLO THERE"
    assert state(plane) is S.COMPLETED
    assert state(plane, "r-2") is S.CANCELLED


@pytest.mark.parametrize(
    "overrides",
    [
        {"provider": " p"},
        {"session_id": "s" * 257},
        {"model": "m\x00"},
        {"command": "echo hi"},
        {"command": [1]},
        {"heartbeat_interval_ms": 2**53},
        {"payload_grace_ms": 0},
    ],
    ids=[
        "padded-provider",
        "long-session",
        "nul-in-model",
        "command-string",
        "command-not-text",
        "huge-heartbeat",
        "no-grace",
    ],
)
def test_an_async_turn_refuses_bad_metadata_command_and_intervals_before_enqueueing(
    plane: AdmissionPlane, overrides: dict[str, object]
) -> None:
    """An async turn checks its metadata, command and intervals as the sync turn does, before writing anything."""
    with pytest.raises(InvalidInputError):
        AsyncTurn(AsyncAdmissionPlane(plane), **options(**overrides))  # type: ignore[arg-type]
    assert kinds(plane) == []
