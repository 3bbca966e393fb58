"""Planning a tmux owner launch: the target-server truth table, the plan records, and execution.

A plan says how to start an owner session without inheriting an unsafe cgroup: run the
tmux argv directly (the target server is proved safe, or absent and the caller's own
cgroup is safe), or bootstrap it inside a fresh transient scope (the caller sits in a
service cgroup). Executing a plan re-proves the server after the spawn.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, Self

import attrs

from ._cgroup import CgroupInfo, classify_cgroup
from ._common import (
    MAX_DIAGNOSTIC_CHARS,
    MAX_LINE_BYTES,
    SCHEMA_VERSION,
    InvalidRecordError,
    as_invalid_record,
    current_ms,
    dumps,
    has_only_keys,
    is_js_date,
    is_record,
    is_safe_integer,
    is_safe_path_component,
    is_schema_one,
    iso_now,
    js_trim,
    loads,
    non_empty,
    refuse_unless,
    safe_diagnostic,
)
from ._files import ensure_directory, lifecycle_paths, publish_exclusive
from ._generations import OwnerGenerationBaseline, is_owner_generation_baseline_current
from ._procstat import read_linux_proc_start_time

ServerState = Literal["absent", "safe", "unsafe", "unverifiable"]
PlanErrorCode = Literal[
    "scope_unavailable", "server_unsafe", "server_unverifiable", "server_race", "scope_bootstrap_failed"
]
SERVER_STATES: frozenset[str] = frozenset({"absent", "safe", "unsafe", "unverifiable"})
PLAN_ERROR_CODES: frozenset[str] = frozenset(
    {"scope_unavailable", "server_unsafe", "server_unverifiable", "server_race", "scope_bootstrap_failed"}
)
PLATFORMS: frozenset[str] = frozenset(
    {"aix", "android", "darwin", "freebsd", "haiku", "linux", "netbsd", "openbsd", "sunos", "win32", "cygwin"}
)
ATTEMPT_LIFETIME_MS = 7_000
CLI_FLAG = "--internal-tmux-owner-isolation"
_NATIVE_SESSION_ID = re.compile(r"\$[0-9]+")


def is_native_session_id(value: object) -> bool:
    """A tmux native session id ``$<digits>``."""
    return isinstance(value, str) and _NATIVE_SESSION_ID.fullmatch(value) is not None


def bootstrap_argv() -> list[str]:
    """The argv that enters this package's JSON-line protocol in a fresh interpreter (the flag is last)."""
    return [sys.executable, "-m", "tmux_owner", CLI_FLAG]


def scoped_execution_argv(expected_scope: str) -> list[str]:
    """``systemd-run --user --scope`` around the bootstrap argv; no shell, no stdin in argv."""
    return ["systemd-run", "--user", "--scope", "--quiet", "--unit", expected_scope, *bootstrap_argv()]


# --- tmux argv grammar -------------------------------------------------------------------


def canonical_new_session(tmux_argv: Sequence[str]) -> tuple[int, str] | None:
    """Exactly one ``new-session`` (not at index 0) with exactly one explicit ``-s``/``--session-name``.

    Returns the index of ``new-session`` and the session name.
    """
    commands = [index for index, arg in enumerate(tmux_argv) if arg == "new-session"]
    if len(commands) != 1 or commands[0] < 1:
        return None
    session: str | None = None
    index = commands[0] + 1
    while index < len(tmux_argv):
        if tmux_argv[index] in ("-s", "--session-name"):
            value = tmux_argv[index + 1] if index + 1 < len(tmux_argv) else None
            if not non_empty(value) or session is not None:
                return None
            session = value
            index += 1
        index += 1
    return (commands[0], session) if session else None


def tmux_attempt_session(tmux_argv: Sequence[str]) -> str | None:
    """The session name the argv creates, if the argv is one canonical ``new-session``."""
    command = canonical_new_session(tmux_argv)
    return None if command is None else command[1]


def tmux_control_argv(tmux_argv: Sequence[str]) -> list[str]:
    """The argv before ``new-session`` (``["tmux", "-L", "x"]``): how to reach the same server."""
    command = canonical_new_session(tmux_argv)
    return list(tmux_argv[: command[0]]) if command else []


def is_valid_argv(argv: object) -> bool:
    """A non-empty list of strings without NUL whose first element is non-empty."""
    return (
        isinstance(argv, list)
        and len(argv) > 0
        and all(isinstance(arg, str) and "\0" not in arg for arg in argv)
        and len(argv[0]) > 0
    )


# --- records ----------------------------------------------------------------------------


_non_empty = refuse_unless(non_empty)
_path_component = refuse_unless(is_safe_path_component)
_argv = refuse_unless(lambda value: is_valid_argv(list(value)))
_is_bool = refuse_unless(lambda value: isinstance(value, bool))


def _record(value: object, keys: Sequence[str], what: str) -> dict[str, Any]:
    if not is_record(value) or not has_only_keys(value, keys):  # type: ignore[arg-type]
        raise InvalidRecordError(what)
    assert isinstance(value, dict)
    return value


@attrs.frozen
class TmuxServerProof:
    """What a probe proved about the tmux server behind a socket.

    ``pid`` is kept as given so :func:`is_safe_server_proof` can judge it; ``pid_proven``
    ``False`` marks a placeholder pid from a platform that cannot prove one.
    """

    state: ServerState = attrs.field(validator=attrs.validators.in_(SERVER_STATES))
    pid: int | None = None
    start_time: str | None = None
    cgroup: CgroupInfo | None = None
    session_names: tuple[str, ...] | None = None
    pid_proven: bool | None = None

    def to_json(self) -> dict[str, Any]:
        """The seed's probe object (camelCase keys), omitting what is unknown."""
        record: dict[str, Any] = {"state": self.state}
        if self.pid is not None:
            record["pid"] = self.pid
        if self.start_time is not None:
            record["startTime"] = self.start_time
        if self.cgroup is not None:
            record["cgroup"] = self.cgroup.to_json()
        if self.session_names is not None:
            record["sessionNames"] = list(self.session_names)
        if self.pid_proven is not None:
            record["pidProven"] = self.pid_proven
        return record


def is_safe_server_proof(server: TmuxServerProof, platform: str = "linux") -> bool:
    """Structurally safe: state ``safe``, a positive safe-integer pid, a start time, and a safe cgroup.

    Off Linux a ``not_applicable`` cgroup also counts.
    """
    classification = None if server.cgroup is None else server.cgroup.classification
    return (
        server.state == "safe"
        and is_safe_integer(server.pid)
        and server.pid is not None
        and server.pid > 0
        and non_empty(server.start_time)
        and (classification == "safe" or (platform != "linux" and classification == "not_applicable"))
    )


def same_server_identity(left: TmuxServerProof, right: TmuxServerProof) -> bool:
    """Whether two probes saw the same server: pid, start time and cgroup classification/scope/diagnostic."""
    return (
        left.pid == right.pid
        and left.start_time == right.start_time
        and _cgroup_fields(left.cgroup) == _cgroup_fields(right.cgroup)
    )


def _cgroup_fields(cgroup: CgroupInfo | None) -> tuple[str | None, str | None, str | None]:
    if cgroup is None:
        return (None, None, None)
    return (cgroup.classification, cgroup.scope, cgroup.diagnostic)


def _baseline(value: object) -> OwnerGenerationBaseline:
    return OwnerGenerationBaseline.from_json(value)


@attrs.frozen
class PlanRequest:
    """The protocol's ``plan`` request (the seed's ``isPlanRequest``).

    Beyond the seed: ``session_id`` and ``owner_generation`` must be safe path components.
    """

    platform: str = attrs.field(validator=attrs.validators.in_(PLATFORMS))
    session_id: str = attrs.field(validator=[_non_empty, _path_component])
    owner_generation: str = attrs.field(validator=[_non_empty, _path_component])
    cwd: str = attrs.field(validator=attrs.validators.instance_of(str))
    state_dir: str = attrs.field(validator=_non_empty)
    socket_key: str = attrs.field(validator=_non_empty)
    tmux_argv: tuple[str, ...] = attrs.field(converter=tuple, validator=_argv)
    baseline: OwnerGenerationBaseline = attrs.field(validator=attrs.validators.instance_of(OwnerGenerationBaseline))

    KEYS = (
        "schema_version", "op", "platform", "session_id", "owner_generation",
        "cwd", "state_dir", "socket_key", "tmux_argv", "baseline",
    )  # fmt: skip

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept exactly the seed's plan request; ``InvalidRecordError`` otherwise."""
        record = _record(value, cls.KEYS, cls.__name__)
        if (
            set(record) != set(cls.KEYS)
            or not is_schema_one(record["schema_version"])
            or record["op"] != "plan"
            or not is_valid_argv(record["tmux_argv"])
        ):
            raise InvalidRecordError(cls.__name__)
        fields = {key: record[key] for key in cls.KEYS[2:9]}
        baseline = _baseline(record["baseline"])
        with as_invalid_record(cls.__name__):
            return cls(**fields, baseline=baseline)

    def to_json(self) -> dict[str, Any]:
        """The request in the seed's key order."""
        return {
            "schema_version": SCHEMA_VERSION,
            "op": "plan",
            "platform": self.platform,
            "session_id": self.session_id,
            "owner_generation": self.owner_generation,
            "cwd": self.cwd,
            "state_dir": self.state_dir,
            "socket_key": self.socket_key,
            "tmux_argv": list(self.tmux_argv),
            "baseline": self.baseline.to_json(),
        }


@attrs.frozen
class AttemptCapability:
    """A one-shot scoped-bootstrap capability (the seed's ``isAttemptCapability``).

    Beyond the seed: ``token`` becomes a file name, so it must be a safe path component.
    """

    token: str = attrs.field(validator=[_non_empty, _path_component])
    session_name: str = attrs.field(validator=_non_empty)
    socket_key: str = attrs.field(validator=_non_empty)
    server_absent_before: bool = attrs.field(validator=_is_bool)
    baseline: OwnerGenerationBaseline = attrs.field(validator=attrs.validators.instance_of(OwnerGenerationBaseline))
    expires_at: str = attrs.field(validator=_non_empty)

    @expires_at.validator
    def _parseable(self, attribute: attrs.Attribute[Any], value: str) -> None:
        if not is_js_date(value):
            raise InvalidRecordError(attribute.name)

    KEYS = ("token", "session_name", "socket_key", "server_absent_before", "baseline", "expires_at")

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept exactly the seed's attempt capability object."""
        record = _record(value, cls.KEYS, cls.__name__)
        if set(record) != set(cls.KEYS):
            raise InvalidRecordError(cls.__name__)
        fields = {key: record[key] for key in cls.KEYS if key != "baseline"}
        baseline = _baseline(record["baseline"])
        with as_invalid_record(cls.__name__):
            return cls(**fields, baseline=baseline)

    def to_json(self) -> dict[str, Any]:
        """The capability in the seed's key order."""
        return {
            "token": self.token,
            "session_name": self.session_name,
            "socket_key": self.socket_key,
            "server_absent_before": self.server_absent_before,
            "baseline": self.baseline.to_json(),
            "expires_at": self.expires_at,
        }


@attrs.frozen
class PersistedAttempt:
    """``attempt-<token>.json``: the capability as the plan recorded it, bound to its generation.

    Deviation: the seed tolerates extra keys here; we refuse them (our writer never adds any).
    """

    generation: str = attrs.field(validator=_non_empty)
    session_id: str = attrs.field(validator=_non_empty)
    attempt: AttemptCapability
    created_at: str = attrs.field(validator=_non_empty)

    KEYS = ("schema_version", "generation", "session_id", *AttemptCapability.KEYS, "created_at")

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept the persisted attempt: schema 1, the capability fields, and ``created_at``."""
        record = _record(value, cls.KEYS, cls.__name__)
        if set(record) != set(cls.KEYS) or not is_schema_one(record["schema_version"]):
            raise InvalidRecordError(cls.__name__)
        attempt = AttemptCapability.from_json({key: record[key] for key in AttemptCapability.KEYS})
        with as_invalid_record(cls.__name__):
            return cls(
                generation=record["generation"],
                session_id=record["session_id"],
                attempt=attempt,
                created_at=record["created_at"],
            )

    def to_json(self) -> dict[str, Any]:
        """``{schema_version, generation, session_id, ...attempt, created_at}`` as the seed writes it."""
        return {
            "schema_version": SCHEMA_VERSION,
            "generation": self.generation,
            "session_id": self.session_id,
            **self.attempt.to_json(),
            "created_at": self.created_at,
        }


def write_attempt(
    state_dir: str, session_id: str, generation: str, attempt: AttemptCapability, *, created_at: str | None = None
) -> PersistedAttempt:
    """Publish ``attempt-<token>.json`` exclusively (0600, fsynced); ``FileExistsError`` if it exists."""
    paths = lifecycle_paths(state_dir, session_id, generation)
    ensure_directory(paths.root)
    persisted = PersistedAttempt(generation, session_id, attempt, created_at or iso_now())
    file = paths.attempt_file(attempt.token)
    if not publish_exclusive(file, persisted.to_json()):
        raise FileExistsError(str(file))
    return persisted


@attrs.frozen
class DirectExecution:
    """Run the planned tmux argv as it is."""

    argv: tuple[str, ...] = attrs.field(converter=tuple)
    attempt_session: str
    server_key: str
    server_absent_before: bool
    server_pid: int | None = None
    server_start_time: str | None = None
    mode: Literal["direct"] = "direct"

    def to_json(self) -> dict[str, Any]:
        """The seed's direct execution object."""
        record: dict[str, Any] = {
            "mode": "direct",
            "argv": list(self.argv),
            "attempt_session": self.attempt_session,
            "server_key": self.server_key,
            "server_absent_before": self.server_absent_before,
        }
        if self.server_pid is not None:
            record["server_pid"] = self.server_pid
        if self.server_start_time is not None:
            record["server_start_time"] = self.server_start_time
        return record


@attrs.frozen
class ScopedExecution:
    """Run the bootstrap inside a fresh transient scope, feeding it ``stdin_line``."""

    argv: tuple[str, ...] = attrs.field(converter=tuple)
    stdin_line: str
    expected_scope: str
    attempt: AttemptCapability
    attempt_session: str
    server_key: str
    server_absent_before: Literal[True] = True
    mode: Literal["scoped"] = "scoped"

    def to_json(self) -> dict[str, Any]:
        """The seed's scoped execution object."""
        return {
            "mode": "scoped",
            "argv": list(self.argv),
            "stdin_line": self.stdin_line,
            "expected_scope": self.expected_scope,
            "attempt": self.attempt.to_json(),
            "attempt_session": self.attempt_session,
            "server_key": self.server_key,
            "server_absent_before": True,
        }


PlanExecution = DirectExecution | ScopedExecution


@attrs.frozen
class PlanSuccess:
    """``not_required`` (direct) or ``unsafe_scope_required`` (scoped)."""

    code: Literal["not_required", "unsafe_scope_required"]
    execution: PlanExecution
    classification: CgroupInfo
    server_state: ServerState
    ok: Literal[True] = True

    def to_json(self) -> dict[str, Any]:
        """The response in the seed's key order."""
        return {
            "schema_version": SCHEMA_VERSION,
            "ok": True,
            "code": self.code,
            "execution": self.execution.to_json(),
            "classification": self.classification.to_json(),
            "server_state": self.server_state,
        }


@attrs.frozen
class PlanFailure:
    """A refused plan; ``diagnostic`` is sanitised like the seed's ``safeDiagnostic``."""

    code: PlanErrorCode = attrs.field(validator=attrs.validators.in_(PLAN_ERROR_CODES))
    diagnostic: str = attrs.field(converter=safe_diagnostic)
    ok: Literal[False] = False

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept ``{"schema_version":1,"ok":false,"code":...,"diagnostic":...}`` exactly."""
        record = _record(value, ("schema_version", "ok", "code", "diagnostic"), cls.__name__)
        if len(record) != 4 or not is_schema_one(record["schema_version"]) or record["ok"] is not False:
            raise InvalidRecordError(cls.__name__)
        if not isinstance(record["diagnostic"], str):
            raise InvalidRecordError(cls.__name__)
        with as_invalid_record(cls.__name__):
            return cls(code=record["code"], diagnostic=record["diagnostic"])

    def to_json(self) -> dict[str, Any]:
        """The response in the seed's key order."""
        return {"schema_version": SCHEMA_VERSION, "ok": False, "code": self.code, "diagnostic": self.diagnostic}


PlanResponse = PlanSuccess | PlanFailure


# --- planning ---------------------------------------------------------------------------


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
        execution = DirectExecution(
            request.tmux_argv, attempt_session, request.socket_key, False, server.pid, server.start_time
        )
        return PlanSuccess("not_required", execution, server.cgroup or CgroupInfo("safe"), "safe")
    classification = classify_cgroup(request.platform, probe.read_caller_cgroup())
    if classification.classification == "unverifiable":
        return PlanFailure("server_unverifiable", classification.diagnostic or "caller_cgroup_unverifiable")
    if classification.classification != "unsafe_service":
        execution = DirectExecution(request.tmux_argv, attempt_session, request.socket_key, True)
        return PlanSuccess("not_required", execution, classification, "absent")
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
    expected_scope = f"gjc-owner-{token}.scope"
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
    execution = ScopedExecution(
        argv=scoped_execution_argv(expected_scope),
        stdin_line=dumps(bootstrap),
        expected_scope=expected_scope,
        attempt=attempt,
        attempt_session=attempt_session,
        server_key=request.socket_key,
    )
    return PlanSuccess("unsafe_scope_required", execution, classification, "absent")


# --- execution --------------------------------------------------------------------------


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

    code: PlanErrorCode = attrs.field(validator=attrs.validators.in_(PLAN_ERROR_CODES))
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
    if len(stdout.encode("utf-8", "surrogatepass")) > MAX_LINE_BYTES:
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


# --- the real tmux probe ----------------------------------------------------------------

_NO_SERVER = re.compile(r"no server running|failed to connect to server|error connecting to")
_ROW_PID = re.compile(r"[1-9][0-9]*")
TMUX_TIMEOUT_S = 10.0


def read_proc_cgroup(entry: str) -> str | None:
    """The text of ``/proc/<entry>/cgroup`` (``entry`` is ``self`` or a pid), ``None`` if unreadable."""
    try:
        return Path("/proc", entry, "cgroup").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def run_argv(argv: Sequence[str], stdin_line: str | None = None, *, timeout: float = TMUX_TIMEOUT_S) -> SpawnResult:
    """Run ``argv`` without a shell, feed ``stdin_line`` (else ``/dev/null``), and capture stdout."""
    try:
        completed = subprocess.run(
            list(argv),
            input=stdin_line,
            stdin=None if stdin_line is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return SpawnResult(None, None)
    return SpawnResult(completed.returncode, completed.stdout)


def _parse_session_rows(stdout: str) -> tuple[int, tuple[str, ...]] | None:
    lines = stdout.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    pid: int | None = None
    names: list[str] = []
    for raw in lines:
        line = raw[:-1] if raw.endswith("\r") else raw
        columns = line.split("\t")
        if len(columns) != 2 or _ROW_PID.fullmatch(columns[0]) is None or not js_trim(columns[1]):
            return None
        row_pid = int(columns[0])
        if not is_safe_integer(row_pid) or (pid is not None and pid != row_pid):
            return None
        pid = row_pid
        names.append(columns[1])
    return None if pid is None else (pid, tuple(names))


@attrs.define
class TmuxProbe:
    """The real probe: ``<control argv> list-sessions`` for the server, ``/proc`` for its identity.

    ``control_argv`` (e.g. ``["tmux", "-S", "/run/x/sock"]``) is used when a caller gives
    none; ``read_cgroup`` (``"self"`` or a pid -> cgroup text) is the one seam tests inject.
    """

    control_argv: tuple[str, ...] = attrs.field(converter=tuple, default=())
    platform: str = sys.platform
    read_cgroup: Callable[[str], str | None] = read_proc_cgroup
    read_start_time: Callable[[int], str | None] = read_linux_proc_start_time

    def read_caller_cgroup(self) -> str | None:
        """This process's own cgroup text."""
        return self.read_cgroup("self")

    def probe_server(self, socket_key: str, control_argv: Sequence[str] | None = None) -> TmuxServerProof:
        """Prove the server reachable through ``control_argv`` (the seed CLI's ``tmuxServerProof``).

        ``socket_key`` is opaque here: the control argv names the socket.
        """
        del socket_key
        argv = list(self.control_argv if control_argv is None else control_argv)
        if not argv:
            return TmuxServerProof("unverifiable")
        completed = subprocess.run(
            [*argv, "list-sessions", "-F", "#{pid}\t#{session_name}"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TMUX_TIMEOUT_S,
            check=False,
        )
        if completed.returncode != 0:
            diagnostic = completed.stderr.strip().lower()
            absent = 0 < len(diagnostic) <= MAX_DIAGNOSTIC_CHARS and _NO_SERVER.search(diagnostic) is not None
            return TmuxServerProof("absent" if absent else "unverifiable")
        if not completed.stdout.strip():
            return TmuxServerProof("absent")
        rows = _parse_session_rows(completed.stdout)
        if rows is None:
            return TmuxServerProof("unverifiable")
        pid, names = rows
        if self.platform != "linux":
            return TmuxServerProof("safe", pid, "not_applicable", CgroupInfo("not_applicable"), names)
        cgroup = classify_cgroup("linux", self.read_cgroup(str(pid)))
        start_time = self.read_start_time(pid)
        if not start_time:
            return TmuxServerProof("unverifiable", pid, None, cgroup, names)
        state: ServerState = {"safe": "safe", "unsafe_service": "unsafe"}.get(  # type: ignore[assignment]
            cgroup.classification, "unverifiable"
        )
        return TmuxServerProof(state, pid, start_time, cgroup, names)

    def record_attempt(self, *, state_dir: str, session_id: str, generation: str, attempt: AttemptCapability) -> None:
        """Persist the attempt as ``attempt-<token>.json`` (the async seed plan's ``writeAttempt``)."""
        write_attempt(state_dir, session_id, generation, attempt)


def spawn_tmux(argv: Sequence[str], stdin_line: str | None = None) -> SpawnResult:
    """The real spawner for :class:`ExecutionDependencies`: run the planned argv exactly."""
    return run_argv(argv, stdin_line)


def kill_spawned_session(execution: DirectExecution, native_session_id: str, server: TmuxServerProof) -> None:
    """Remove exactly the spawned session ``$N`` on the proved server; raise if tmux refuses."""
    del server
    control = tmux_control_argv(execution.argv)
    if not control or not is_native_session_id(native_session_id):
        raise ValueError("cleanup_target_unproven")
    result = run_argv([*control, "kill-session", "-t", native_session_id])
    if result.exit_code != 0:
        raise RuntimeError("cleanup_failed")
