"""Building deep queues fast: what ``enqueue_with_payload`` (or ``enqueue``) writes, in one transaction.

Queuing 100 000 requests through the plane takes minutes (one write transaction each), so
the depth benchmarks load the queue with the service's own ``INSERT`` statements
(:mod:`admission_plane.store.statements`), compiled for the target's dialect, in one
transaction: the request rows (bound to the plane's queued owner, as ``enqueue`` binds
them), the sealed payloads, the journal rows, and the admission index
(``queue_entries`` and the heads of its groups, ``queue_sessions``/``queue_agents``/``queue_keys``,
written with the statements :mod:`admission_plane.service._queue_index` uses). A request
without a payload gets neither a payload nor an index entry, as the plane does. On
PostgreSQL the load ends with ``ANALYZE``, as autovacuum would after such growth.

:func:`index_tables` reads back everything the plane writes at enqueue, so a test can
check that a queue built here equals the same queue built through the plane's API.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from typing import Any

import attrs

from admission_plane import AdmissionPlane
from admission_plane.crypto import SecretKey, content_fingerprint, event_correlation, seal
from admission_plane.evidence import capture
from admission_plane.store.statements import journal, queue, requests
from admission_plane.store.tx import Statement

from ._support import CONTENT_KEY, ENCRYPTION_KEY, dispatch_record
from ._support import _rows as read_rows

#: How long a queued request may wait (the benchmark policies' queue timeout is the default, 30 min).
QUEUE_TIMEOUT_MS = 1_800_000
PAYLOAD_TTL_MS = 1_800_001


@attrs.frozen
class Spec:
    """Who a queued request is: its lane, provider/model key, agent and session, and whether it has its payload."""

    lane: str = "default"
    provider: str = "antigravity"
    model: str = "model-bench"
    agent: str = "agent-0"
    session: str = "session-1"
    payload: bool = True


@attrs.frozen
class Queued:
    """One request to queue: its ID, who it is and when it was enqueued."""

    request_id: str
    spec: Spec
    enqueued_at: int


def plaintext(request_id: str) -> str:
    """The prompt every benchmark request carries."""
    return f"prompt {request_id}"


def enqueue(plane: Any, item: Queued) -> None:
    """Queue ``item`` through the plane's API (``enqueue_with_payload``, or ``enqueue`` without a payload)."""
    spec = item.spec
    fields = {
        "request_id": item.request_id,
        "session_id": spec.session,
        "agent_id": spec.agent,
        "fingerprint": "fp-1",
        "provider": spec.provider,
        "model": spec.model,
        "now": item.enqueued_at,
        "lane": spec.lane,
    }
    if spec.payload:
        plane.enqueue_with_payload(
            **fields, plaintext=plaintext(item.request_id), expires_at=item.enqueued_at + PAYLOAD_TTL_MS
        )
    else:
        plane.enqueue(**fields)


#: Sealed payload and journal values per request ID: sealing 100 000 prompts is the slow part of a
#: load, and every shape names its requests alike, so they are sealed once per session.
_SEALED: dict[str, tuple[bytes, bytes, bytes, int, str, str]] = {}


def _sealed(request_id: str) -> tuple[bytes, bytes, bytes, int, str, str]:
    """(nonce, ciphertext, auth tag, key version, content fingerprint, journal correlation) of a request."""
    found = _SEALED.get(request_id)
    if found is None:
        encryption, content = SecretKey(ENCRYPTION_KEY, "encryption"), SecretKey(CONTENT_KEY, "content")
        sealed = seal(encryption, request_id, plaintext(request_id))
        found = _SEALED[request_id] = (
            sealed.nonce,
            sealed.ciphertext,
            sealed.auth_tag,
            sealed.key_version,
            content_fingerprint(content, request_id, plaintext(request_id)),
            event_correlation(content, request_id),
        )
    return found


def _rows(items: Sequence[Queued]) -> dict[Statement, list[dict[str, Any]]]:
    """The rows each statement writes for ``items`` (in enqueue order)."""
    request_rows, payload_rows, event_rows, entry_rows = [], [], [], []
    heads: dict[Statement, dict[tuple[str, ...], dict[str, Any]]] = {
        queue.LOWER_SESSION_HEAD: {},
        queue.LOWER_AGENT_HEAD: {},
        queue.LOWER_KEY_HEAD: {},
    }
    for item in items:
        spec, now, request_id = item.spec, item.enqueued_at, item.request_id
        nonce, ciphertext, auth_tag, key_version, fingerprint, correlation = _sealed(request_id)
        request_rows.append(
            {
                "request_id": request_id,
                "session_id": spec.session,
                "agent_id": spec.agent,
                "fingerprint": "fp-1",
                "provider": spec.provider,
                "model": spec.model,
                "lane": spec.lane,
                "now": now,
                "deadline_at": now + QUEUE_TIMEOUT_MS,
                "queued_owner_instance_id": None,  # bound below, as each enqueue binds (``_BIND_OWNER``)
                "queued_owner_recorded_at": None,
            }
        )
        event_rows.append(
            {
                "kind": "request_enqueued",
                "from_state": "absent",
                "to_state": "queued",
                "now": now,
                "correlation_hmac": correlation,
            }
        )
        if not spec.payload:
            continue
        payload_rows.append(
            {
                "request_id": request_id,
                "nonce": nonce,
                "ciphertext": ciphertext,
                "auth_tag": auth_tag,
                "key_version": key_version,
                "content_fingerprint": fingerprint,
                "expires_at": now + PAYLOAD_TTL_MS,
                "now": now,
            }
        )
        entry = {
            "request_id": request_id,
            "lane": spec.lane,
            "provider": spec.provider,
            "model": spec.model,
            "agent_id": spec.agent,
            "session_id": spec.session,
            "enqueued_at": now,
        }
        entry_rows.append(entry)
        key = (spec.lane, spec.provider, spec.model)
        for statement, group in (
            (queue.LOWER_SESSION_HEAD, (*key, spec.agent, spec.session)),
            (queue.LOWER_AGENT_HEAD, (*key, spec.agent)),
            (queue.LOWER_KEY_HEAD, key),
        ):
            head = heads[statement].get(group)
            if head is None or (now, request_id) < (head["enqueued_at"], head["request_id"]):
                heads[statement][group] = entry
    return {
        requests.INSERT_REQUEST: request_rows,
        requests.INSERT_PAYLOAD: payload_rows,
        journal.INSERT_EVENT: event_rows,
        queue.INSERT_ENTRY: entry_rows,
        **{statement: list(groups.values()) for statement, groups in heads.items()},
    }


#: Bind every request queued here to the plane's queued owner, as an enqueue's insert binds it.
_BIND_OWNER = (
    "UPDATE turn_requests SET queued_owner_instance_id = {owner}, queued_owner_recorded_at = enqueued_at"
    " WHERE state = 'queued' AND queued_owner_instance_id IS NULL"
)


def bulk_queue(target: str | os.PathLike[str], items: Sequence[Queued], owner_instance_id: str) -> None:
    """Queue ``items`` in one transaction on an SQLite file or a database URL.

    The plane's queued-owner row for ``owner_instance_id`` must exist (the plane writes it
    at its first enqueue); every request is bound to it.
    """
    rows = _rows(items)
    text_target = os.fspath(target)
    if "://" not in text_target:
        from sqlalchemy.dialects import sqlite

        dialect = sqlite.dialect()
        connection = sqlite3.connect(text_target, isolation_level=None)
        try:
            connection.execute("PRAGMA foreign_keys = ON")
            connection.execute("BEGIN IMMEDIATE")
            for statement, values in rows.items():
                sql, defaults = statement.compiled(dialect)
                if values:
                    connection.executemany(sql, [{**defaults, **row} for row in values])
            connection.execute(_BIND_OWNER.format(owner=":owner"), {"owner": owner_instance_id})
            connection.execute("COMMIT")
        finally:
            connection.close()
        return
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    engine = create_engine(text_target, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            for statement, values in rows.items():
                sql, defaults = statement.compiled(engine.dialect)
                if values:
                    connection.exec_driver_sql(sql, [{**defaults, **row} for row in values])
            connection.exec_driver_sql(_BIND_OWNER.format(owner="%(owner)s"), {"owner": owner_instance_id})
        with engine.begin() as connection:
            # What autovacuum does after a table grows this much. It also invalidates the plans the
            # plane's connections cached while the tables were tiny (its statements are prepared on the
            # server at first use): without it a primary-key lookup can stay a sequential scan.
            connection.exec_driver_sql("ANALYZE")
    finally:
        engine.dispose()


#: What enqueue writes, read back in a stable order (IDs and times included; the sealed bytes are random).
_INDEX_QUERIES = {
    "turn_requests": "SELECT request_id, session_id, agent_id, fingerprint, provider, model, state, enqueued_at,"
    " deadline_at, lease_generation, lane, queued_owner_instance_id, queued_owner_recorded_at"
    " FROM turn_requests WHERE state = 'queued' ORDER BY request_id",
    "turn_payloads": "SELECT request_id, key_version, content_fingerprint, expires_at, created_at"
    " FROM turn_payloads ORDER BY request_id",
    "enqueue_events": "SELECT kind, from_state, to_state, occurred_at, correlation_hmac FROM events"
    " WHERE kind = 'request_enqueued' ORDER BY occurred_at, correlation_hmac",
    "queue_entries": "SELECT * FROM queue_entries ORDER BY request_id",
    "queue_sessions": "SELECT * FROM queue_sessions ORDER BY lane, provider, model, agent_id, session_id",
    "queue_agents": "SELECT * FROM queue_agents ORDER BY lane, provider, model, agent_id",
    "queue_keys": "SELECT * FROM queue_keys ORDER BY lane, provider, model",
}


def index_tables(target: str | os.PathLike[str]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row enqueue writes (queued requests, payloads, enqueue events, the admission index)."""
    return {name: read_rows(target, sql) for name, sql in _INDEX_QUERIES.items()}


def index_mismatches(target: str | os.PathLike[str]) -> list[str]:
    """The admission index tables that do not match the queue (``db check``'s comparison, both ways)."""
    return [
        table
        for table, expected, actual in queue.INDEX_CHECKS
        if any(
            read_rows(target, f"SELECT count(*) FROM ({first} EXCEPT {second}) d")[0][0]
            for first, second in ((expected, actual), (actual, expected))
        )
    ]


def activate_queued(plane: AdmissionPlane, request_id: str, now: int) -> None:
    """Admit the queued ``request_id`` (it must be the rule's choice) and take it to ``active``: it keeps its seat."""
    owner = plane.owner_identity.owner_instance_id
    lease = plane.admit_request(request_id, now + 1, owner)
    assert lease is not None
    plane.mark_starting(lease, now + 2)
    assert plane.commit_dispatch_intent(dispatch_record(plane, lease, capture(plane.owner_identity.process.pid))).ok
    plane.mark_active(lease, now + 4)
