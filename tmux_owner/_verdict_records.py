"""The verdict records: the terminal observation, the verdict, the incident, and their validity checks.

``is_valid_owner_verdict`` and ``is_valid_owner_intent`` are the seed's predicates; the
latter also decides whether an intent authorizes an observation (an expected shutdown).
"""

from __future__ import annotations

from typing import Any, Final, Literal, Self, TypeGuard, get_args

import attrs

from ._errors import InvalidRecordError
from ._intents import EXPECTED_TERMINAL_RESULT, OwnerIntent
from ._jscompat import is_safe_integer, js_length, js_number
from ._timestamps import parse_timestamp_ms
from ._validators import (
    SCHEMA_VERSION,
    as_invalid_record,
    field_validator,
    has_only_keys,
    is_record,
    is_schema_one,
    non_empty,
    one_of,
    record_with_exact_keys,
    require,
    validate_canonical_timestamp,
    validate_non_empty,
    validate_optional_non_empty,
    validate_path_component,
    validate_schema_one,
)

TerminalSignal = Literal["SIGTERM", "SIGHUP", "SIGINT", "SIGKILL", "EXIT", "MANUAL", "UNKNOWN"]
TerminalObserver = Literal["sidecar", "raw_monitor"]
VerdictClassification = Literal["expected_operator_shutdown", "unexpected_owner_loss", "non_operator_cleanup"]
IncidentClassification = Literal["unexpected_owner_loss"]

TERMINAL_SIGNALS: Final = get_args(TerminalSignal)
TERMINAL_OBSERVERS: Final = get_args(TerminalObserver)
VERDICT_CLASSIFICATIONS: Final = get_args(VerdictClassification)
EXPECTED: Final[VerdictClassification] = "expected_operator_shutdown"
UNEXPECTED: Final[IncidentClassification] = "unexpected_owner_loss"
NON_OPERATOR: Final[VerdictClassification] = "non_operator_cleanup"
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
# What an observation's exit kind or reason outside the allowed sets is stored as.
UNKNOWN_EXIT_KIND: Final = "unknown_terminal"
UNKNOWN_REASON: Final = "terminal_observation"
MAX_LABEL_LENGTH = 64


def _is_short_label(value: object) -> bool:
    return non_empty(value) and js_length(value) <= MAX_LABEL_LENGTH


def _is_exit_code(value: object) -> bool:
    return value is None or is_safe_integer(value)


_validate_short_label = field_validator(_is_short_label)
_validate_exit_code = field_validator(_is_exit_code)


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
    observer: TerminalObserver = attrs.field(validator=one_of(TERMINAL_OBSERVERS))
    observed_at: str = attrs.field(validator=validate_canonical_timestamp)
    signal: TerminalSignal = attrs.field(validator=one_of(TERMINAL_SIGNALS))
    exit_code: int | None = attrs.field(converter=js_number, validator=_validate_exit_code)
    exit_kind: str = attrs.field(validator=_validate_short_label)
    reason: str = attrs.field(validator=_validate_short_label)
    operator_dispatch_id: str | None = attrs.field(default=None, validator=validate_optional_non_empty)

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
            exit_kind=self.exit_kind if self.exit_kind in ALLOWED_EXIT_KINDS else UNKNOWN_EXIT_KIND,
            reason=self.reason if self.reason in ALLOWED_REASONS else UNKNOWN_REASON,
        )

    @property
    def dedupe_key(self) -> str:
        return f"owner-loss:{self.session_id}:{self.owner_generation}"


def _validate_verdict_consistent(instance: OwnerVerdict, attribute: attrs.Attribute[Any], dedupe_key: Any) -> None:
    """The dedupe key names the owner, and the classification agrees with the signal, result and intent."""
    require(dedupe_key == f"owner-loss:{instance.session_id}:{instance.generation}", attribute)
    if instance.classification == EXPECTED:
        expected_shutdown = instance.signal == "SIGTERM" and instance.result == EXPECTED_TERMINAL_RESULT
        require(expected_shutdown and bool(instance.intent_id), attribute)
    else:
        require(instance.intent_id is None, attribute)
    if instance.classification == NON_OPERATOR:
        require(instance.result == "cleanup", attribute)
    if instance.classification == UNEXPECTED:
        require(instance.result in ALLOWED_EXIT_KINDS or instance.result == UNKNOWN_EXIT_KIND, attribute)


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
    signal: TerminalSignal = attrs.field(validator=one_of(TERMINAL_SIGNALS))
    exit_code: int | None = attrs.field(converter=js_number, validator=_validate_exit_code)
    result: str = attrs.field(validator=_validate_short_label)
    observer: TerminalObserver = attrs.field(validator=one_of(TERMINAL_OBSERVERS))
    classification: VerdictClassification = attrs.field(validator=one_of(VERDICT_CLASSIFICATIONS))
    reason: str = attrs.field(validator=one_of(ALLOWED_REASONS))
    intent_id: str | None = attrs.field(default=None, validator=validate_optional_non_empty)
    dedupe_key: str = attrs.field(validator=_validate_verdict_consistent)
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
    classification: IncidentClassification = attrs.field(
        default=UNEXPECTED, validator=one_of(get_args(IncidentClassification))
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
        return record_with_exact_keys(cls, value, cls._KEYS)

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


def parse_or_none(record: type[Any], value: object) -> Any | None:
    """``record.from_json(value)``, or ``None`` where that raises ``InvalidRecordError``."""
    try:
        return record.from_json(value)
    except InvalidRecordError:
        return None


def is_valid_owner_verdict(value: object, request: ObserveTerminalRequest | None = None) -> bool:
    """The seed's ``isValidOwnerVerdict``: a complete valid verdict, for ``request``'s owner if given.

    A ``request`` that is not an :class:`ObserveTerminalRequest` matches nothing.
    """
    verdict = parse_or_none(OwnerVerdict, value)
    given: object = request  # callers outside the type checker may pass anything
    if verdict is None or not (given is None or isinstance(given, ObserveTerminalRequest)):
        return False
    return given is None or verdict.answers(given)


def is_valid_owner_intent(value: object, request: ObserveTerminalRequest | None = None) -> bool:
    """The seed's ``isValidOwnerIntent``; with ``request``, whether the intent authorizes that observation.

    Authorization needs the same generation, session and server, the dispatch id the
    operator presented, a SIGTERM, and created_at <= observed_at < expires_at. A
    ``request`` that is not an :class:`ObserveTerminalRequest` authorizes nothing.
    """
    intent: OwnerIntent | None = parse_or_none(OwnerIntent, value)
    given: object = request  # callers outside the type checker may pass anything
    if intent is None or not (given is None or isinstance(given, ObserveTerminalRequest)):
        return False
    if given is None:
        return True
    request = given
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
