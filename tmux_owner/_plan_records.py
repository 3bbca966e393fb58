"""The plan's records: the server proof, the plan request, the attempt capability and the plan responses.

Each record parses exactly the seed's JSON shape (``from_json``, ``InvalidRecordError``
otherwise) and renders it back in the seed's key order (``to_json``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Self

import attrs

from ._argv import is_valid_argv
from ._cgroup import CgroupInfo
from ._common import (
    SCHEMA_VERSION,
    InvalidRecordError,
    as_invalid_record,
    has_only_keys,
    is_js_date,
    is_record,
    is_safe_integer,
    is_safe_path_component,
    is_schema_one,
    iso_now,
    non_empty,
    refuse_unless,
    safe_diagnostic,
)
from ._files import ensure_directory, lifecycle_paths, publish_exclusive
from ._generations import OwnerGenerationBaseline

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
