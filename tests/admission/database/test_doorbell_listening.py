"""On PostgreSQL a waiting connector blocks on the listening doorbell and wakes at the ring itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from dbutil import libpq_url
from planes import CONTENT_KEY, ENCRYPTION_KEY, enqueue

from admission_plane import AdmissionPlane, AdmittedLease, Policy, wall_clock_ms
from admission_plane.migrate import upgrade
from admission_plane.store.doorbell import Chimes


@attrs.frozen
class HeldSeat:
    """Two planes on one seat: ``holder`` holds it (``lease``, request ``held``); ``waiting`` is queued behind it."""

    holder: AdmissionPlane
    waiter: AdmissionPlane
    lease: AdmittedLease


@pytest.fixture
def held_seat(postgres_url: str) -> Iterator[HeldSeat]:
    """The one seat held by one plane, a request queued for it by another (agents a and b, an hour to expire)."""
    upgrade(postgres_url)
    keys: dict[str, Any] = {"encryption_key": ENCRYPTION_KEY, "content_fingerprint_key": CONTENT_KEY}
    holder = AdmissionPlane(postgres_url, policy=Policy(1, 1, 0, 1_800_000, 30_000), **keys)
    waiter = AdmissionPlane(postgres_url, policy=Policy(1, 1, 0, 1_800_000, 30_000), **keys)
    try:
        now = wall_clock_ms()
        enqueue(holder, "held", agent_id="agent-a", now=now, expires_at=now + 3_600_000)
        enqueue(holder, "waiting", agent_id="agent-b", now=now + 1, expires_at=now + 3_600_000)
        lease = holder.admit_next(now + 2, holder.owner_identity.owner_instance_id)
        assert lease is not None
        yield HeldSeat(holder, waiter, lease)
    finally:
        holder.close()
        waiter.close()


def test_a_postgres_waiter_is_admitted_at_the_ring_not_at_its_next_poll(held_seat: HeldSeat) -> None:
    """With 60 s between polls and a 60 s fallback, a waiter is admitted as soon as the seat it waits for is freed."""
    waiter = held_seat.waiter
    assert held_seat.lease.request_id == "held"
    result: dict[str, Any] = {}
    looked = threading.Event()

    def wait() -> None:
        result["lease"] = waiter.wait_for_admission(
            "waiting",
            waiter.owner_identity.owner_instance_id,
            timeout_ms=120_000,
            initial_delay_ms=60_000,
            max_delay_ms=60_000,
            on_wait=lambda _now: looked.set(),
            fallback_ms=60_000,
        )

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    assert looked.wait(30), "the waiter looked once and found the seat taken"
    held_seat.holder.abandon_before_prompt(held_seat.lease, wall_clock_ms(), "cancelled")
    thread.join(30)  # far less than one poll step: only the ring can have woken it
    assert not thread.is_alive()
    assert result["lease"] is not None
    assert result["lease"].request_id == "waiting"


def test_an_idle_postgres_waiter_wakes_for_the_clock_only_every_few_hundredths_of_a_second(
    held_seat: HeldSeat, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First in line for a seat that stays held, with the default 1 ms polling delay and a 1 s wait: between
    rings the waiter blocks on the listening doorbell for up to ``LISTENING_CLOCK_CHECK_S``, not for one
    polling step (it used to wake every millisecond: about a thousand times in this wait)."""
    from admission_plane.service import _waiting
    from admission_plane.store.doorbell import ListeningDoorbell

    waits: list[float] = []
    wait_until = ListeningDoorbell.wait_until

    def counted(self: ListeningDoorbell, wanted: Any, timeout: float) -> Any:
        waits.append(timeout)
        return wait_until(self, wanted, timeout)

    monkeypatch.setattr(ListeningDoorbell, "wait_until", counted)
    waiter = held_seat.waiter
    lease = waiter.wait_for_admission("waiting", waiter.owner_identity.owner_instance_id, timeout_ms=1_000)
    assert lease is None  # the seat stayed held
    assert waits, "the waiter blocked on the listening doorbell"
    assert len(waits) <= 40, f"{len(waits)} wake-ups in a 1 s wait"  # 1 s / 0.05 s, twice over for slack
    assert max(waits) <= _waiting.LISTENING_CLOCK_CHECK_S


def test_an_idle_async_postgres_waiter_reads_the_counters_only_when_they_ring(held_seat: HeldSeat) -> None:
    """The asyncio API on PostgreSQL: a waiter for a seat that stays held for 1 s costs no periodic counter
    reads (the listening thread hands every ring to the loop); on the code before, the plane's reader task
    read them every 5 ms while anyone waited, about 200 times here."""
    import asyncio

    from admission_plane.aio import AsyncAdmissionPlane

    waiter = held_seat.waiter

    async def main() -> tuple[Any, int]:
        async with AsyncAdmissionPlane(waiter) as aplane:
            lease = await aplane.wait_for_admission(
                "waiting", waiter.owner_identity.owner_instance_id, timeout_ms=1_000
            )
            return lease, aplane.bell.reads

    lease, reads = asyncio.run(main())
    assert lease is None  # the seat stayed held
    assert reads <= 10, f"{reads} counter reads in a 1 s wait with nothing ringing"


def test_a_postgres_waiter_sleeps_through_the_rings_it_does_not_wait_for(postgres_url: str) -> None:
    """``ListeningDoorbell.wait_until``: a waiter for a freed seat is not woken by rings of queue departures and
    freed start slots: the listening thread checks its condition at each ring (never the waiter's own thread) and
    wakes it only at the ring of a freed seat, with the counters that ring left. Rings are sent here as a plain
    ``NOTIFY`` of the doorbell's payload, from a connection of their own."""
    import psycopg

    from admission_plane.store.doorbell import CHANNEL, ListeningDoorbell
    from admission_plane.store.engine import create_admission_engine

    upgrade(postgres_url)
    engine = create_admission_engine(postgres_url)
    doorbell = ListeningDoorbell.for_engine(engine)
    dsn = libpq_url(postgres_url)
    try:
        release = doorbell.interest()
        before = doorbell.wait_ready(10)
        assert before is not None, "the doorbell never started listening"
        checked_on: list[str] = []
        woken: dict[str, Any] = {}

        def seat_freed(current: Any) -> bool:
            checked_on.append(threading.current_thread().name)
            return bool(current.since(before).seats)

        def wait() -> None:
            woken["chimes"] = doorbell.wait_until(seat_freed, 30)
            woken["checks"] = len(checked_on)

        waiter = threading.Thread(target=wait, name="waiter")
        waiter.start()
        with psycopg.connect(dsn, autocommit=True) as ringer:
            for payload in ("1,0,0", "0,0,1", "1,0,1"):  # a departure, a start slot, both: not for this waiter
                ringer.execute(f"NOTIFY {CHANNEL}, '{payload}'")
            deadline = time.monotonic() + 10
            while len(checked_on) < 4 and time.monotonic() < deadline:  # its first check, then one per ring
                time.sleep(0.01)
            assert waiter.is_alive(), "woken by a ring it does not wait for"
            ringer.execute(f"NOTIFY {CHANNEL}, '0,1,0'")
            waiter.join(10)
        assert not waiter.is_alive()
        assert woken["chimes"].since(before) == Chimes(2, 1, 2)
        assert checked_on[0] == "waiter"  # the check before it blocked
        assert set(checked_on[1:]) == {"admission-plane-doorbell"}
        assert woken["checks"] == 5
        release()
    finally:
        doorbell.close()
        engine.dispose()
