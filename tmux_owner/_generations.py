"""Owner generations: the current-generation pointer, its baseline, and compare-and-set publication.

``generation.json`` names the one current owner generation of a session. Every
generation ever published also leaves an immutable marker
``generation-<encoded>.published.json``, so a generation id can never be reused
(``generation_replay``). Publication is serialised by the SQLite generation lock.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any, Literal, Self, get_args

import attrs

from ._dirfd import LifecycleDir
from ._durable import publish_record, replace_record, sweep_temporaries
from ._errors import InvalidRecordError, TmuxOwnerError
from ._files import GENERATION_LOCK_WAIT_MS, LifecyclePaths, create_lifecycle, lifecycle_paths, open_lifecycle
from ._jscompat import dumps, js_number
from ._locks import acquire_lock
from ._timestamps import iso_now
from ._validators import (
    SCHEMA_VERSION,
    as_invalid_record,
    has_exact_keys,
    is_record,
    is_schema_one,
    of_type,
    one_of,
    record_with_exact_keys,
    require,
    validate_canonical_timestamp,
    validate_non_empty,
    validate_path_component,
    validate_schema_one,
)

BaselineState = Literal["absent", "current"]
GENERATION_KEYS = ("schema_version", "generation", "session_id", "published_at")
_CURRENT_BASELINE_KEYS = ("state", *GENERATION_KEYS)
GENERATION_FILE = "generation.json"


@attrs.frozen
class GenerationRecord:
    """The content of ``generation.json`` and of every published marker."""

    generation: str = attrs.field(validator=validate_non_empty)
    session_id: str = attrs.field(validator=validate_non_empty)
    published_at: str = attrs.field(validator=validate_canonical_timestamp)
    schema_version: int = attrs.field(default=SCHEMA_VERSION, converter=js_number, validator=validate_schema_one)

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept exactly the seed's four-key generation record."""
        return record_with_exact_keys(cls, value, GENERATION_KEYS)

    def to_json(self) -> dict[str, Any]:
        """The record in the seed's key order."""
        return {
            "schema_version": self.schema_version,
            "generation": self.generation,
            "session_id": self.session_id,
            "published_at": self.published_at,
        }


def _validate_baseline_record(
    instance: OwnerGenerationBaseline, attribute: attrs.Attribute[Any], value: GenerationRecord | None
) -> None:
    """An absent baseline has no record; a current one has its generation record."""
    require(value is None if instance.state == "absent" else isinstance(value, GenerationRecord), attribute)


@attrs.frozen
class OwnerGenerationBaseline:
    """What a caller saw in ``generation.json``: ``absent``, or the full ``current`` record.

    Two baselines are the same exactly when they are equal.
    """

    state: BaselineState = attrs.field(validator=one_of(get_args(BaselineState)))
    record: GenerationRecord | None = attrs.field(default=None, validator=_validate_baseline_record)

    @classmethod
    def absent(cls) -> Self:
        """No generation has been published."""
        return cls("absent")

    @classmethod
    def current(cls, record: GenerationRecord) -> Self:
        """``record`` is the published current generation."""
        return cls("current", record)

    @property
    def generation(self) -> str | None:
        """The current generation id, or ``None`` when absent."""
        return None if self.record is None else self.record.generation

    @property
    def session_id(self) -> str | None:
        return None if self.record is None else self.record.session_id

    @property
    def published_at(self) -> str | None:
        return None if self.record is None else self.record.published_at

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Exactly ``{"state":"absent"}``, or ``state:"current"`` with the four generation keys."""
        if not is_record(value):
            raise InvalidRecordError(cls.__name__)
        if value == {"state": "absent"}:
            return cls.absent()
        if value.get("state") != "current" or not has_exact_keys(value, _CURRENT_BASELINE_KEYS):
            raise InvalidRecordError(cls.__name__)
        fields = {key: value[key] for key in GENERATION_KEYS}
        try:
            return cls.current(GenerationRecord.from_json(fields))
        except InvalidRecordError as error:
            raise InvalidRecordError(cls.__name__) from error

    def to_json(self) -> dict[str, Any]:
        """``{"state":"absent"}`` or ``{"state":"current", <generation record>}`` in the seed's order."""
        if self.record is None:
            return {"state": "absent"}
        return {"state": "current", **self.record.to_json()}


def same_owner_generation_baseline(left: OwnerGenerationBaseline, right: OwnerGenerationBaseline) -> bool:
    """Whether two baselines describe the same state (all five fields for ``current``)."""
    return left == right


def capture_owner_generation_baseline(state_dir: str | os.PathLike[str], session_id: str) -> OwnerGenerationBaseline:
    """Read ``generation.json`` strictly.

    Returns the absent baseline when nothing exists at that name; raises
    ``baseline_generation_corrupt`` for anything that is not exactly this session's
    generation record, including a symlink (which is never followed), and
    ``untrusted_root`` when the session or lifecycle directory is a symlink.
    """
    directory = open_lifecycle(lifecycle_paths(state_dir, session_id, "baseline"))
    if directory is None:
        return OwnerGenerationBaseline.absent()
    with directory:
        return capture_in(directory, session_id)


def capture_in(directory: LifecycleDir, session_id: str) -> OwnerGenerationBaseline:
    """:func:`capture_owner_generation_baseline` in an open lifecycle directory."""
    if not directory.exists(GENERATION_FILE):
        return OwnerGenerationBaseline.absent()
    value = directory.read_json(GENERATION_FILE)
    try:
        record = GenerationRecord.from_json(value)
    except InvalidRecordError as error:
        raise TmuxOwnerError("baseline_generation_corrupt") from error
    if record.session_id != session_id:
        raise TmuxOwnerError("baseline_generation_corrupt")
    return OwnerGenerationBaseline.current(record)


def is_owner_generation_baseline_current(
    state_dir: str | os.PathLike[str], session_id: str, baseline: OwnerGenerationBaseline
) -> bool:
    """Whether ``generation.json`` still matches ``baseline``; a corrupt pointer or an untrusted directory never is."""
    try:
        current = capture_owner_generation_baseline(state_dir, session_id)
    except TmuxOwnerError:
        return False
    return same_owner_generation_baseline(current, baseline)


def replace_owner_generation(
    state_dir: str | os.PathLike[str],
    session_id: str,
    generation: str | None = None,
    expected_baseline: OwnerGenerationBaseline | None = None,
) -> str:
    """Publish ``generation`` (a fresh UUID if omitted) as the session's current generation.

    Under the generation lock (7 s, else ``generation_lock_contended``): a corrupt
    ``generation.json`` raises ``baseline_generation_corrupt``; when ``expected_baseline``
    is given, the pointer must still match it (else ``generation_baseline_changed``);
    without one the replacement is unconditional. Then, in the seed's order: create
    the new immutable marker (``generation_replay`` if it exists, so the id is burned
    even if a later step fails), make sure the previous generation's marker exists
    with the same content, replace the pointer, and invalidate the previous
    generation's pending intent. Returns the published generation.

    Beyond the seed: an ``expected_baseline`` naming a generation, for a session that
    has no lifecycle directory, loses the CAS without creating one; a baseline of
    another type raises ``InvalidRecordError``; a symlinked directory or lock database
    raises ``untrusted_root`` / ``untrusted_lifecycle_file``.
    """
    given: object = expected_baseline  # callers outside the type checker may pass anything
    if given is not None and not isinstance(given, OwnerGenerationBaseline):
        raise InvalidRecordError(OwnerGenerationBaseline.__name__)
    return _publish(state_dir, session_id, str(uuid.uuid4()) if generation is None else generation, expected_baseline)


def _publish(
    state_dir: str | os.PathLike[str],
    session_id: str,
    generation: str,
    expected_baseline: OwnerGenerationBaseline | None,
    *,
    strict_cas: bool = False,
) -> str:
    # The seed's two publishers spell a lost CAS differently.
    changed = "baseline_generation_changed" if strict_cas else "generation_baseline_changed"
    paths = lifecycle_paths(state_dir, session_id, generation)
    directory = open_lifecycle(paths)
    if directory is None:
        # No directory means no current generation: a refused CAS must not create one.
        if expected_baseline is not None and expected_baseline.record is not None:
            raise TmuxOwnerError(changed)
        directory = create_lifecycle(paths)
    with directory:
        lock = acquire_lock(directory, GENERATION_LOCK_WAIT_MS)
        if lock is None:
            raise TmuxOwnerError("generation_lock_contended")
        with lock:
            sweep_temporaries(directory)
            return _publish_locked(directory, paths, expected_baseline, changed, strict_cas=strict_cas)


def _publish_locked(
    directory: LifecycleDir,
    paths: LifecyclePaths,
    expected_baseline: OwnerGenerationBaseline | None,
    changed: str,
    *,
    strict_cas: bool,
) -> str:
    session_id, generation = paths.session_id, paths.generation
    # Only the strict (canonical) publisher reads a corrupt pointer as "changed" rather than "corrupt".
    if strict_cas and expected_baseline is not None:
        try:
            current_or_corrupt: OwnerGenerationBaseline | None = capture_in(directory, session_id)
        except TmuxOwnerError:
            current_or_corrupt = None
        if current_or_corrupt != expected_baseline:
            raise TmuxOwnerError(changed)
    current = capture_in(directory, session_id)
    if expected_baseline is not None and not same_owner_generation_baseline(current, expected_baseline):
        raise TmuxOwnerError(changed)
    previous = current.record
    prior = None
    if previous is not None and previous.generation != generation:
        prior = lifecycle_paths(paths.state_dir, session_id, previous.generation)
    published = GenerationRecord(generation=generation, session_id=session_id, published_at=iso_now())
    if not publish_record(directory, paths.generation_marker_file.name, published.to_json()):
        raise TmuxOwnerError("generation_replay")
    if prior is not None and previous is not None:
        _ensure_generation_marker(directory, prior.generation_marker_file.name, previous)
    replace_record(directory, GENERATION_FILE, published.to_json())
    if prior is not None:
        intent = directory.read_json(prior.intent_file.name)
        if intent is not None and intent.get("state") == "pending":
            # The seed ignores a failed invalidation: the intent is no longer current either way.
            with contextlib.suppress(OSError, TmuxOwnerError):
                directory.rename(prior.intent_file.name, prior.retired_intent_file(".invalidated").name)
    return generation


def _ensure_generation_marker(directory: LifecycleDir, name: str, record: GenerationRecord) -> None:
    if publish_record(directory, name, record.to_json()):
        return
    existing = directory.read_json(name)
    if existing is None or dumps(existing) != dumps(record.to_json()):
        raise TmuxOwnerError("generation_replay")


@attrs.frozen
class PublishGenerationRequest:
    """The protocol's ``publish_generation`` request.

    Beyond the seed: ``session_id`` and ``owner_generation`` must be safe path components.
    """

    session_id: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    owner_generation: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    state_dir: str = attrs.field(validator=validate_non_empty)
    baseline: OwnerGenerationBaseline = attrs.field(validator=of_type(OwnerGenerationBaseline))

    _KEYS = ("schema_version", "op", "session_id", "owner_generation", "state_dir", "baseline")

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept the seed's ``isPublishGenerationRequest`` shape (no extra keys, ``op`` and schema fixed)."""
        if (
            not is_record(value)
            or not has_exact_keys(value, cls._KEYS)
            or not is_schema_one(value["schema_version"])
            or value["op"] != "publish_generation"
        ):
            raise InvalidRecordError(cls.__name__)
        with as_invalid_record(cls.__name__):
            return cls(
                session_id=value["session_id"],
                owner_generation=value["owner_generation"],
                state_dir=value["state_dir"],
                baseline=OwnerGenerationBaseline.from_json(value["baseline"]),
            )

    def to_json(self) -> dict[str, Any]:
        """The request in the seed's key order."""
        return {
            "schema_version": SCHEMA_VERSION,
            "op": "publish_generation",
            "session_id": self.session_id,
            "owner_generation": self.owner_generation,
            "state_dir": self.state_dir,
            "baseline": self.baseline.to_json(),
        }


@attrs.frozen
class PublishGenerationResult:
    """``{"schema_version":1,"ok":true,"code":"generation_published","generation":...}``."""

    generation: str = attrs.field(validator=validate_non_empty)

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept exactly the seed's four-key success result."""
        if (
            not is_record(value)
            or not has_exact_keys(value, ("schema_version", "ok", "code", "generation"))
            or not is_schema_one(value["schema_version"])
            or value["ok"] is not True
            or value["code"] != "generation_published"
        ):
            raise InvalidRecordError(cls.__name__)
        with as_invalid_record(cls.__name__):
            return cls(value["generation"])

    def to_json(self) -> dict[str, Any]:
        """The result in the seed's key order."""
        return {
            "schema_version": SCHEMA_VERSION,
            "ok": True,
            "code": "generation_published",
            "generation": self.generation,
        }


def publish_owner_generation(request: PublishGenerationRequest | object) -> PublishGenerationResult:
    """The seed's canonical CAS publication: the baseline must be current, else ``baseline_generation_changed``.

    A corrupt ``generation.json`` never matches a baseline, so it also reads as changed.
    ``request`` may be the record or its parsed JSON (``InvalidRecordError`` if malformed).
    """
    if not isinstance(request, PublishGenerationRequest):
        request = PublishGenerationRequest.from_json(request)
    generation = _publish(
        request.state_dir, request.session_id, request.owner_generation, request.baseline, strict_cas=True
    )
    return PublishGenerationResult(generation)
