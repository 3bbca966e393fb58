"""Terminal verdicts: exactly one immutable verdict per owner generation.

An observer reports how an owner ended; the first valid verdict published for a
generation wins forever and every later observer receives it. Publication runs
under the SQLite verdict lock (cross-process), and concurrent observers of the same
verdict file and socket in one process share one observation (in-process). A
write-ahead journal makes a crash between observation and publication recoverable.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any, Final, Literal, Self, TypeGuard

import attrs

from ._common import (
    SCHEMA_VERSION,
    InvalidRecordError,
    TmuxOwnerError,
    as_invalid_record,
    dumps,
    has_exact_keys,
    has_only_keys,
    is_record,
    is_safe_integer,
    is_schema_one,
    js_length,
    js_number,
    non_empty,
    parse_timestamp_ms,
    require,
    validate_canonical_timestamp,
    validate_non_empty,
    validate_path_component,
    validate_schema_one,
)
from ._files import (
    VERDICT_LOCK_WAIT_MS,
    LifecyclePaths,
    acquire_lock,
    atomic_write,
    lifecycle_paths,
    publish_exclusive,
    read_json_record,
)
from ._generations import is_current_owner_generation
from ._intents import EXPECTED_TERMINAL_RESULT, OwnerIntent

TerminalSignal = Literal["SIGTERM", "SIGHUP", "SIGINT", "SIGKILL", "EXIT", "MANUAL", "UNKNOWN"]
TerminalObserver = Literal["sidecar", "raw_monitor"]
VerdictClassification = Literal["expected_operator_shutdown", "unexpected_owner_loss", "non_operator_cleanup"]

TERMINAL_SIGNALS: Final = ("SIGTERM", "SIGHUP", "SIGINT", "SIGKILL", "EXIT", "MANUAL", "UNKNOWN")
TERMINAL_OBSERVERS: Final = ("sidecar", "raw_monitor")
EXPECTED: Final = "expected_operator_shutdown"
UNEXPECTED: Final = "unexpected_owner_loss"
NON_OPERATOR: Final = "non_operator_cleanup"
ALLOWED_EXIT_KINDS: Final = frozenset({"owner_lost", "cleanup", "process_postmortem", "exit"})
ALLOWED_REASONS: Final = frozenset(
    {
        "tmux_session_missing",
        "process_postmortem",
        "owner_exit",
        "sidecar",
        "integration",
        "test",
        "raw_terminal",
        "terminal_observation",
    }
)
MAX_LABEL_LENGTH = 64


def _short_label(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    require(non_empty(value) and js_length(value) <= MAX_LABEL_LENGTH, f"{attribute.name} must be 1-64 characters")


def _optional_non_empty(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    require(value is None or non_empty(value), f"{attribute.name} must be absent or a non-empty string")


def _exit_code(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    require(value is None or is_safe_integer(value), f"{attribute.name} must be null or a safe integer")


def _has_keys(value: object, keys: tuple[str, ...], *, optional: str) -> TypeGuard[dict[str, Any]]:
    """An object with every key of ``keys`` and no other, where ``optional`` may be absent but never null."""
    return (
        is_record(value)
        and has_only_keys(value, keys)
        and all(key in value for key in keys if key != optional)
        and (optional not in value or value[optional] is not None)
    )


_OBSERVE_KEYS = (
    "schema_version",
    "op",
    "session_id",
    "owner_generation",
    "state_dir",
    "socket_key",
    "observer",
    "observed_at",
    "signal",
    "exit_code",
    "exit_kind",
    "reason",
    "operator_dispatch_id",
)


@attrs.frozen(kw_only=True)
class ObserveTerminalRequest:
    """The protocol's ``observe_terminal`` request: one observer's report of an owner's end.

    ``operator_dispatch_id`` is ``None`` when absent (JSON ``null`` is refused).
    Beyond the seed: ``session_id`` and ``owner_generation`` must be safe path components.
    """

    session_id: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    owner_generation: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    state_dir: str = attrs.field(validator=validate_non_empty)
    socket_key: str = attrs.field(validator=validate_non_empty)
    observer: TerminalObserver = attrs.field(validator=attrs.validators.in_(TERMINAL_OBSERVERS))
    observed_at: str = attrs.field(validator=validate_canonical_timestamp)
    signal: TerminalSignal = attrs.field(validator=attrs.validators.in_(TERMINAL_SIGNALS))
    exit_code: int | None = attrs.field(converter=js_number, validator=_exit_code)
    exit_kind: str = attrs.field(validator=_short_label)
    reason: str = attrs.field(validator=_short_label)
    operator_dispatch_id: str | None = attrs.field(default=None, validator=_optional_non_empty)

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept the seed's ``isObserveTerminalRequest`` shape."""
        if (
            not _has_keys(value, _OBSERVE_KEYS, optional="operator_dispatch_id")
            or not is_schema_one(value["schema_version"])
            or value["op"] != "observe_terminal"
        ):
            raise InvalidRecordError(cls.__name__)
        fields = {key: item for key, item in value.items() if key not in ("schema_version", "op")}
        with as_invalid_record(cls.__name__):
            return cls(**fields)

    def to_json(self) -> dict[str, Any]:
        """The request in the seed's key order; ``operator_dispatch_id`` only when present."""
        record: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "op": "observe_terminal",
            "session_id": self.session_id,
            "owner_generation": self.owner_generation,
            "state_dir": self.state_dir,
            "socket_key": self.socket_key,
            "observer": self.observer,
            "observed_at": self.observed_at,
            "signal": self.signal,
            "exit_code": self.exit_code,
            "exit_kind": self.exit_kind,
            "reason": self.reason,
        }
        if self.operator_dispatch_id is not None:
            record["operator_dispatch_id"] = self.operator_dispatch_id
        return record

    def normalized(self) -> ObserveTerminalRequest:
        """Unknown exit kinds become ``unknown_terminal``; unknown reasons ``terminal_observation``."""
        return attrs.evolve(
            self,
            exit_kind=self.exit_kind if self.exit_kind in ALLOWED_EXIT_KINDS else "unknown_terminal",
            reason=self.reason if self.reason in ALLOWED_REASONS else "terminal_observation",
        )

    @property
    def dedupe_key(self) -> str:
        return f"owner-loss:{self.session_id}:{self.owner_generation}"


def _verdict_consistent(instance: OwnerVerdict, _attribute: object, dedupe_key: Any) -> None:
    require(dedupe_key == f"owner-loss:{instance.session_id}:{instance.generation}", "dedupe_key mismatch")
    if instance.classification == EXPECTED:
        require(
            instance.signal == "SIGTERM" and instance.result == EXPECTED_TERMINAL_RESULT and bool(instance.intent_id),
            "an expected verdict is a SIGTERM with its intent",
        )
    else:
        require(instance.intent_id is None, "only an expected verdict names an intent")
    if instance.classification == NON_OPERATOR:
        require(instance.result == "cleanup", "a non-operator cleanup has result cleanup")
    if instance.classification == UNEXPECTED:
        require(
            instance.result in ALLOWED_EXIT_KINDS or instance.result == "unknown_terminal",
            "an unexpected loss has an exit kind as result",
        )


_VERDICT_KEYS = (
    "schema_version",
    "generation",
    "session_id",
    "server_key",
    "observed_at",
    "signal",
    "exit_code",
    "result",
    "observer",
    "classification",
    "reason",
    "intent_id",
    "dedupe_key",
)


@attrs.frozen(kw_only=True)
class OwnerVerdict:
    """``verdict-<G>.json``: the one immutable terminal verdict of generation ``G``."""

    generation: str = attrs.field(validator=validate_non_empty)
    session_id: str = attrs.field(validator=validate_non_empty)
    server_key: str = attrs.field(validator=validate_non_empty)
    observed_at: str = attrs.field(validator=validate_canonical_timestamp)
    signal: TerminalSignal = attrs.field(validator=attrs.validators.in_(TERMINAL_SIGNALS))
    exit_code: int | None = attrs.field(converter=js_number, validator=_exit_code)
    result: str = attrs.field(validator=_short_label)
    observer: TerminalObserver = attrs.field(validator=attrs.validators.in_(TERMINAL_OBSERVERS))
    classification: VerdictClassification = attrs.field(
        validator=attrs.validators.in_((EXPECTED, UNEXPECTED, NON_OPERATOR))
    )
    reason: str = attrs.field(validator=attrs.validators.in_(ALLOWED_REASONS))
    intent_id: str | None = attrs.field(default=None, validator=_optional_non_empty)
    dedupe_key: str = attrs.field(validator=_verdict_consistent)
    schema_version: int = attrs.field(default=SCHEMA_VERSION, converter=js_number, validator=validate_schema_one)

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept only what the seed's ``isValidOwnerVerdict`` accepts (``intent_id`` optional, never null)."""
        if not _has_keys(value, _VERDICT_KEYS, optional="intent_id"):
            raise InvalidRecordError(cls.__name__)
        with as_invalid_record(cls.__name__):
            return cls(**value)

    def to_json(self) -> dict[str, Any]:
        """The verdict in the seed's key order; ``intent_id`` only for an expected shutdown."""
        record: dict[str, Any] = {
            "schema_version": self.schema_version,
            "generation": self.generation,
            "session_id": self.session_id,
            "server_key": self.server_key,
            "observed_at": self.observed_at,
            "signal": self.signal,
            "exit_code": self.exit_code,
            "result": self.result,
            "observer": self.observer,
            "classification": self.classification,
            "reason": self.reason,
        }
        if self.intent_id is not None:
            record["intent_id"] = self.intent_id
        record["dedupe_key"] = self.dedupe_key
        return record

    def alias_json(self) -> dict[str, Any]:
        """``verdict.json``: the verdict plus ``owner_generation``."""
        return {**self.to_json(), "owner_generation": self.generation}

    def answers(self, request: ObserveTerminalRequest) -> bool:
        """Whether this verdict is for the request's generation, session and socket."""
        return (
            self.generation == request.owner_generation
            and self.session_id == request.session_id
            and self.server_key == request.socket_key
        )


@attrs.frozen(kw_only=True)
class OwnerIncident:
    """``incident-<G>.json``: the immutable record of an unexpected owner loss."""

    generation: str = attrs.field(validator=validate_non_empty)
    session_id: str = attrs.field(validator=validate_non_empty)
    dedupe_key: str = attrs.field(validator=validate_non_empty)
    created_at: str = attrs.field(validator=validate_canonical_timestamp)
    classification: Literal["unexpected_owner_loss"] = attrs.field(
        default=UNEXPECTED, validator=attrs.validators.in_((UNEXPECTED,))
    )
    schema_version: int = attrs.field(default=SCHEMA_VERSION, converter=js_number, validator=validate_schema_one)

    _KEYS = ("schema_version", "generation", "session_id", "dedupe_key", "created_at", "classification")

    @classmethod
    def for_verdict(cls, verdict: OwnerVerdict) -> Self:
        """The incident that records ``verdict``'s loss, dated at its observation."""
        return cls(
            generation=verdict.generation,
            session_id=verdict.session_id,
            dedupe_key=verdict.dedupe_key,
            created_at=verdict.observed_at,
        )

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept exactly the six incident keys with valid values."""
        if not is_record(value) or not has_exact_keys(value, cls._KEYS):
            raise InvalidRecordError(cls.__name__)
        with as_invalid_record(cls.__name__):
            return cls(**value)

    def to_json(self) -> dict[str, Any]:
        """The incident in the seed's key order."""
        return {
            "schema_version": self.schema_version,
            "generation": self.generation,
            "session_id": self.session_id,
            "dedupe_key": self.dedupe_key,
            "created_at": self.created_at,
            "classification": self.classification,
        }


def _parse(record: type[Any], value: object) -> Any | None:
    try:
        return record.from_json(value)
    except InvalidRecordError:
        return None


def is_valid_owner_verdict(value: object, request: ObserveTerminalRequest | None = None) -> bool:
    """The seed's ``isValidOwnerVerdict``: a complete valid verdict, for ``request``'s owner if given."""
    verdict = _parse(OwnerVerdict, value)
    return verdict is not None and (request is None or verdict.answers(request))


def is_valid_owner_intent(value: object, request: ObserveTerminalRequest | None = None) -> bool:
    """The seed's ``isValidOwnerIntent``; with ``request``, whether the intent authorizes that observation.

    Authorization needs the same generation, session and server, the dispatch id the
    operator presented, a SIGTERM, and created_at <= observed_at < expires_at.
    """
    intent: OwnerIntent | None = _parse(OwnerIntent, value)
    if intent is None:
        return False
    if request is None:
        return True
    observed = parse_timestamp_ms(request.observed_at)
    created = parse_timestamp_ms(intent.created_at)
    expires = parse_timestamp_ms(intent.expires_at)
    return (
        observed is not None
        and created is not None
        and expires is not None
        and created <= observed < expires
        and intent.generation == request.owner_generation
        and intent.session_id == request.session_id
        and intent.server_key == request.socket_key
        and request.operator_dispatch_id is not None
        and intent.dispatch_id == request.operator_dispatch_id
        and request.signal == "SIGTERM"
    )


_live_observations: dict[tuple[str, str], Future[OwnerVerdict]] = {}
_live_observations_lock = threading.Lock()


def observe_owner_terminal(request: ObserveTerminalRequest | Mapping[str, Any]) -> OwnerVerdict:
    """Publish exactly one terminal verdict for the request's generation; an existing valid verdict wins.

    ``request`` may be the record or its parsed JSON (``terminal_observation_invalid``
    if malformed). Raises ``generation_mismatch`` unless the generation is current,
    ``verdict_lock_contended`` after 250 ms without the lock, ``immutable_record_conflict``
    / ``immutable_record_corrupt`` for a foreign or broken verdict file (still recording
    an unexpected loss as an incident), and ``owner_intent_consumption_failed`` when the
    authorizing intent cannot be consumed. Concurrent calls in this process for the same
    verdict file and socket share one observation and its outcome.
    """
    if not isinstance(request, ObserveTerminalRequest):
        try:
            request = ObserveTerminalRequest.from_json(request)
        except InvalidRecordError as error:
            raise TmuxOwnerError("terminal_observation_invalid") from error
    paths = lifecycle_paths(request.state_dir, request.session_id, request.owner_generation)
    key = (str(paths.verdict_file), request.socket_key)
    with _live_observations_lock:
        shared = _live_observations.get(key)
        if shared is None:
            mine: Future[OwnerVerdict] = Future()
            _live_observations[key] = mine
    if shared is not None:
        return shared.result()
    try:
        verdict = _observe_exclusive(request, paths)
    except BaseException as error:
        mine.set_exception(error)
        raise
    else:
        mine.set_result(verdict)
        return verdict
    finally:
        with _live_observations_lock:
            if _live_observations.get(key) is mine:
                del _live_observations[key]


def _observe_exclusive(request: ObserveTerminalRequest, paths: LifecyclePaths) -> OwnerVerdict:
    if not is_current_owner_generation(request.state_dir, request.session_id, request.owner_generation):
        raise TmuxOwnerError("generation_mismatch")
    lock = acquire_lock(paths.root, paths.lock_database_file, VERDICT_LOCK_WAIT_MS)
    if lock is None:
        raise TmuxOwnerError("verdict_lock_contended")
    with lock:
        if not is_current_owner_generation(request.state_dir, request.session_id, request.owner_generation):
            raise TmuxOwnerError("generation_mismatch")
        published = _parse(OwnerVerdict, read_json_record(paths.verdict_file))
        if published is not None and published.answers(request):
            return _reconcile(paths, published)
        observation = _recover_journal(paths, request) or request.normalized()
        atomic_write(
            paths.journal_file,
            {"schema_version": SCHEMA_VERSION, "observation": observation.to_json(), "token": lock.token},
        )
        intent_value = read_json_record(paths.intent_file)
        intent = _parse(OwnerIntent, intent_value) if is_valid_owner_intent(intent_value, observation) else None
        verdict = _build_verdict(observation, intent)
        if not lock.active:
            raise TmuxOwnerError("verdict_lock_lost")
        try:
            winner = _publish_verdict(paths, verdict, observation)
        except TmuxOwnerError:
            if verdict.classification == UNEXPECTED:
                _publish_incident(paths, OwnerIncident.for_verdict(verdict))
            raise
        if winner is not verdict:
            return _reconcile(paths, winner)
        if intent is not None:
            _consume_intent(paths, observation)
        if verdict.classification == UNEXPECTED:
            _publish_incident(paths, OwnerIncident.for_verdict(verdict))
        _publish_alias(paths, verdict)
        with contextlib.suppress(OSError):
            os.unlink(paths.journal_file)
        return verdict


def _recover_journal(paths: LifecyclePaths, request: ObserveTerminalRequest) -> ObserveTerminalRequest | None:
    """The observation a crashed observer journaled for the same owner, if any."""
    journal = read_json_record(paths.journal_file)
    if journal is None or not is_schema_one(journal.get("schema_version")):
        return None
    recovered: ObserveTerminalRequest | None = _parse(ObserveTerminalRequest, journal.get("observation"))
    if recovered is None or (
        recovered.session_id,
        recovered.owner_generation,
        recovered.state_dir,
        recovered.socket_key,
    ) != (request.session_id, request.owner_generation, request.state_dir, request.socket_key):
        return None
    return recovered.normalized()


def _build_verdict(observation: ObserveTerminalRequest, intent: OwnerIntent | None) -> OwnerVerdict:
    if intent is not None:
        classification, result = EXPECTED, EXPECTED_TERMINAL_RESULT
    elif observation.exit_kind == "cleanup":
        classification, result = NON_OPERATOR, observation.exit_kind
    else:
        classification, result = UNEXPECTED, observation.exit_kind
    return OwnerVerdict(
        generation=observation.owner_generation,
        session_id=observation.session_id,
        server_key=observation.socket_key,
        observed_at=observation.observed_at,
        signal=observation.signal,
        exit_code=observation.exit_code,
        result=result,
        observer=observation.observer,
        classification=classification,
        reason=observation.reason,
        intent_id=None if intent is None else intent.intent_id,
        dedupe_key=observation.dedupe_key,
    )


def _publish_verdict(paths: LifecyclePaths, verdict: OwnerVerdict, observation: ObserveTerminalRequest) -> OwnerVerdict:
    """Create the immutable verdict, or return the valid one already there (the same object if ours won)."""
    if publish_exclusive(paths.verdict_file, verdict.to_json()):
        return verdict
    existing = read_json_record(paths.verdict_file)
    if existing is None:
        raise TmuxOwnerError("immutable_record_corrupt")
    winner: OwnerVerdict | None = _parse(OwnerVerdict, existing)
    if winner is None or not winner.answers(observation):
        raise TmuxOwnerError("immutable_record_conflict")
    return winner


def _publish_incident(paths: LifecyclePaths, incident: OwnerIncident) -> None:
    """Create the incident; re-publishing identical content is a no-op, anything else a conflict."""
    if publish_exclusive(paths.incident_file, incident.to_json()):
        return
    existing = read_json_record(paths.incident_file)
    if existing is None:
        raise TmuxOwnerError("immutable_record_corrupt")
    if dumps(existing) != dumps(incident.to_json()):
        raise TmuxOwnerError("immutable_record_conflict")


def _consume_intent(paths: LifecyclePaths, observation: ObserveTerminalRequest) -> None:
    consumed = paths.retired_intent_file(".consumed")
    try:
        os.rename(paths.intent_file, consumed)
    except FileNotFoundError:
        # Another observer may have consumed it already; only that exact intent is acceptable.
        if not is_valid_owner_intent(read_json_record(consumed), observation):
            raise TmuxOwnerError("owner_intent_consumption_failed") from None
    except OSError as error:
        raise TmuxOwnerError("owner_intent_consumption_failed") from error


def _publish_alias(paths: LifecyclePaths, verdict: OwnerVerdict) -> None:
    current = read_json_record(paths.generation_file)
    if (
        current is None
        or not is_schema_one(current.get("schema_version"))
        or current.get("session_id") != verdict.session_id
        or current.get("generation") != verdict.generation
    ):
        raise TmuxOwnerError("generation_mismatch")
    atomic_write(paths.verdict_alias_file, verdict.alias_json())


def _reconcile(paths: LifecyclePaths, verdict: OwnerVerdict) -> OwnerVerdict:
    """Finish what a crashed or racing observer of ``verdict`` may have left undone."""
    if verdict.classification == EXPECTED and verdict.intent_id:
        intent = read_json_record(paths.intent_file)
        if intent is not None and intent.get("intent_id") == verdict.intent_id:
            try:
                os.rename(paths.intent_file, paths.retired_intent_file(".consumed"))
            except OSError as error:
                raise TmuxOwnerError("owner_intent_consumption_failed") from error
    if verdict.classification == UNEXPECTED:
        _publish_incident(paths, OwnerIncident.for_verdict(verdict))
    _publish_alias(paths, verdict)
    with contextlib.suppress(OSError):
        os.unlink(paths.journal_file)
    return verdict
