"""The plan's records: the plan request, the attempt capability and the plan responses.

Each record parses exactly the seed's JSON shape (``from_json``, ``InvalidRecordError``
otherwise) and renders it back in the seed's key order (``to_json``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Self, get_args

import attrs

from ._argv import argv_tuple, is_valid_argv, validate_argv
from ._cgroup import CgroupInfo
from ._durable import publish_record
from ._errors import InvalidRecordError
from ._files import create_lifecycle, lifecycle_paths
from ._generations import OwnerGenerationBaseline
from ._jscompat import safe_diagnostic
from ._server_proof import ServerState
from ._timestamps import is_js_date, iso_now
from ._validators import (
    SCHEMA_VERSION,
    as_invalid_record,
    field_validator,
    has_only_keys,
    is_record,
    is_schema_one,
    of_type,
    one_of,
    validate_bool,
    validate_non_empty,
    validate_path_component,
)

PlanErrorCode = Literal[
    "scope_unavailable", "server_unsafe", "server_unverifiable", "server_race", "scope_bootstrap_failed"
]
PLAN_ERROR_CODES: frozenset[str] = frozenset(get_args(PlanErrorCode))
PLATFORMS: frozenset[str] = frozenset(
    {"aix", "android", "darwin", "freebsd", "haiku", "linux", "netbsd", "openbsd", "sunos", "win32", "cygwin"}
)


def _record(value: object, keys: Sequence[str], what: str) -> dict[str, Any]:
    if not is_record(value) or not has_only_keys(value, keys):
        raise InvalidRecordError(what)
    return value


@attrs.frozen
class PlanRequest:
    """The protocol's ``plan`` request (the seed's ``isPlanRequest``).

    Beyond the seed: ``session_id`` and ``owner_generation`` must be safe path components.
    """

    platform: str = attrs.field(validator=one_of(PLATFORMS))
    session_id: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    owner_generation: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    cwd: str = attrs.field(validator=of_type(str))
    state_dir: str = attrs.field(validator=validate_non_empty)
    socket_key: str = attrs.field(validator=validate_non_empty)
    tmux_argv: tuple[str, ...] = attrs.field(converter=argv_tuple, validator=validate_argv)
    baseline: OwnerGenerationBaseline = attrs.field(validator=of_type(OwnerGenerationBaseline))

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
        baseline = OwnerGenerationBaseline.from_json(record["baseline"])
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

    token: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    session_name: str = attrs.field(validator=validate_non_empty)
    socket_key: str = attrs.field(validator=validate_non_empty)
    server_absent_before: bool = attrs.field(validator=validate_bool)
    baseline: OwnerGenerationBaseline = attrs.field(validator=of_type(OwnerGenerationBaseline))
    expires_at: str = attrs.field(validator=[validate_non_empty, field_validator(is_js_date)])

    KEYS = ("token", "session_name", "socket_key", "server_absent_before", "baseline", "expires_at")

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept exactly the seed's attempt capability object."""
        record = _record(value, cls.KEYS, cls.__name__)
        if set(record) != set(cls.KEYS):
            raise InvalidRecordError(cls.__name__)
        fields = {key: record[key] for key in cls.KEYS if key != "baseline"}
        baseline = OwnerGenerationBaseline.from_json(record["baseline"])
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

    generation: str = attrs.field(validator=validate_non_empty)
    session_id: str = attrs.field(validator=validate_non_empty)
    attempt: AttemptCapability
    created_at: str = attrs.field(validator=validate_non_empty)

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
    persisted = PersistedAttempt(generation, session_id, attempt, created_at or iso_now())
    file = paths.attempt_file(attempt.token)
    with create_lifecycle(paths) as directory:
        if not publish_record(directory, file.name, persisted.to_json()):
            raise FileExistsError(str(file))
    return persisted


@attrs.frozen
class DirectExecution:
    """Run the planned tmux argv as it is."""

    argv: tuple[str, ...] = attrs.field(converter=argv_tuple)
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

    argv: tuple[str, ...] = attrs.field(converter=argv_tuple)
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

    code: PlanErrorCode = attrs.field(validator=one_of(PLAN_ERROR_CODES))
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
