"""The admission conftest's helper functions, importable by test modules.

``from conftest import ...`` is ambiguous here (``tests/conftest.py`` has the same module
name), so the admission conftest is loaded once by path under its own name.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_NAME = "_admission_conftest_helpers"


def _load():  # type: ignore[no-untyped-def]
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    spec = importlib.util.spec_from_file_location(_NAME, Path(__file__).with_name("conftest.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module


_conftest = _load()
CONTRACT_POLICY = _conftest.CONTRACT_POLICY
CONTENT_KEY = _conftest.CONTENT_KEY
ENCRYPTION_KEY = _conftest.ENCRYPTION_KEY
enqueue = _conftest.enqueue
admit = _conftest.admit
activate = _conftest.activate
dispatch_record = _conftest.dispatch_record



def lease_in_phase(plane, phase: str, request_id: str = "r1", now: int = 1_000, *, identity: bool = True,
                   agent_id: str = "agent-a", **record_overrides):  # type: ignore[no-untyped-def]
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


SEAT_PHASES = ("admitted", "starting", "dispatch_intent", "dispatch_ambiguous", "active", "recovery_required")

__all__ = [
    "CONTENT_KEY",
    "CONTRACT_POLICY",
    "ENCRYPTION_KEY",
    "SEAT_PHASES",
    "activate",
    "admit",
    "dispatch_record",
    "enqueue",
    "lease_in_phase",
]
