"""The asyncio turn API: the sync turn API's contract on both dialects, and cancellation at every phase."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import pytest

from admission_plane import AdmissionPlane, Budget, InvalidInputError, Policy, RequestState, Usage
from admission_plane.aio import AsyncAdmissionPlane, AsyncAdmissionService, AsyncTurn, spawn_child
from admission_plane.service import wall_clock_ms
from admission_plane.store.status import read_status
from admission_plane.turns import Backoff, TurnNotAdmittedError

T = TypeVar("T")
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
S = RequestState


@pytest.fixture
def plane(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A two-seat plane on the test database (SQLite file or PostgreSQL) with both keys."""
    return make_plane(policy=POLICY)


@pytest.fixture
def budgeted(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A plane like ``plane`` whose policy has budgets for p/m and for p as a whole."""
    return make_plane(policy=BUDGETED)


def run_on(plane: AdmissionPlane, scenario: Callable[[AsyncAdmissionPlane], Awaitable[T]]) -> T:
    """Run ``scenario`` in a fresh event loop with an async plane wrapping ``plane`` (closed afterwards)."""

    async def main() -> T:
        async with AsyncAdmissionPlane(plane) as aplane:
            return await scenario(aplane)

    return asyncio.run(main())


@pytest.fixture
def run(plane: AdmissionPlane) -> Callable[[Callable[[AsyncAdmissionPlane], Awaitable[T]]], T]:
    """Run a scenario in a fresh event loop with an async plane wrapping ``plane`` (closed afterwards)."""

    def runner(scenario: Callable[[AsyncAdmissionPlane], Awaitable[T]]) -> T:
        return run_on(plane, scenario)

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


def counted(plane: AdmissionPlane) -> list[tuple[int, int, int]]:
    """``(requests, reserved tokens, used tokens)`` of every budget window now (p/m's, then p's)."""
    return [(w.requests, w.reserved_tokens, w.used_tokens) for w in plane.budget_status()]


def settlements(plane: AdmissionPlane) -> list[str]:
    """The state every ``budget_settled`` event settled a reservation to, oldest first."""
    return [event.to_state for event in plane.read_sanitized_events(limit=1000) if event.kind == "budget_settled"]


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


def test_an_async_turn_runs_on_the_service_without_the_turn_api(plane: AdmissionPlane) -> None:
    """``AsyncTurn`` is built on ``AsyncAdmissionService`` (the async plane without ``turn``/``run_turn``, as
    the sync ``Turn`` is built on ``AdmissionService``): a turn constructed on one runs its whole lifecycle, and
    an error inside its block settles it as on the plane (``recovery_required`` once the prompt was written)."""

    async def scenario() -> tuple[bytes, AsyncTurn, AsyncTurn, str]:
        async with AsyncAdmissionService(plane) as service:
            assert not hasattr(service, "turn")
            shown = repr(service)
            async with AsyncTurn(service, **options()) as live:
                reply = await communicate(live)
            broken = AsyncTurn(service, **options("r-2"))
            with pytest.raises(RuntimeError, match="boom"):
                async with broken:
                    raise RuntimeError("boom")
            return reply, live, broken, shown

    reply, live, broken, shown = asyncio.run(scenario())
    assert shown.startswith("<AsyncAdmissionService ")
    assert reply == b"HELLO THERE"
    assert live.state is S.COMPLETED
    assert state(plane) is S.COMPLETED
    assert broken.state is S.RECOVERY_REQUIRED
    assert state(plane, "r-2") is S.RECOVERY_REQUIRED
    assert issubclass(AsyncAdmissionPlane, AsyncAdmissionService)


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


# --- budgets ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("decision", ["complete", "fail"])
def test_an_async_turn_reserves_its_estimate_and_settles_to_the_usage_it_records(
    budgeted: AdmissionPlane, decision: str
) -> None:
    """An async turn's ``estimated_tokens`` (and one request) is reserved in every window of its key while it runs;
    ``record_usage`` in the block settles it to the usage (``reconciled``), whether the block completes or fails."""
    inside: list[list[tuple[int, int, int]]] = []

    async def scenario(aplane: AsyncAdmissionPlane) -> AsyncTurn:
        async with aplane.turn(**options(estimated_tokens=ESTIMATE)) as live:
            inside.append(counted(budgeted))
            await communicate(live)
            live.record_usage(input_tokens=300, output_tokens=200)
            assert live.usage == Usage(300, 200)
            if decision == "fail":
                live.fail("provider_capacity", retry_after={"retry-after": "20"})
        return live

    live = run_on(budgeted, scenario)
    assert inside == [[(1, ESTIMATE, 0), (1, ESTIMATE, 0)]]
    assert live.state is (S.COMPLETED if decision == "complete" else S.FAILED)
    assert counted(budgeted) == [(1, 0, 500), (1, 0, 500)]
    assert budgeted.budget_status()[0].remaining_tokens == 10_000 - 500
    assert settlements(budgeted) == ["reconciled"]


def test_an_async_turn_that_records_no_usage_is_charged_at_its_estimate(budgeted: AdmissionPlane) -> None:
    """Without ``record_usage`` the reservation settles ``charged``: the estimate counts as used."""

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        async with aplane.turn(**options(estimated_tokens=ESTIMATE)) as live:
            await communicate(live)

    run_on(budgeted, scenario)
    assert state(budgeted) is S.COMPLETED
    assert counted(budgeted) == [(1, 0, ESTIMATE), (1, 0, ESTIMATE)]
    assert settlements(budgeted) == ["charged"]


def test_an_exception_before_the_async_prompt_write_refunds_the_reservation(budgeted: AdmissionPlane) -> None:
    """An async turn abandoned before its prompt write (its spawn fails) is refunded: its request and estimate,
    reserved at admission, leave every window."""
    seen: list[list[tuple[int, int, int]]] = []

    def broken_spawn() -> int:
        seen.append(counted(budgeted))
        raise OSError("provider binary missing")

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        with pytest.raises(OSError, match="provider binary missing"):
            async with aplane.turn(**options(spawn=broken_spawn, estimated_tokens=ESTIMATE)):
                pytest.fail("the block must not run")

    run_on(budgeted, scenario)
    assert seen == [[(1, ESTIMATE, 0), (1, ESTIMATE, 0)]], "the estimate was reserved before the spawn"
    assert state(budgeted) is S.FAILED
    assert counted(budgeted) == [(0, 0, 0), (0, 0, 0)]
    assert settlements(budgeted) == ["refunded"]


def test_cancelling_an_async_turn_before_the_prompt_write_refunds_the_reservation(budgeted: AdmissionPlane) -> None:
    """A task cancelled while its admitted turn spawns (before the prompt write) ends the turn cancelled (not
    failed) and refunds the reservation it held at that moment."""
    seen: list[list[tuple[int, int, int]]] = []

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        spawning = asyncio.Event()

        async def slow_spawn() -> int:
            seen.append(counted(budgeted))
            spawning.set()
            await asyncio.sleep(0.3)  # a spawn step runs to its end; the cancellation lands right after it
            raise OSError("the spawn failed, but the task was cancelled meanwhile")

        async def one() -> None:
            async with aplane.turn(**options(spawn=slow_spawn, estimated_tokens=ESTIMATE)):
                pytest.fail("the block must not run")

        task = asyncio.create_task(one())
        await asyncio.wait_for(spawning.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run_on(budgeted, scenario)
    assert seen == [[(1, ESTIMATE, 0), (1, ESTIMATE, 0)]]
    assert state(budgeted) is S.CANCELLED
    assert counted(budgeted) == [(0, 0, 0), (0, 0, 0)]
    assert settlements(budgeted) == ["refunded"]


@pytest.mark.parametrize(
    "bad",
    [{"input_tokens": -1}, {"output_tokens": 2**41}, {"input_tokens": 2.0}, {"usage": Usage(), "output_tokens": 3}],
    ids=["negative", "huge", "float", "both"],
)
def test_async_record_usage_refuses_bad_values_in_the_block(budgeted: AdmissionPlane, bad: dict[str, object]) -> None:
    """A bad count raises InvalidInputError at the call, in the async block; nothing is recorded, so the completed
    turn is charged at its estimate."""

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        async with aplane.turn(**options(estimated_tokens=ESTIMATE)) as live:
            with pytest.raises(InvalidInputError):
                live.record_usage(**bad)  # type: ignore[arg-type]
            assert live.usage is None
            await communicate(live)

    run_on(budgeted, scenario)
    assert state(budgeted) is S.COMPLETED
    assert settlements(budgeted) == ["charged"]
    assert counted(budgeted) == [(1, 0, ESTIMATE), (1, 0, ESTIMATE)]


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


def test_an_async_turn_that_waited_is_started_by_its_admission_where_it_can(plane: AdmissionPlane, run: Any) -> None:
    """An async turn that waits for a seat passes ``start=True``: on SQLite its admission starts the lease in the
    same transaction (``request_starting`` right after its ``request_admitted`` in the journal, and
    ``mark_starting`` never called); on PostgreSQL it starts as before. Either way the turn completes."""
    now = wall_clock_ms()
    owner = plane.owner_identity.owner_instance_id
    held = []
    for request_id in ("h-1", "h-2"):
        plane.enqueue_with_payload(
            request_id=request_id, session_id=f"s-{request_id}", agent_id=f"agent-{request_id}", fingerprint="fp",
            provider="p", model="m", now=now, plaintext="held", expires_at=now + 600_000,
        )  # fmt: skip
        lease = plane.admit_request(request_id, now, owner)
        assert lease is not None
        held.append(lease)
    starts: list[object] = []
    real_start = plane.mark_starting
    plane.mark_starting = lambda *args: (starts.append(args), real_start(*args))  # type: ignore[method-assign]

    def progress(_live: AsyncTurn, phase: str) -> None:
        if phase == "queued" and len(held) == 2:  # the turn waits: free one seat
            plane.abandon_before_prompt(held.pop(), wall_clock_ms(), "cancelled")

    async def scenario(aplane: AsyncAdmissionPlane) -> AsyncTurn:
        async with aplane.turn(**options(progress=progress)) as live:
            await communicate(live)
            return live

    try:
        live = run(scenario)
    finally:
        del plane.mark_starting
    assert live.state is S.COMPLETED
    sqlite = plane.engine.dialect.name == "sqlite"
    assert (starts == []) is sqlite
    events = plane.read_sanitized_events(limit=1000)
    admitted = [i for i, event in enumerate(events) if event.kind == "request_admitted"][-1]
    if sqlite:
        assert events[admitted + 1].kind == "request_starting"
        assert events[admitted + 1].correlation_hmac == events[admitted].correlation_hmac
