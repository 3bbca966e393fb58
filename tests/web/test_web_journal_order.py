"""The dashboard's journal follower on PostgreSQL, where lease steps commit side by side."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from admission_plane.migrate import upgrade
from admission_plane.store.advisory import ADVISORY_LOCK_KEY, LEASE_LOCK_KEY
from admission_plane.web._journal import JournalFollower

_EVENT = text(
    "INSERT INTO events (kind, from_state, to_state, occurred_at, correlation_hmac) "
    "VALUES ('request_enqueued', 'absent', 'queued', 1000, :hmac)"
)


@pytest.mark.parametrize("gate", [ADVISORY_LOCK_KEY, LEASE_LOCK_KEY], ids=["admission-gate", "lease-gate"])
def test_an_event_that_commits_after_a_later_one_is_not_skipped(postgres_url: str, gate: int) -> None:
    """A journal event whose sequence number commits after a higher one's is still counted: the follower waits for
    writers in flight (both gates taken exclusively; a writer holds one of them shared, the admission gate or, for
    a lease step that changes no count, only the lease gate), instead of moving its cursor past the gap for good."""
    upgrade(postgres_url)
    engine = create_engine(postgres_url, poolclass=NullPool)
    follower = JournalFollower()
    try:
        with engine.connect() as slow, engine.connect() as fast:
            slow.execute(text(f"SELECT pg_advisory_xact_lock_shared({gate})"))
            slow.execute(_EVENT, {"hmac": "a" * 64})  # the lower sequence number, not committed yet
            with fast.begin():
                fast.execute(text(f"SELECT pg_advisory_xact_lock_shared({gate})"))
                fast.execute(_EVENT, {"hmac": "b" * 64})  # the higher one, committed first
            counted: dict[str, int] = {}

            def read() -> None:
                with engine.connect() as connection, connection.begin():
                    counted.update(follower.advance(connection, 2_000).events_by_kind)

            reader = threading.Thread(target=read)
            reader.start()
            time.sleep(0.5)
            slow.commit()
            reader.join(30)
        assert not reader.is_alive()
        assert counted == {"request_enqueued": 2}
    finally:
        engine.dispose()
