"""Executing a plan: spawn its argv exactly once, then re-prove the server before anyone uses the session.

The cleanup rules for a generation that went stale during the spawn, and the race
detection (a different server, or a bootstrap receipt naming another one), live here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs

from ._argv import is_native_session_id
from ._jscompat import MAX_LINE_BYTES, is_safe_integer, loads, utf8_length
from ._plan_records import (
    PLAN_ERROR_CODES,
    DirectExecution,
    PlanErrorCode,
    PlanExecution,
    PlanFailure,
    PlanResponse,
    PlanSuccess,
    ScopedExecution,
)
from ._server_proof import TmuxServerProof, is_safe_server_proof
from ._validators import is_schema_one, non_empty, one_of


@attrs.frozen
class SpawnResult:
    """How a spawned argv ended: its exit code (``None`` if killed) and its stdout."""

    exit_code: int | None
    stdout: str | None = None


@attrs.frozen
class ExecutionSuccess:
    """The planned argv ran and the server behind it is proved (``code`` ``executed``)."""

    execution: PlanExecution
    server: TmuxServerProof
    server_key: str
    server_pid: int
    server_start_time: str
    server_session: str
    native_session_id: str | None = None
    ok: Literal[True] = True

    def to_json(self) -> dict[str, Any]:
        """The seed's execution success object."""
        record: dict[str, Any] = {
            "ok": True,
            "code": "executed",
            "execution": self.execution.to_json(),
            "server": self.server.to_json(),
            "server_key": self.server_key,
            "server_pid": self.server_pid,
            "server_start_time": self.server_start_time,
            "server_session": self.server_session,
        }
        if self.native_session_id is not None:
            record["native_session_id"] = self.native_session_id
        return record


@attrs.frozen
class ExecutionFailure:
    """An execution that did not end in a proved owner session (no ``schema_version``, as in the seed)."""

    code: PlanErrorCode = attrs.field(validator=one_of(PLAN_ERROR_CODES))
    diagnostic: str
    ok: Literal[False] = False

    def to_json(self) -> dict[str, Any]:
        """``{"ok":false,"code":...,"diagnostic":...}``."""
        return {"ok": False, "code": self.code, "diagnostic": self.diagnostic}


ExecutionResult = ExecutionSuccess | ExecutionFailure


@attrs.frozen
class ExecutionDependencies:
    """What executing a plan touches: the spawner, the server probe, and the generation guards.

    ``cleanup_spawned(execution, native_session_id, server)`` removes a session spawned
    for a generation that went stale during the spawn; it is only called when the same
    pre-existing server is re-proved.
    """

    socket_key: str
    spawn: Callable[[Sequence[str], str | None], SpawnResult]
    probe_server: Callable[[str], TmuxServerProof]
    is_current_generation: Callable[[], bool] | None = None
    cleanup_spawned: Callable[[DirectExecution, str, TmuxServerProof], None] | None = None


_STALE = ExecutionFailure("scope_bootstrap_failed", "owner_generation_stale")
_STALE_UNCERTAIN = ExecutionFailure("scope_bootstrap_failed", "owner_generation_stale_cleanup_uncertain")


def execute_plan(plan: PlanResponse, deps: ExecutionDependencies) -> ExecutionResult:
    """Run a plan's argv exactly once and re-prove the server before anyone uses the session.

    A failed plan passes through. A direct plan is refused if the generation is already
    stale; if it goes stale during the spawn, the spawned session is cleaned up only
    when the same pre-existing server is re-proved, else the result says the cleanup is
    uncertain. A changed server identity is a ``server_race``. Any unexpected error is
    ``synchronous_execution_failed``.
    """
    if isinstance(plan, PlanFailure):
        return ExecutionFailure(plan.code, plan.diagnostic)
    try:
        return _execute(plan, deps)
    except Exception:  # noqa: BLE001 - the seed maps every unexpected failure to one diagnostic
        return ExecutionFailure("scope_bootstrap_failed", "synchronous_execution_failed")


def _generation_stale(deps: ExecutionDependencies) -> bool:
    return deps.is_current_generation is not None and not deps.is_current_generation()


def _execute(plan: PlanSuccess, deps: ExecutionDependencies) -> ExecutionResult:
    execution = plan.execution
    direct = isinstance(execution, DirectExecution)
    if direct and _generation_stale(deps):
        return _STALE
    stdin_line = None if isinstance(execution, DirectExecution) else execution.stdin_line
    result = deps.spawn(list(execution.argv), stdin_line)
    if result.exit_code != 0:
        return ExecutionFailure("scope_bootstrap_failed", "planned_spawn_failed")
    stdout = (result.stdout or "").strip()
    receipt: dict[str, Any] | None = None
    if isinstance(execution, ScopedExecution):
        if not is_exact_scoped_bootstrap_success_receipt(result.stdout or ""):
            return ExecutionFailure("scope_bootstrap_failed", "scoped_bootstrap_receipt_invalid")
        receipt = _loads_object(stdout)
        native_session_id: str | None = receipt["native_session_id"]
    else:
        native_session_id = stdout if is_native_session_id(stdout) else None
    stale_after_spawn = direct and _generation_stale(deps)
    probe_key = execution.attempt.socket_key if isinstance(execution, ScopedExecution) else deps.socket_key
    try:
        server = deps.probe_server(probe_key)
    except Exception:
        if stale_after_spawn:
            return _STALE_UNCERTAIN
        raise
    if server.state == "unsafe":
        return _STALE_UNCERTAIN if stale_after_spawn else ExecutionFailure("server_unsafe", "target_server_unsafe")
    reproof_platform = "darwin" if plan.classification.classification == "not_applicable" else "linux"
    if not is_safe_server_proof(server, reproof_platform):
        if stale_after_spawn:
            return _STALE_UNCERTAIN
        return ExecutionFailure("server_unverifiable", "target_server_unverifiable")
    if receipt is not None and (
        receipt["server_pid"] != server.pid
        or receipt["server_start_time"] != server.start_time
        or receipt["session_name"] != execution.attempt_session
    ):
        return ExecutionFailure("server_race", "bootstrap_server_identity_changed")
    if isinstance(execution, DirectExecution):
        same_server = server.pid == execution.server_pid and server.start_time == execution.server_start_time
        if stale_after_spawn:
            return _cleanup_stale_spawn(execution, native_session_id, server, same_server, deps)
        if not execution.server_absent_before and not same_server:
            return ExecutionFailure("server_race", "target_server_identity_changed")
    return ExecutionSuccess(
        execution=execution,
        server=server,
        server_key=execution.server_key,
        server_pid=int(server.pid or 0),
        server_start_time=str(server.start_time),
        server_session=execution.attempt_session,
        native_session_id=native_session_id,
    )


def _cleanup_stale_spawn(
    execution: DirectExecution,
    native_session_id: str | None,
    server: TmuxServerProof,
    same_server: bool,
    deps: ExecutionDependencies,
) -> ExecutionFailure:
    # A server that did not exist before may have been created by this very spawn, and a
    # different server is not ours to touch: only the proved original server is cleaned.
    if execution.server_absent_before or not same_server or native_session_id is None or deps.cleanup_spawned is None:
        return _STALE_UNCERTAIN
    try:
        deps.cleanup_spawned(execution, native_session_id, server)
    except Exception:  # noqa: BLE001 - a failed cleanup is reported, not raised
        return _STALE_UNCERTAIN
    return _STALE


def _loads_object(text: str) -> dict[str, Any]:
    value = loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


RECEIPT_KEYS = (
    "schema_version", "ok", "code", "native_session_id", "server_pid", "server_start_time", "session_name",
)  # fmt: skip


def is_exact_scoped_bootstrap_success_receipt(stdout: str) -> bool:
    """Whether ``stdout`` is exactly one successful bootstrap receipt line (7 keys, proved server)."""
    given: object = stdout  # callers outside the type checker may pass anything
    if not isinstance(given, str) or utf8_length(given) > MAX_LINE_BYTES:
        return False
    line = stdout[:-1] if stdout.endswith("\n") else stdout
    if not line or "\n" in line or "\r" in line:
        return False
    try:
        receipt = loads(line)
    except ValueError:
        return False
    return (
        isinstance(receipt, dict)
        and len(receipt) == len(RECEIPT_KEYS)
        and is_schema_one(receipt.get("schema_version"))
        and receipt.get("ok") is True
        and receipt.get("code") == "bootstrapped"
        and is_native_session_id(receipt.get("native_session_id"))
        and is_safe_integer(receipt.get("server_pid"))
        and receipt["server_pid"] > 0
        and non_empty(receipt.get("server_start_time"))
        and non_empty(receipt.get("session_name"))
    )
