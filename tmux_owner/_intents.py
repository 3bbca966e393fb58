"""SIGTERM intents: the durable authorization written before an owner is signalled.

One intent per generation, ever: once ``intent-<G>.json`` or any of its terminal
forms (``.consumed``, ``.cancelled``, ``.expired``, ``.invalidated``) exists, no new
intent can be created for that generation (``owner_intent_replay``).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Final, Literal, Self, get_args

import attrs

from ._durable import publish_record, sweep_temporaries
from ._errors import InvalidRecordError, TmuxOwnerError
from ._files import RETIRED_INTENT_SUFFIXES, create_lifecycle, lifecycle_paths
from ._jscompat import js_number
from ._timestamps import parse_timestamp_ms
from ._validators import (
    SCHEMA_VERSION,
    as_invalid_record,
    field_validator,
    has_exact_keys,
    is_record,
    one_of,
    require,
    validate_non_empty,
    validate_path_component,
    validate_schema_one,
)

IntentState = Literal["pending"]
EXPECTED_TERMINAL_RESULT: Final = "owner_term_then_session_cleanup"
EXPECTED_TERMINAL: Final = {"signal": "SIGTERM", "result": EXPECTED_TERMINAL_RESULT}

_INTENT_KEYS = (
    "schema_version",
    "intent_id",
    "state",
    "generation",
    "session_id",
    "server_key",
    "expected_terminal",
    "dispatch_id",
    "created_at",
    "expires_at",
)


def _is_parsable_timestamp(value: object) -> bool:
    return parse_timestamp_ms(value) is not None


def _validate_not_expired_before_created(instance: OwnerIntent, attribute: attrs.Attribute[Any], value: Any) -> None:
    created, expires = parse_timestamp_ms(instance.created_at), parse_timestamp_ms(value)
    require(created is not None and expires is not None and created <= expires, attribute)


@attrs.frozen(kw_only=True)
class OwnerIntent:
    """``intent-<G>.json``: a pending authorization to SIGTERM the owner of generation ``G``.

    Beyond the seed: ``generation`` and ``session_id`` must be safe path components.
    """

    intent_id: str = attrs.field(validator=validate_non_empty)
    generation: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    session_id: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    server_key: str = attrs.field(validator=validate_non_empty)
    dispatch_id: str = attrs.field(validator=validate_non_empty)
    created_at: str = attrs.field(validator=field_validator(_is_parsable_timestamp))
    expires_at: str = attrs.field(
        validator=[field_validator(_is_parsable_timestamp), _validate_not_expired_before_created]
    )
    state: IntentState = attrs.field(default="pending", validator=one_of(get_args(IntentState)))
    schema_version: int = attrs.field(default=SCHEMA_VERSION, converter=js_number, validator=validate_schema_one)

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept only the seed's exact pending-intent shape (``isValidOwnerIntent`` without an observation)."""
        if (
            not is_record(value)
            or not has_exact_keys(value, _INTENT_KEYS)
            or not is_record(value["expected_terminal"])
            or value["expected_terminal"] != EXPECTED_TERMINAL
            or not all(isinstance(item, str) for item in value["expected_terminal"].values())
        ):
            raise InvalidRecordError(cls.__name__)
        fields = {key: item for key, item in value.items() if key != "expected_terminal"}
        with as_invalid_record(cls.__name__):
            return cls(**fields)

    def to_json(self) -> dict[str, Any]:
        """The intent in the seed's key order."""
        return {
            "schema_version": self.schema_version,
            "intent_id": self.intent_id,
            "state": self.state,
            "generation": self.generation,
            "session_id": self.session_id,
            "server_key": self.server_key,
            "expected_terminal": dict(EXPECTED_TERMINAL),
            "dispatch_id": self.dispatch_id,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
        }


def create_owner_intent(
    state_dir: str | os.PathLike[str],
    *,
    generation: str,
    session_id: str,
    server_key: str,
    dispatch_id: str,
    created_at: str,
    expires_at: str,
) -> OwnerIntent:
    """Publish the one pending SIGTERM intent of ``generation`` (exclusive create, 0600, fsynced).

    Raises ``owner_intent_invalid`` for an invalid intent (nothing is written) and
    ``owner_intent_replay`` when the generation already has an intent in any state (a
    symlink at any of those names counts). Timestamps are not compared with the clock
    here. Beyond the seed: a symlinked session or lifecycle directory raises ``untrusted_root``.
    """
    try:
        intent = OwnerIntent(
            intent_id=str(uuid.uuid4()),
            generation=generation,
            session_id=session_id,
            server_key=server_key,
            dispatch_id=dispatch_id,
            created_at=created_at,
            expires_at=expires_at,
        )
    except (TypeError, ValueError) as error:
        raise TmuxOwnerError("owner_intent_invalid") from error
    paths = lifecycle_paths(state_dir, session_id, generation)
    with create_lifecycle(paths) as directory:
        sweep_temporaries(directory)
        candidates = [paths.intent_file, *(paths.retired_intent_file(suffix) for suffix in RETIRED_INTENT_SUFFIXES)]
        if any(directory.exists(candidate.name) for candidate in candidates):
            raise TmuxOwnerError("owner_intent_replay")
        if not publish_record(directory, paths.intent_file.name, intent.to_json()):
            raise TmuxOwnerError("owner_intent_replay")
    return intent
