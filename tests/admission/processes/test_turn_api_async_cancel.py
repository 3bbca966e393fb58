"""Cancelling an async turn at every phase: abandoned (seat free) before the prompt write, recovery_required
after it, never requeued, the child's group stopped, and no lease left half-written."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import pytest

from admission_plane import AdmissionPlane, Policy, RequestState
from admission_plane.aio import AsyncAdmissionPlane, AsyncTurn
from admission_plane.service import wall_clock_ms
from admission_plane.store.status import read_status
from admission_plane.turns import Backoff

POLICY = Policy(2, 2, 0, 600_000, 30_000)
#: A child that reads its prompt and then lives on (so "the child is stopped" means something).
LINGER = [sys.executable, "-I", "-S", "-c", "import sys, time; sys.stdin.read(); time.sleep(60)"]
S = RequestState


@pytest.fixture
def plane(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A two-seat plane on the test database (SQLite file or PostgreSQL) with both keys."""
    return make_plane(policy=POLICY)


def options(**overrides: object) -> dict[str, object]:
    """Turn arguments for request r-1 of agent-a on p/m, with a lingering child."""
    values: dict[str, object] = {
        "request_id": "r-1",
        "session_id": "session-1",
        "agent_id": "agent-a",
        "provider": "p",
        "model": "m",
        "prompt": "hello there",
        "backoff": Backoff(initial_ms=5, max_ms=20),
        "command": LINGER,
    }
    values.update(overrides)
    return values


def cancel_at(plane: AdmissionPlane, phase: str, **overrides: object) -> AsyncTurn:
    """Run one turn in a task that is cancelled when the turn reports ``phase``; return the settled turn."""
    seen: list[AsyncTurn] = []

    async def body() -> None:
        task = asyncio.current_task()
        assert task is not None

        def progress(live: AsyncTurn, reported: str) -> None:
            if not seen:
                seen.append(live)
            if reported == phase:
                task.cancel()

        async with AsyncAdmissionPlane(plane) as aplane, aplane.turn(**options(progress=progress, **overrides)):
            await asyncio.sleep(30)  # the block: only a cancellation ends it

    async def main() -> None:
        async with asyncio.timeout(30):
            with pytest.raises(asyncio.CancelledError):
                await asyncio.create_task(body())

    asyncio.run(main())
    return seen[0]


def seats(plane: AdmissionPlane) -> int:
    """Seats held now."""
    return read_status(plane.engine, wall_clock_ms()).seats_in_use


def kinds(plane: AdmissionPlane) -> list[str]:
    """The kinds of every journal event, oldest first."""
    return [event.kind for event in plane.read_sanitized_events(limit=1000)]


def assert_never_requeued(plane: AdmissionPlane) -> None:
    """The request entered the queue once and was admitted at most once."""
    assert kinds(plane).count("request_enqueued") == 1
    assert kinds(plane).count("request_admitted") <= 1


@pytest.mark.parametrize("phase", ["enqueued", "admitted", "starting", "dispatch_intent"])
def test_a_cancellation_before_the_prompt_write_abandons_the_turn_and_frees_the_seat(
    plane: AdmissionPlane, phase: str
) -> None:
    """Cancelled after enqueue, admission, starting or the dispatch intent: the turn ends cancelled, the seat is
    free, the payload gone and the child (if any) stopped."""
    live = cancel_at(plane, phase)
    stored = plane.get_request("r-1")
    assert stored is not None
    assert stored.state is S.CANCELLED
    assert live.state is S.CANCELLED
    assert seats(plane) == 0
    assert plane.list_recoverable_dispatches() == ()
    with pytest.raises(Exception, match="no payload is available"):
        plane.read_payload("r-1", wall_clock_ms())
    if live.child is not None:
        assert live.child.returncode is not None
    assert_never_requeued(plane)


def test_a_cancellation_while_waiting_cancels_the_queued_request(plane: AdmissionPlane) -> None:
    """Cancelled while waiting behind a cooldown: the queued request is cancelled and was never admitted."""
    now = wall_clock_ms()
    plane.set_capacity_cooldown("p", "m", now + 60_000, now)
    live = cancel_at(plane, "queued")
    assert live.state is S.CANCELLED
    assert plane.get_request("r-1").state is S.CANCELLED  # type: ignore[union-attr]
    assert "request_admitted" not in kinds(plane)
    assert_never_requeued(plane)


def test_a_time_out_while_waiting_cancels_the_queued_request(plane: AdmissionPlane) -> None:
    """``asyncio.timeout`` around a turn held back by a cooldown raises TimeoutError and cancels the request."""
    now = wall_clock_ms()
    plane.set_capacity_cooldown("p", "m", now + 60_000, now)

    async def main() -> None:
        async with AsyncAdmissionPlane(plane) as aplane:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2), aplane.turn(**options()):
                    pytest.fail("the cooldown holds the turn back")

    asyncio.run(main())
    assert plane.get_request("r-1").state is S.CANCELLED  # type: ignore[union-attr]


@pytest.mark.parametrize("phase", ["write", "active", "block"])
def test_a_cancellation_after_the_prompt_write_began_makes_the_execution_recovery_required(
    plane: AdmissionPlane, phase: str
) -> None:
    """Cancelled during the prompt write, right after it, or inside the block: recovery_required, the seat stays
    held as visible debt, the child's group is stopped, never requeued."""
    if phase == "write":
        live = _cancel_in_write(plane)
    elif phase == "active":
        # "active" is reported as the last step of entering; the cancel then lands in the block's first await.
        live = cancel_at(plane, "active")
    else:
        live = _cancel_in_block(plane)
    assert live.state is S.RECOVERY_REQUIRED
    assert plane.get_request("r-1").state is S.RECOVERY_REQUIRED  # type: ignore[union-attr]
    (dispatch,) = plane.list_recoverable_dispatches()
    assert dispatch.phase is S.RECOVERY_REQUIRED
    assert seats(plane) == 1
    assert live.child is not None
    assert live.child.returncode is not None
    assert "request_abandoned" not in kinds(plane)
    assert_never_requeued(plane)


def _cancel_in_block(plane: AdmissionPlane) -> AsyncTurn:
    """A turn cancelled from outside while its block awaits the child."""
    seen: list[AsyncTurn] = []

    async def main() -> None:
        inside = asyncio.Event()

        async def body() -> None:
            async with AsyncAdmissionPlane(plane) as aplane, aplane.turn(**options()) as live:
                seen.append(live)
                inside.set()
                assert live.child is not None
                await live.child.wait()

        task = asyncio.create_task(body())
        await inside.wait()
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    return seen[0]


def _cancel_in_write(plane: AdmissionPlane) -> AsyncTurn:
    """A turn whose prompt writer is cancelled (from outside) after it wrote a first part."""
    seen: list[AsyncTurn] = []

    async def main() -> None:
        started = asyncio.Event()

        async def slow_write(live: AsyncTurn, prompt: str) -> None:
            seen.append(live)
            assert live.child is not None
            assert live.child.stdin is not None
            live.child.stdin.write(prompt.encode()[:3])
            started.set()
            await asyncio.sleep(30)

        async def body() -> None:
            async with AsyncAdmissionPlane(plane) as aplane, aplane.turn(**options(write_prompt=slow_write)):
                pytest.fail("the write never ends")

        task = asyncio.create_task(body())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    return seen[0]


def test_a_cancellation_during_completion_lets_the_completion_finish(plane: AdmissionPlane) -> None:
    """Cancelled while the block's completion is being written: it finishes (completed, seat free), then the
    cancellation propagates."""
    seen: list[AsyncTurn] = []

    async def body() -> None:
        task = asyncio.current_task()
        assert task is not None
        async with AsyncAdmissionPlane(plane) as aplane:
            async with aplane.turn(**options()) as live:
                seen.append(live)
                # Delivered at the first suspension after the block: inside the completion.
                asyncio.get_running_loop().call_soon(task.cancel)
            pytest.fail("the cancellation must propagate after the completion")

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.create_task(body())

    asyncio.run(main())
    assert seen[0].state is S.COMPLETED
    assert plane.get_request("r-1").state is S.COMPLETED  # type: ignore[union-attr]
    assert seats(plane) == 0
    assert seen[0].child is not None
    assert seen[0].child.returncode is not None


def test_a_cancelled_wait_for_admission_gives_back_a_lease_it_never_returned(plane: AdmissionPlane) -> None:
    """A caller cancelled while its admission commits never holds a seat it cannot see: the lease is abandoned."""

    async def main() -> None:
        async with AsyncAdmissionPlane(plane) as aplane:
            now = wall_clock_ms()
            await aplane.call(
                plane.enqueue_with_payload,
                request_id="r-1",
                session_id="s",
                agent_id="a",
                fingerprint="f",
                provider="p",
                model="m",
                now=now,
                plaintext="x",
                expires_at=now + 600_000,
            )
            task = asyncio.create_task(aplane.wait_for_admission("r-1", plane.owner_identity.owner_instance_id))
            await asyncio.sleep(0)  # the look is in the executor now
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return
            pytest.fail("the wait returned its lease although cancelled")

    asyncio.run(main())
    stored = plane.get_request("r-1")
    assert stored is not None
    assert stored.state in (S.QUEUED, S.CANCELLED)
    assert seats(plane) == 0
