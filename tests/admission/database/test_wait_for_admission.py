"""wait_for_admission: a connector waits for its own request without jumping the queue."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from planes import ONE_SEAT, Clock

from admission_plane import AdmissionPlane, Budget, InvalidInputError, KeyLimit, Policy, RequestState


def submit(plane: AdmissionPlane, request_id: str, now: int, agent_id: str = "agent-a") -> None:
    plane.enqueue_with_payload(
        request_id=request_id,
        session_id="s",
        agent_id=agent_id,
        fingerprint="f",
        provider="p",
        model="m",
        now=now,
        plaintext="prompt",
        expires_at=now + 10_000_000,
    )


@pytest.fixture
def clocked(make_plane: Callable[..., AdmissionPlane]) -> tuple[AdmissionPlane, Clock]:
    """A one-seat plane whose clock is a test clock."""
    clock = Clock()
    return make_plane(policy=ONE_SEAT, clock=clock), clock


def test_wait_returns_the_lease_as_soon_as_the_request_is_admissible(clocked: tuple[AdmissionPlane, Clock]) -> None:
    """An admissible request is admitted on the first look, without sleeping."""
    plane, clock = clocked
    submit(plane, "r1", clock.now)
    lease = plane.wait_for_admission("r1", "owner-1", sleep=clock.sleep)
    assert lease is not None
    assert lease.request_id == "r1"
    assert clock.sleeps == []


def test_wait_gives_up_at_its_timeout_while_the_seat_stays_taken(clocked: tuple[AdmissionPlane, Clock]) -> None:
    """With the only seat held, the wait returns None at its timeout and the request stays queued."""
    plane, clock = clocked
    submit(plane, "holder", clock.now)
    assert plane.admit_request("holder", clock.now, "owner-0") is not None
    submit(plane, "r1", clock.now)
    assert plane.wait_for_admission("r1", "owner-1", timeout_ms=200, sleep=clock.sleep) is None
    assert plane.get_request("r1").state is RequestState.QUEUED
    assert clock.sleeps, "the wait polled"
    assert max(clock.sleeps) <= 0.016 * 1.5 + 1e-9, "the back-off stays under its cap (with jitter)"


def test_wait_stops_when_the_request_is_no_longer_queued(clocked: tuple[AdmissionPlane, Clock]) -> None:
    """A request cancelled while its connector waits ends the wait with None."""
    plane, clock = clocked
    submit(plane, "holder", clock.now)
    assert plane.admit_request("holder", clock.now, "owner-0") is not None
    submit(plane, "r1", clock.now)

    def sleep_then_cancel(seconds: float) -> None:
        clock.sleep(seconds)
        if plane.get_request("r1").state is RequestState.QUEUED:
            plane.cancel_queued("r1", clock.now)

    assert plane.wait_for_admission("r1", "owner-1", sleep=sleep_then_cancel) is None
    assert plane.get_request("r1").state is RequestState.CANCELLED


def wait_for_the_doorbell(plane: AdmissionPlane, before: object) -> None:
    """Block (real time, at most 5 s) until ``plane``'s doorbell shows a change since ``before``.

    SQLite's doorbell changes with the ring itself; PostgreSQL's counts a notification on a
    listener thread, a moment after the commit, which a test clock cannot wait for.
    """
    doorbell = plane._ctx.doorbell
    deadline = time.monotonic() + 5
    while doorbell is not None and before is not None and doorbell.read() == before:
        assert time.monotonic() < deadline, "the doorbell never rang"
        time.sleep(0.001)


def test_wait_never_admits_ahead_of_an_older_request(make_plane: Callable[..., AdmissionPlane]) -> None:
    """While an older request is eligible and only one seat is free, a younger request's wait only looks again soon;
    it never takes the seat the older one needs, and is admitted once the older one has its seat and another is
    freed."""
    clock = Clock()
    plane = make_plane(policy=Policy(2, 2, 0, 1_800_000, 30_000), clock=clock)
    submit(plane, "holder", clock.now, agent_id="agent-h")
    holder = plane.admit_request("holder", clock.now, "owner-h")
    assert holder is not None  # one of the two seats is taken: one is free
    submit(plane, "older", clock.now + 1, agent_id="agent-a")
    submit(plane, "younger", clock.now + 2, agent_id="agent-b")
    looks: list[Any] = []

    def sleep_and_let_the_older_in(seconds: float) -> None:
        looks.append(seconds)
        clock.sleep(seconds)
        assert plane.get_request("younger").state is RequestState.QUEUED
        if len(looks) == 3:
            before = plane._ctx.doorbell.read() if plane._ctx.doorbell is not None else None
            assert plane.admit_request("older", clock.now, "owner-a") is not None
            plane.abandon_before_prompt(holder, clock.now, "cancelled")
            wait_for_the_doorbell(plane, before)

    lease = plane.wait_for_admission("younger", "owner-b", sleep=sleep_and_let_the_older_in)
    assert lease is not None
    assert lease.request_id == "younger"
    assert len(looks) >= 3
    # Doorbell reads back off to max_delay_ms; without a doorbell it looks every BEHIND_DELAY_S.
    assert all(seconds <= 0.004 * 1.5 + 1e-9 for seconds in looks[:3]), "behind an older request it looks again soon"


def test_a_waiter_is_admitted_beside_older_requests_when_there_are_seats_for_all(
    make_plane: Callable[..., AdmissionPlane],
) -> None:
    """Beyond the seed: with seats and start slots free for every request ahead of it and itself (no keyed limit,
    session limit or budget, one lane, no start interval), a waiter is admitted at once, and the older requests
    still find their seats."""
    clock = Clock()
    plane = make_plane(policy=Policy(3, 3, 0, 1_800_000, 30_000), clock=clock)
    submit(plane, "oldest", clock.now, agent_id="agent-a")
    submit(plane, "older", clock.now + 1, agent_id="agent-b")
    submit(plane, "younger", clock.now + 2, agent_id="agent-c")
    lease = plane.wait_for_admission("younger", "owner-c", sleep=clock.sleep)
    assert lease is not None
    assert lease.request_id == "younger"
    assert clock.sleeps == [], "admitted on its first look"
    assert plane.admit_request("older", clock.now, "owner-b") is None, "the public admit_request stays strict"
    assert [plane.admit_next(clock.now, f"owner-{n}").request_id for n in (1, 2)] == ["oldest", "older"]


@pytest.mark.parametrize(
    ("why", "policy", "held"),
    [
        ("two seats for three", Policy(2, 2, 0, 1_800_000, 30_000), 0),
        ("two start slots for three", Policy(4, 3, 0, 1_800_000, 30_000), 1),
        ("a start interval", Policy(3, 3, 5, 1_800_000, 30_000), 0),
        ("a keyed limit", Policy(3, 3, 0, 1_800_000, 30_000, key_limits=(KeyLimit("p", max_active_turns=3),)), 0),
        ("a session limit", Policy(3, 3, 0, 1_800_000, 30_000, max_turns_per_session=3), 0),
        ("a budget", Policy(3, 3, 0, 1_800_000, 30_000, budgets=(Budget("p", max_requests=10),)), 0),
    ],
)
def test_a_waiter_is_not_admitted_beside_older_requests_otherwise(
    make_plane: Callable[..., AdmissionPlane], why: str, policy: Policy, held: int
) -> None:
    """Without seats and start slots for every request ahead and itself, or under a policy whose limits one
    admission can spend for others (keyed, session, budget) or with a start interval, a younger waiter is not
    admitted while two older requests are eligible."""
    clock = Clock()
    plane = make_plane(policy=policy, clock=clock)
    for index in range(held):  # a lease in its start window holds a start slot
        submit(plane, f"holder-{index}", clock.now, agent_id=f"agent-h{index}")
        assert plane.admit_request(f"holder-{index}", clock.now, "owner-h") is not None
    submit(plane, "oldest", clock.now + 10, agent_id="agent-a")
    submit(plane, "older", clock.now + 11, agent_id="agent-b")
    submit(plane, "younger", clock.now + 12, agent_id="agent-c")
    clock.now += 100
    assert plane.wait_for_admission("younger", "owner-c", timeout_ms=50, sleep=clock.sleep) is None, why
    assert plane.get_request("younger").state is RequestState.QUEUED


def test_wait_refuses_a_bad_timeout_before_any_look(clocked: tuple[AdmissionPlane, Clock]) -> None:
    """A negative timeout is invalid input."""
    plane, clock = clocked
    with pytest.raises(InvalidInputError):
        plane.wait_for_admission("r1", "owner-1", timeout_ms=-1, sleep=clock.sleep)


def spy_on_attempts(monkeypatch: pytest.MonkeyPatch, module: Any) -> tuple[list[bool], list[bool]]:
    """Record the ``direct`` flag of every ``admit_request`` the waiting ``module`` makes: the first attempt of each
    wait (in the first list), and this wait's attempts (the second list: clear it before each wait)."""
    first_attempts: list[bool] = []
    calls_in_this_wait: list[bool] = []
    admit = module.admit_request

    def spy(*args: Any, direct: bool = False, **kwargs: Any) -> Any:
        if not calls_in_this_wait:
            first_attempts.append(direct)
        calls_in_this_wait.append(direct)
        return admit(*args, direct=direct, **kwargs)

    monkeypatch.setattr(module, "admit_request", spy)
    return first_attempts, calls_in_this_wait


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_postgres_wait_writes_at_once_unless_the_last_wait_had_to_wait(
    clocked: tuple[AdmissionPlane, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a wait's first attempt takes the admission gate at once (``direct``), which saves a look when
    the request is admitted at once; after a wait that had to wait, the next wait looks first (the queue is
    likely busy: a direct attempt would hold the gate for nothing), until one is admitted on its first attempt."""
    from admission_plane.service import _waiting

    plane, clock = clocked
    first_attempts, calls_in_this_wait = spy_on_attempts(monkeypatch, _waiting)

    def wait(request_id: str, on_wait: Callable[[int], object] | None = None) -> Any:
        calls_in_this_wait.clear()
        submit(plane, request_id, clock.now)
        lease = plane.wait_for_admission(request_id, "owner-1", sleep=clock.sleep, on_wait=on_wait)
        assert lease is not None
        return lease

    held = wait("admitted-at-once")
    freed: list[int] = []

    def free_the_seat(now: int) -> None:  # the wait found the seat taken: free it, and the wait goes on
        if not freed:
            freed.append(now)
            plane.abandon_before_prompt(held, now, "failed")

    held = wait("had-to-wait", on_wait=free_the_seat)
    assert freed
    plane.abandon_before_prompt(held, clock.now, "failed")
    held = wait("after-a-busy-wait")
    plane.abandon_before_prompt(held, clock.now, "failed")
    wait("after-a-quiet-wait")
    assert first_attempts == [True, True, False, True]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_an_async_postgres_wait_writes_at_once_unless_the_last_wait_had_to_wait(
    clocked: tuple[AdmissionPlane, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The asyncio wait follows the sync wait's rule on PostgreSQL: its first attempt takes the admission gate at
    once (``direct``), unless the plane's last wait had to wait; then it looks first, until a wait is admitted
    on its first attempt. The plane's sync and async waits share the hint."""
    import asyncio

    from admission_plane.aio import AsyncAdmissionPlane, _bell

    plane, clock = clocked
    first_attempts, calls_in_this_wait = spy_on_attempts(monkeypatch, _bell)

    async def scenario(aplane: AsyncAdmissionPlane) -> None:
        async def sleep(seconds: float) -> None:
            clock.sleep(seconds)
            await asyncio.sleep(0)

        async def wait(request_id: str, on_wait: Callable[[int], object] | None = None) -> Any:
            calls_in_this_wait.clear()
            submit(plane, request_id, clock.now)
            lease = await aplane.wait_for_admission(
                request_id, "owner-1", sleep=sleep, on_wait=on_wait, timeout_ms=60_000, fallback_ms=5
            )
            assert lease is not None
            return lease

        held = await wait("admitted-at-once")
        freed: list[int] = []

        def free_the_seat(now: int) -> None:  # the wait found the seat taken: free it, and the wait goes on
            if not freed:
                freed.append(now)
                plane.abandon_before_prompt(held, now, "failed")

        held = await wait("had-to-wait", on_wait=free_the_seat)
        assert freed
        plane.abandon_before_prompt(held, clock.now, "failed")
        held = await wait("after-a-busy-wait")
        plane.abandon_before_prompt(held, clock.now, "failed")
        await wait("after-a-quiet-wait")

    async def main() -> None:
        async with AsyncAdmissionPlane(plane) as aplane:
            await scenario(aplane)

    asyncio.run(main())
    assert first_attempts == [True, True, False, True]
