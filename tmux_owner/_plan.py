"""Planning a tmux owner launch: the target-server truth table.

A plan says how to start an owner session without inheriting an unsafe cgroup: run the
tmux argv directly (the target server is proved safe, or absent and the caller's own
cgroup is safe), or bootstrap it inside a fresh transient scope (the caller sits in a
service cgroup). The records live in :mod:`._plan_records`; :mod:`._execute` runs a plan.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

from ._argv import owner_scope_unit, scoped_execution_argv, tmux_attempt_session, tmux_control_argv
from ._cgroup import CgroupInfo, classify_cgroup
from ._errors import InvalidRecordError
from ._generations import is_owner_generation_baseline_current
from ._jscompat import dumps
from ._plan_records import (
    AttemptCapability,
    DirectExecution,
    PlanFailure,
    PlanRequest,
    PlanResponse,
    PlanSuccess,
    ScopedExecution,
)
from ._server_proof import TmuxServerProof, is_safe_server_proof
from ._timestamps import current_ms, iso_now
from ._validators import SCHEMA_VERSION

ATTEMPT_LIFETIME_MS = 7_000


class OwnerIsolationProbe(Protocol):
    """What planning needs to observe: the caller's cgroup, the target server, and attempt persistence."""

    def read_caller_cgroup(self) -> str | None:
        """The text of the caller's own ``/proc/self/cgroup`` (``None`` if unreadable)."""
        ...

    def probe_server(self, socket_key: str, control_argv: Sequence[str] | None = None) -> TmuxServerProof:
        """Prove the tmux server behind ``socket_key``, reachable through ``control_argv``."""
        ...

    def record_attempt(self, *, state_dir: str, session_id: str, generation: str, attempt: AttemptCapability) -> None:
        """Persist a scoped attempt capability before it is handed out."""
        ...


def plan_owner_isolation(
    request: PlanRequest | object, probe: OwnerIsolationProbe, *, now_ms: Callable[[], int] = current_ms
) -> PlanResponse:
    """Decide how to start an owner session (the seed's plan truth table).

    ``request`` is a :class:`PlanRequest` or its parsed JSON. Preconditions, in order:
    the request shape, one canonical ``new-session``, and a still-current generation
    baseline. Then the server is probed (with the control argv before ``new-session``);
    the caller's cgroup is read only when the server is absent. A scoped plan records
    its attempt through ``probe.record_attempt`` exactly once.

    Where the seed's sync and async variants differ we follow the sync one: a corrupt
    ``generation.json`` reads as ``owner_generation_stale`` (never raises), and a probe
    failure is ``synchronous_probe_failed``.
    """
    if not isinstance(request, PlanRequest):
        try:
            request = PlanRequest.from_json(request)
        except InvalidRecordError:
            return PlanFailure("scope_unavailable", "invalid_plan_request")
    attempt_session = tmux_attempt_session(request.tmux_argv)
    if attempt_session is None:
        return PlanFailure("scope_unavailable", "attempt_session_missing")
    if not is_owner_generation_baseline_current(request.state_dir, request.session_id, request.baseline):
        return PlanFailure("scope_unavailable", "owner_generation_stale")
    try:
        return _plan_against_server(request, attempt_session, probe, now_ms)
    except Exception:  # noqa: BLE001 - any probe failure is the same verdict: fail closed
        return PlanFailure("scope_unavailable", "synchronous_probe_failed")


def _plan_against_server(
    request: PlanRequest, attempt_session: str, probe: OwnerIsolationProbe, now_ms: Callable[[], int]
) -> PlanResponse:
    server = probe.probe_server(request.socket_key, tmux_control_argv(request.tmux_argv))
    if server.state == "unsafe":
        return PlanFailure("server_unsafe", "target_server_unsafe")
    if server.state == "unverifiable" or (
        server.state == "safe" and not is_safe_server_proof(server, request.platform)
    ):
        return PlanFailure("server_unverifiable", "target_server_unverifiable")
    if server.state == "safe":
        to_proved_server = DirectExecution(
            request.tmux_argv, attempt_session, request.socket_key, False, server.pid, server.start_time
        )
        return PlanSuccess("not_required", to_proved_server, server.cgroup or CgroupInfo("safe"), "safe")
    classification = classify_cgroup(request.platform, probe.read_caller_cgroup())
    if classification.classification == "unverifiable":
        return PlanFailure("server_unverifiable", classification.diagnostic or "caller_cgroup_unverifiable")
    if classification.classification != "unsafe_service":
        to_new_server = DirectExecution(request.tmux_argv, attempt_session, request.socket_key, True)
        return PlanSuccess("not_required", to_new_server, classification, "absent")
    token = str(uuid.uuid4())
    attempt = AttemptCapability(
        token=token,
        session_name=attempt_session,
        socket_key=request.socket_key,
        server_absent_before=True,
        baseline=request.baseline,
        expires_at=iso_now(now_ms() + ATTEMPT_LIFETIME_MS),
    )
    probe.record_attempt(
        state_dir=request.state_dir, session_id=request.session_id, generation=request.owner_generation, attempt=attempt
    )
    expected_scope = owner_scope_unit(token)
    bootstrap = {
        "schema_version": SCHEMA_VERSION,
        "op": "bootstrap",
        "session_id": request.session_id,
        "owner_generation": request.owner_generation,
        "state_dir": request.state_dir,
        "socket_key": request.socket_key,
        "expected_scope": expected_scope,
        "tmux_argv": list(request.tmux_argv),
        "attempt": attempt.to_json(),
    }
    scoped = ScopedExecution(
        argv=scoped_execution_argv(expected_scope),
        stdin_line=dumps(bootstrap),
        expected_scope=expected_scope,
        attempt=attempt,
        attempt_session=attempt_session,
        server_key=request.socket_key,
    )
    return PlanSuccess("unsafe_scope_required", scoped, classification, "absent")
