"""Keys, the usual policies and the lifecycle steps the tests share (``enqueue``, ``admit``, ``activate``...).

Plain helpers that test modules import; the fixtures that open planes live in ``conftest.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from admission_plane import AdmissionPlane, AdmittedLease, DispatchRecord, Policy
from admission_plane.evidence import capture

ENCRYPTION_KEY = bytes([1]) * 32
CONTENT_KEY = bytes([2]) * 32
#: The usual policy of the contract tests: 3 seats, 1 start, no start interval.
CONTRACT_POLICY = Policy(3, 1, 0, 1_800_000, 30_000)
#: One seat, one start, no start interval.
ONE_SEAT = Policy(1, 1, 0, 1_800_000, 30_000)
#: A lowercase UUIDv4, the form of the owner and lease ids a plane draws.
UUID_V4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
SEAT_PHASES = ("admitted", "starting", "dispatch_intent", "dispatch_ambiguous", "active", "recovery_required")
#: The ``make_plane`` fixture: opens a plane on the test database with keyword overrides.
PlaneFactory = Callable[..., AdmissionPlane]


class Clock:
    """A clock the test advances: every sleep moves it forward by the slept time (at least 1 ms)."""

    def __init__(self, now: int = 1_000) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(1, round(seconds * 1000))


def enqueue(plane: AdmissionPlane, request_id: str, agent_id: str = "agent-a", now: int = 1_000, **overrides: Any):
    """Enqueue ``request_id`` for ``agent_id`` at ``now`` with a payload that outlives the queue timeout."""
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


def lease_in_phase(
    plane: AdmissionPlane,
    phase: str,
    request_id: str = "r1",
    now: int = 1_000,
    *,
    identity: bool = True,
    agent_id: str = "agent-a",
    **record_overrides: Any,
) -> AdmittedLease:
    """Enqueue ``request_id`` at ``now`` and drive its lease to ``phase`` (one ms per step).

    ``dispatch_intent`` is reached with a recorded process identity unless ``identity``
    is false (then through the evidence-free ``mark_dispatch_intent``);
    ``recovery_required`` is reached from ``active``.
    """
    enqueue(plane, request_id, agent_id=agent_id, now=now)
    lease = admit(plane, now + 1)
    if phase == "admitted":
        return lease
    plane.mark_starting(lease, now + 2)
    if phase == "starting":
        return lease
    if identity:
        result = plane.commit_dispatch_intent(dispatch_record(plane, lease, **record_overrides))
        assert result.ok, result
    else:
        plane.mark_dispatch_intent(lease, now + 3)
    if phase == "dispatch_intent":
        return lease
    if phase == "dispatch_ambiguous":
        plane.mark_dispatch_ambiguous(lease, now + 4)
        return lease
    plane.mark_active(lease, now + 4)
    if phase == "active":
        return lease
    assert phase == "recovery_required", phase
    plane.mark_execution_recovery_required(lease, now + 5)
    return lease


__all__ = [
    "CONTENT_KEY",
    "CONTRACT_POLICY",
    "ENCRYPTION_KEY",
    "ONE_SEAT",
    "SEAT_PHASES",
    "UUID_V4",
    "Clock",
    "PlaneFactory",
    "activate",
    "admit",
    "dispatch_record",
    "enqueue",
    "lease_in_phase",
]
