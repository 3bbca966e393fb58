"""Scoped bootstrap: inside a fresh transient scope, consume the one-shot attempt and spawn tmux.

A scoped plan leaves ``attempt-<token>.json`` behind and starts this bootstrap under
``systemd-run --user --scope --unit gjc-owner-<token>.scope``. The bootstrap proves that
it really runs in that scope, consumes the capability exactly once (rename to
``.consumed`` under the generation lock), spawns the exact tmux argv while the
generation is still the one the plan saw, and answers with a receipt naming the server.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal, Self

import attrs

from ._argv import (
    argv_tuple,
    is_native_session_id,
    is_valid_argv,
    owner_scope_unit,
    tmux_attempt_session,
    tmux_control_argv,
    validate_argv,
)
from ._cgroup import classify_cgroup
from ._dirfd import LifecycleDir
from ._errors import InvalidRecordError, TmuxOwnerError
from ._execute import SpawnResult, is_exact_scoped_bootstrap_success_receipt
from ._files import GENERATION_LOCK_WAIT_MS, LifecyclePaths, lifecycle_paths, open_lifecycle
from ._generations import OwnerGenerationBaseline, capture_in
from ._locks import acquire_lock
from ._plan import ATTEMPT_LIFETIME_MS
from ._plan_records import AttemptCapability, PersistedAttempt, write_attempt
from ._server_proof import TmuxServerProof, is_safe_server_proof
from ._timestamps import current_ms, parse_js_date_ms
from ._tmux import TmuxProbe, read_proc_cgroup, run_argv
from ._validators import (
    SCHEMA_VERSION,
    as_invalid_record,
    has_exact_keys,
    is_record,
    is_schema_one,
    of_type,
    require,
    validate_non_empty,
    validate_path_component,
)

__all__ = [
    "BootstrapDependencies",
    "BootstrapRequest",
    "BootstrapResult",
    "bootstrap_owner_isolation",
    "is_exact_scoped_bootstrap_success_receipt",
    "real_bootstrap_dependencies",
    "write_attempt",
]


def _validate_attempt_bound(instance: BootstrapRequest, attribute: attrs.Attribute[Any], value: Any) -> None:
    require(value.socket_key == instance.socket_key and value.server_absent_before is True, attribute)


@attrs.frozen
class BootstrapRequest:
    """The protocol's ``bootstrap`` request (the seed's ``isBootstrapRequest``).

    The attempt must name the same socket key and a server that was absent before.
    Beyond the seed: ``session_id``, ``owner_generation`` and the token must be safe path components.
    """

    session_id: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    owner_generation: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    state_dir: str = attrs.field(validator=validate_non_empty)
    socket_key: str = attrs.field(validator=validate_non_empty)
    expected_scope: str = attrs.field(validator=validate_non_empty)
    tmux_argv: tuple[str, ...] = attrs.field(converter=argv_tuple, validator=validate_argv)
    attempt: AttemptCapability = attrs.field(validator=[of_type(AttemptCapability), _validate_attempt_bound])

    KEYS = (
        "schema_version", "op", "session_id", "owner_generation", "state_dir",
        "socket_key", "expected_scope", "tmux_argv", "attempt",
    )  # fmt: skip

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept exactly the seed's bootstrap request; ``InvalidRecordError`` otherwise."""
        if not is_record(value) or not has_exact_keys(value, cls.KEYS):
            raise InvalidRecordError(cls.__name__)
        if not is_schema_one(value["schema_version"]) or value["op"] != "bootstrap":
            raise InvalidRecordError(cls.__name__)
        if not is_valid_argv(value["tmux_argv"]):
            raise InvalidRecordError(cls.__name__)
        attempt = AttemptCapability.from_json(value["attempt"])
        fields = {key: value[key] for key in cls.KEYS[2:8]}
        with as_invalid_record(cls.__name__):
            return cls(**fields, attempt=attempt)

    def to_json(self) -> dict[str, Any]:
        """The request in the seed's key order (the scoped plan's ``stdin_line``)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "op": "bootstrap",
            "session_id": self.session_id,
            "owner_generation": self.owner_generation,
            "state_dir": self.state_dir,
            "socket_key": self.socket_key,
            "expected_scope": self.expected_scope,
            "tmux_argv": list(self.tmux_argv),
            "attempt": self.attempt.to_json(),
        }


@attrs.frozen
class BootstrapResult:
    """``bootstrapped`` with the receipt fields, or ``scope_bootstrap_failed`` with a diagnostic."""

    ok: bool
    code: Literal["bootstrapped", "scope_bootstrap_failed"]
    native_session_id: str | None = None
    server_pid: int | None = None
    server_start_time: str | None = None
    session_name: str | None = None
    diagnostic: str | None = None

    @classmethod
    def failed(cls, diagnostic: str) -> Self:
        """A refused or failed bootstrap."""
        return cls(False, "scope_bootstrap_failed", diagnostic=diagnostic)

    def to_json(self) -> dict[str, Any]:
        """The result in the seed's key order; a success is exactly the 7-key receipt."""
        record: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "ok": self.ok, "code": self.code}
        optional = {
            "native_session_id": self.native_session_id,
            "server_pid": self.server_pid,
            "server_start_time": self.server_start_time,
            "session_name": self.session_name,
            "diagnostic": self.diagnostic,
        }
        record.update({key: value for key, value in optional.items() if value is not None})
        return record


@attrs.frozen
class BootstrapDependencies:
    """The bootstrap's view of the world: its own cgroup, the spawner, the server probe, the clock."""

    read_self_cgroup: Callable[[], str | None]
    spawn: Callable[[Sequence[str]], SpawnResult]
    probe_server: Callable[[str, Sequence[str]], TmuxServerProof]
    now_ms: Callable[[], int] = current_ms


def real_bootstrap_dependencies() -> BootstrapDependencies:
    """The dependencies of a real bootstrap process: ``/proc/self/cgroup``, tmux, ``/proc``."""
    probe = TmuxProbe(platform=sys.platform)
    return BootstrapDependencies(
        read_self_cgroup=lambda: read_proc_cgroup("self"),
        spawn=lambda argv: run_argv(argv),
        probe_server=probe.probe_server,
    )


def _matches_persisted(record: dict[str, Any] | None, request: BootstrapRequest) -> bool:
    """The seed's ``validPersistedAttempt``: the file says exactly what the request carries."""
    try:
        persisted = PersistedAttempt.from_json(record)
    except InvalidRecordError:
        return False
    return (
        persisted.generation == request.owner_generation
        and persisted.session_id == request.session_id
        and persisted.attempt == request.attempt
    )


def _baseline_unchanged(directory: LifecycleDir, request: BootstrapRequest) -> bool:
    current: OwnerGenerationBaseline = capture_in(directory, request.session_id)
    return current == request.attempt.baseline


def bootstrap_owner_isolation(request: BootstrapRequest | object, deps: BootstrapDependencies) -> BootstrapResult:
    """Consume the attempt, prove the scope, spawn the exact argv and answer with a receipt.

    Under the generation lock: the persisted attempt must match the request and the
    current baseline, must expire within the next 7 s, and is renamed to ``.consumed``
    (a second bootstrap with it is refused). Then the process must sit in
    ``gjc-owner-<token>.scope``; the argv is spawned under the lock again while the
    baseline still holds; the spawned session's ``$N`` and a structurally safe server
    proof make the receipt. A corrupt ``generation.json`` during the first step raises
    ``baseline_generation_corrupt``, as in the seed; beyond the seed, a symlinked session
    or lifecycle directory raises ``untrusted_root`` and a symlinked lock database
    ``untrusted_lifecycle_file``, before anything is consumed.
    """
    if not isinstance(request, BootstrapRequest):
        try:
            request = BootstrapRequest.from_json(request)
        except InvalidRecordError:
            return BootstrapResult.failed("invalid_bootstrap_request")
    paths = lifecycle_paths(request.state_dir, request.session_id, request.owner_generation)
    directory = open_lifecycle(paths)
    if directory is None:
        # Without a lifecycle directory there is no persisted attempt; nothing is created to say so.
        return BootstrapResult.failed("attempt_capability_invalid")
    with directory:
        refusal = _consume_attempt(request, deps, paths, directory)
        if refusal is not None:
            return refusal
        progress = _Progress()
        try:
            return _spawn_in_proved_scope(request, deps, directory, progress)
        except Exception:  # noqa: BLE001 - after consumption every failure is one of two verdicts
            return BootstrapResult.failed(
                "bootstrap_cleanup_uncertain" if progress.spawned else "bootstrap_execution_failed"
            )


def _consume_attempt(
    request: BootstrapRequest, deps: BootstrapDependencies, paths: LifecyclePaths, directory: LifecycleDir
) -> BootstrapResult | None:
    """Under the generation lock, check the persisted attempt and rename it ``.consumed``; a refusal, or ``None``."""
    lock = acquire_lock(directory, GENERATION_LOCK_WAIT_MS)
    if lock is None:
        return BootstrapResult.failed("generation_lock_contended")
    with lock:
        attempt_file = paths.attempt_file(request.attempt.token).name
        recorded = directory.read_json(attempt_file)
        baseline_matches = _baseline_unchanged(directory, request)
        if (
            not baseline_matches
            or not _matches_persisted(recorded, request)
            or tmux_attempt_session(request.tmux_argv) != request.attempt.session_name
            or request.expected_scope != owner_scope_unit(request.attempt.token)
        ):
            return BootstrapResult.failed("attempt_capability_invalid")
        expires_at = parse_js_date_ms(request.attempt.expires_at)
        now = deps.now_ms()
        if expires_at is None or expires_at <= now or expires_at > now + ATTEMPT_LIFETIME_MS:
            return BootstrapResult.failed("attempt_capability_expired")
        try:
            directory.rename(attempt_file, f"{attempt_file}.consumed")
        except (OSError, TmuxOwnerError):
            return BootstrapResult.failed("attempt_capability_replayed")
    return None


@attrs.define
class _Progress:
    spawned: bool = False


def _spawn_in_proved_scope(
    request: BootstrapRequest, deps: BootstrapDependencies, directory: LifecycleDir, progress: _Progress
) -> BootstrapResult:
    control_argv = tmux_control_argv(request.tmux_argv)
    if not control_argv:
        return BootstrapResult.failed("tmux_control_argv_invalid")
    cgroup = classify_cgroup("linux", deps.read_self_cgroup())
    if cgroup.classification != "safe" or request.expected_scope not in (cgroup.scope or "").split("/"):
        return BootstrapResult.failed("scope_self_proof_failed")
    lock = acquire_lock(directory, GENERATION_LOCK_WAIT_MS)
    if lock is None:
        return BootstrapResult.failed("generation_lock_contended")
    with lock:
        if not _baseline_unchanged(directory, request):
            return BootstrapResult.failed("attempt_capability_invalid")
        spawn = deps.spawn(list(request.tmux_argv))
    progress.spawned = spawn.exit_code == 0
    if not progress.spawned:
        return BootstrapResult.failed("tmux_spawn_failed")
    native_session_id = (spawn.stdout or "").strip()
    if not is_native_session_id(native_session_id):
        return BootstrapResult.failed("native_session_identity_unavailable_cleanup_uncertain")
    proof = deps.probe_server(request.socket_key, control_argv)
    if not is_safe_server_proof(proof):
        return BootstrapResult.failed("server_proof_failed_cleanup_uncertain")
    return BootstrapResult(
        ok=True,
        code="bootstrapped",
        native_session_id=native_session_id,
        server_pid=proof.pid,
        server_start_time=proof.start_time,
        session_name=request.attempt.session_name,
    )
