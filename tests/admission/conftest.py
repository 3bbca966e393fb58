"""Fixtures for the admission plane: real database files (or PostgreSQL), migrated by Alembic."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from admission_plane import AdmissionPlane, AdmittedLease, DispatchRecord, Policy
from admission_plane.evidence import capture

ENCRYPTION_KEY = bytes([1]) * 32
CONTENT_KEY = bytes([2]) * 32
#: The contract suite's usual policy: 3 seats, 1 start, no start interval.
CONTRACT_POLICY = Policy(3, 1, 0, 1_800_000, 30_000)


@pytest.fixture(params=["sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A migrated (Alembic head) database: a real SQLite file, or a fresh PostgreSQL database."""
    from admission_plane.migrate import upgrade

    if request.param == "sqlite":
        url = str(tmp_path / "admission.sqlite")
    else:
        url = request.getfixturevalue("postgres_url")
    upgrade(url)
    return url


@pytest.fixture
def make_plane(database_url: str) -> Iterator[Callable[..., AdmissionPlane]]:
    """Open planes on the test database (keys set, contract policy by default); all closed afterwards."""
    opened: list[AdmissionPlane] = []

    def factory(**options: Any) -> AdmissionPlane:
        options.setdefault("policy", CONTRACT_POLICY)
        options.setdefault("encryption_key", ENCRYPTION_KEY)
        options.setdefault("content_fingerprint_key", CONTENT_KEY)
        plane = AdmissionPlane(options.pop("database", database_url), **options)
        opened.append(plane)
        return plane

    yield factory
    for plane in opened:
        plane.close()


@pytest.fixture
def plane(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A plane with the contract policy and both keys."""
    return make_plane()


def enqueue(plane: AdmissionPlane, request_id: str, agent_id: str = "agent-a", now: int = 1_000, **overrides: Any):
    """``E(id, agent, t)`` of the contract catalogue: enqueue with a payload that outlives the queue timeout."""
    fields: dict[str, Any] = {
        "request_id": request_id,
        "session_id": "session-1",
        "agent_id": agent_id,
        "fingerprint": "fingerprint-1",
        "provider": "antigravity",
        "model": "model-test",
        "now": now,
        "plaintext": f"prompt for {request_id}",
        "expires_at": now + plane.policy.queue_timeout_ms + 1,
    }
    fields.update(overrides)
    return plane.enqueue_with_payload(**fields)


def dispatch_record(plane: AdmissionPlane, lease: AdmittedLease, child_pid: int | None = None, **overrides: Any):
    """A valid dispatch record for ``lease``: the plane's own connector identity and a real child process."""
    fields: dict[str, Any] = {
        "request_id": lease.request_id,
        "lease_id": lease.lease_id,
        "generation": lease.generation,
        "owner_instance_id": plane.owner_identity.owner_instance_id,
        "connector": plane.owner_identity,
        "child": capture(os.getpid() if child_pid is None else child_pid),
        "prompt_channel": "stdin",
    }
    fields.update(overrides)
    return DispatchRecord(**fields)


def admit(plane: AdmissionPlane, now: int) -> AdmittedLease:
    """Admit the next request as this plane's own connector; fails the test if nothing is admitted."""
    lease = plane.admit_next(now, plane.owner_identity.owner_instance_id)
    assert lease is not None, "expected an admission"
    return lease


def activate(plane: AdmissionPlane, lease: AdmittedLease, now: int) -> None:
    """``activate(lease, t)``: starting at t+1, dispatch intent (with process identity) at t+2, active at t+3."""
    plane.mark_starting(lease, now + 1)
    result = plane.commit_dispatch_intent(dispatch_record(plane, lease))
    assert result.ok, result
    plane.mark_active(lease, now + 3)
