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
from typing import Any

from ._errors import InvalidRecordError, TmuxOwnerError
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
from ._jscompat import dumps
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
        published = parse_or_none(OwnerVerdict, read_json_record(paths.verdict_file))
        if published is not None and published.answers(request):
            return _reconcile(paths, published)
        observation = _recover_journal(paths, request) or request.normalized()
        atomic_write(
            paths.journal_file,
            {"schema_version": SCHEMA_VERSION, "observation": observation.to_json(), "token": lock.token},
        )
        intent_value = read_json_record(paths.intent_file)
        intent = parse_or_none(OwnerIntent, intent_value) if is_valid_owner_intent(intent_value, observation) else None
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


def _publish_verdict(paths: LifecyclePaths, verdict: OwnerVerdict, observation: ObserveTerminalRequest) -> OwnerVerdict:
    """Create the immutable verdict, or return the valid one already there (the same object if ours won)."""
    if publish_exclusive(paths.verdict_file, verdict.to_json()):
        return verdict
    existing = read_json_record(paths.verdict_file)
    if existing is None:
        raise TmuxOwnerError("immutable_record_corrupt")
    winner: OwnerVerdict | None = parse_or_none(OwnerVerdict, existing)
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
