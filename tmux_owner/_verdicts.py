"""Terminal verdicts: exactly one immutable verdict per owner generation.

An observer reports how an owner ended; the first valid verdict published for a
generation wins forever and every later observer receives it. Publication runs
under the SQLite verdict lock (cross-process), and concurrent observers of the same
verdict file and socket in one process share one observation (in-process). A
write-ahead journal makes a crash between observation and publication recoverable.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import attrs

from ._dirfd import LifecycleDir
from ._durable import publish_record, replace_record, sweep_temporaries
from ._errors import InvalidRecordError, TmuxOwnerError
from ._files import VERDICT_LOCK_WAIT_MS, LifecyclePaths, lifecycle_paths, open_lifecycle
from ._generations import GENERATION_FILE
from ._intents import EXPECTED_TERMINAL_RESULT, OwnerIntent
from ._jscompat import dumps
from ._locks import SqliteLock, acquire_lock
from ._validators import SCHEMA_VERSION, is_schema_one
from ._verdict_records import (
    EXPECTED,
    NON_OPERATOR,
    UNEXPECTED,
    ObserveTerminalRequest,
    OwnerIncident,
    OwnerVerdict,
    VerdictClassification,
    is_valid_owner_intent,
    parse_or_none,
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

    Beyond the seed: ``untrusted_root`` for a symlinked session or lifecycle directory and
    ``untrusted_lifecycle_file`` for a symlinked lock database, journal, alias or
    ``.consumed`` name. Temporary files that killed writers left are removed first.
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
    directory = open_lifecycle(paths)
    if directory is None:
        raise TmuxOwnerError("generation_mismatch")
    with directory:
        if not _is_current(directory, request):
            raise TmuxOwnerError("generation_mismatch")
        lock = acquire_lock(directory, VERDICT_LOCK_WAIT_MS)
        if lock is None:
            raise TmuxOwnerError("verdict_lock_contended")
        with lock:
            sweep_temporaries(directory)
            if not _is_current(directory, request):
                raise TmuxOwnerError("generation_mismatch")
            return _observe_locked(_Files(directory, paths), request, lock)


@attrs.frozen
class _Files:
    """The open lifecycle directory and the names of one generation's records in it."""

    directory: LifecycleDir
    paths: LifecyclePaths


def _is_current(directory: LifecycleDir, request: ObserveTerminalRequest) -> bool:
    record = directory.read_json(GENERATION_FILE)
    return record is not None and record.get("generation") == request.owner_generation


def _observe_locked(files: _Files, request: ObserveTerminalRequest, lock: SqliteLock) -> OwnerVerdict:
    directory, paths = files.directory, files.paths
    published = parse_or_none(OwnerVerdict, directory.read_json(paths.verdict_file.name))
    if published is not None and published.answers(request):
        return _reconcile(files, published)
    observation = _recover_journal(files, request) or request.normalized()
    replace_record(
        directory,
        paths.journal_file.name,
        {"schema_version": SCHEMA_VERSION, "observation": observation.to_json(), "token": lock.token},
    )
    intent_value = directory.read_json(paths.intent_file.name)
    intent = parse_or_none(OwnerIntent, intent_value) if is_valid_owner_intent(intent_value, observation) else None
    verdict = _build_verdict(observation, intent)
    if not lock.active:
        raise TmuxOwnerError("verdict_lock_lost")
    try:
        winner = _publish_verdict(files, verdict, observation)
    except TmuxOwnerError:
        if verdict.classification == UNEXPECTED:
            _publish_incident(files, OwnerIncident.for_verdict(verdict))
        raise
    if winner is not verdict:
        return _reconcile(files, winner)
    if intent is not None:
        _consume_intent(files, observation)
    if verdict.classification == UNEXPECTED:
        _publish_incident(files, OwnerIncident.for_verdict(verdict))
    _publish_alias(files, verdict)
    with contextlib.suppress(OSError):
        directory.unlink(paths.journal_file.name)
    return verdict


def _recover_journal(files: _Files, request: ObserveTerminalRequest) -> ObserveTerminalRequest | None:
    """The observation a crashed observer journaled for the same owner, if any."""
    journal = files.directory.read_json(files.paths.journal_file.name)
    if journal is None or not is_schema_one(journal.get("schema_version")):
        return None
    recovered: ObserveTerminalRequest | None = parse_or_none(ObserveTerminalRequest, journal.get("observation"))
    if recovered is None or (
        recovered.session_id,
        recovered.owner_generation,
        recovered.state_dir,
        recovered.socket_key,
    ) != (request.session_id, request.owner_generation, request.state_dir, request.socket_key):
        return None
    return recovered.normalized()


def _build_verdict(observation: ObserveTerminalRequest, intent: OwnerIntent | None) -> OwnerVerdict:
    classification: VerdictClassification
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


def _publish_verdict(files: _Files, verdict: OwnerVerdict, observation: ObserveTerminalRequest) -> OwnerVerdict:
    """Create the immutable verdict, or return the valid one already there (the same object if ours won)."""
    name = files.paths.verdict_file.name
    if publish_record(files.directory, name, verdict.to_json()):
        return verdict
    existing = files.directory.read_json(name)
    if existing is None:
        raise TmuxOwnerError("immutable_record_corrupt")
    winner: OwnerVerdict | None = parse_or_none(OwnerVerdict, existing)
    if winner is None or not winner.answers(observation):
        raise TmuxOwnerError("immutable_record_conflict")
    return winner


def _publish_incident(files: _Files, incident: OwnerIncident) -> None:
    """Create the incident; re-publishing identical content is a no-op, anything else a conflict."""
    name = files.paths.incident_file.name
    if publish_record(files.directory, name, incident.to_json()):
        return
    existing = files.directory.read_json(name)
    if existing is None:
        raise TmuxOwnerError("immutable_record_corrupt")
    if dumps(existing) != dumps(incident.to_json()):
        raise TmuxOwnerError("immutable_record_conflict")


def _consume_intent(files: _Files, observation: ObserveTerminalRequest) -> None:
    consumed = files.paths.retired_intent_file(".consumed").name
    try:
        files.directory.rename(files.paths.intent_file.name, consumed)
    except FileNotFoundError:
        # Another observer may have consumed it already; only that exact intent is acceptable.
        if not is_valid_owner_intent(files.directory.read_json(consumed), observation):
            raise TmuxOwnerError("owner_intent_consumption_failed") from None
    except OSError as error:
        raise TmuxOwnerError("owner_intent_consumption_failed") from error


def _publish_alias(files: _Files, verdict: OwnerVerdict) -> None:
    current = files.directory.read_json(GENERATION_FILE)
    if (
        current is None
        or not is_schema_one(current.get("schema_version"))
        or current.get("session_id") != verdict.session_id
        or current.get("generation") != verdict.generation
    ):
        raise TmuxOwnerError("generation_mismatch")
    replace_record(files.directory, files.paths.verdict_alias_file.name, verdict.alias_json())


def _reconcile(files: _Files, verdict: OwnerVerdict) -> OwnerVerdict:
    """Finish what a crashed or racing observer of ``verdict`` may have left undone."""
    directory, paths = files.directory, files.paths
    if verdict.classification == EXPECTED and verdict.intent_id:
        intent = directory.read_json(paths.intent_file.name)
        if intent is not None and intent.get("intent_id") == verdict.intent_id:
            try:
                directory.rename(paths.intent_file.name, paths.retired_intent_file(".consumed").name)
            except OSError as error:
                raise TmuxOwnerError("owner_intent_consumption_failed") from error
    if verdict.classification == UNEXPECTED:
        _publish_incident(files, OwnerIncident.for_verdict(verdict))
    _publish_alias(files, verdict)
    with contextlib.suppress(OSError):
        directory.unlink(paths.journal_file.name)
    return verdict
