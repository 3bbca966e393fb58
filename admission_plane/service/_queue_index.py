"""Keeping the admission index (:mod:`admission_plane.store.statements.queue`) in step with the queue.

A request enters the index when it is queued *and* has its payload (only then may it be
admitted, :mod:`._payloads`), and leaves it when it leaves the queue (every such edge goes
through :func:`admission_plane.service._transitions.change`) or loses its payload, in the
same transaction as the change that causes either. ``db check`` verifies the index against the queue
(:data:`admission_plane.store.statements.queue.INDEX_CHECKS`). On PostgreSQL each chain below is one
call of a session function running the same statements (:mod:`admission_plane.store.session_functions`).
"""

from __future__ import annotations

from ..store.rows import EntryRow
from ..store.statements.queue import (
    DELETE_ENTRY,
    DROP_AGENT,
    DROP_KEY,
    DROP_SESSION,
    INSERT_ENTRY,
    LOWER_AGENT_HEAD,
    LOWER_KEY_HEAD,
    LOWER_SESSION_HEAD,
    MOVE_AGENT_HEAD,
    MOVE_KEY_HEAD,
    MOVE_SESSION_HEAD,
    QUEUE_ADD,
    QUEUE_REMOVE,
    SELECT_ENTRY,
)
from ..store.tx import Statement, Tx

_LEVELS = ((DROP_SESSION, MOVE_SESSION_HEAD), (DROP_AGENT, MOVE_AGENT_HEAD), (DROP_KEY, MOVE_KEY_HEAD))


def add(tx: Tx, request_id: str, entry: EntryRow) -> None:
    """Index a queued request that just got its payload: one row, and each group's head if it is older."""
    params = add_params(request_id, entry)
    if tx.functions:
        tx.send(QUEUE_ADD, params)  # the same chain, on the server
        return
    tx.execute(INSERT_ENTRY, params)
    lower: Statement
    for lower in (LOWER_SESSION_HEAD, LOWER_AGENT_HEAD, LOWER_KEY_HEAD):
        # A group whose head is older than the entry keeps it, and so does every group above it.
        if tx.execute(lower, params) == 0:
            return


def remove(tx: Tx, request_id: str, entry: EntryRow | None = None) -> None:
    """Take a request that leaves the queue out of the index (nothing if it had no payload)."""
    if tx.functions:
        tx.send(QUEUE_REMOVE, {"request_id": request_id})  # the same chain, on the server
        return
    if entry is None:
        entry = tx.one(SELECT_ENTRY, {"request_id": request_id})
        if entry is None:
            return
    tx.execute(DELETE_ENTRY, {"request_id": request_id})
    group = {**_entry_params(entry), "departed": request_id}
    for drop, move in _LEVELS:
        # An emptied group goes (its parent's head was the departed request too, so go on up);
        # else its head moves on, and the parent's head moves only if it was the departed request.
        if tx.execute(drop, group) == 0 and tx.execute(move, group) == 0:
            return  # the request was not this group's head, so no group above has it as head either


def add_params(request_id: str, entry: EntryRow) -> dict[str, object]:
    """The parameters of :data:`~admission_plane.store.statements.queue.QUEUE_ADD` (and ``INSERT_ENTRY``)."""
    return {"request_id": request_id, **_entry_params(entry), "enqueued_at": entry.enqueued_at}


def _entry_params(entry: EntryRow) -> dict[str, str]:
    return {
        "lane": entry.lane,
        "provider": entry.provider,
        "model": entry.model,
        "agent_id": entry.agent_id,
        "session_id": entry.session_id,
    }
