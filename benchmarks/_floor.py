"""The floor: the service's six lifecycle transactions, written with the plain ``sqlite3`` module.

Same SQL text (each statement is taken from :mod:`admission_plane.store.statements`, compiled for
SQLite exactly as the service compiles it), same order, same parameters, same branches
on the rows read, same transaction shape (a cursor per transaction, ``BEGIN IMMEDIATE``
... ``COMMIT``) and the same connection pragmas. What it leaves out is everything that
is not database work: input validation, payload sealing, the HMACs of the content
fingerprint and the journal correlation, value objects and SQLAlchemy's pool and
connection wrappers. The ratio of our path to this floor is therefore the share of a
turn that goes to the database and the driver; ``tests``-style honesty check:
:func:`benchmarks.test_floor.test_floor_issues_the_service_statements` compares the two
statement sequences.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from sqlalchemy.dialects import sqlite

from admission_plane.evidence import ConnectorIdentity, ProcessIdentity
from admission_plane.states import START_WINDOW_PHASES
from admission_plane.store.rows import IdentityRow
from admission_plane.store.statements import (
    admission,
    dispatch,
    journal,
    leases,
    policy,
    queue,
    requests,
    transitions,
)
from admission_plane.store.tx import Statement

_DIALECT = sqlite.dialect()
PRAGMAS = (
    "PRAGMA foreign_keys = ON",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = FULL",
    "PRAGMA busy_timeout = 5000",
)
_CORRELATION = "c" * 64
_FINGERPRINT = "f" * 64
_NONCE, _TAG = bytes(12), bytes(16)


def connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A connection configured as the service configures its own (see ``admission_plane.store.engine``)."""
    connection = sqlite3.connect(os.fspath(path), isolation_level=None, check_same_thread=False, timeout=5.0)
    for pragma in PRAGMAS:
        connection.execute(pragma)
    return connection


class FloorConnector:
    """One connector's lifecycle operations on one plain ``sqlite3`` connection.

    ``trace``, when given, receives the SQL text of every statement (as the service's
    ``Tx`` would run it), for the statement-sequence check.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        connector: ConnectorIdentity,
        child: ProcessIdentity,
        host_id: str,
        trace: Callable[[str], object] | None = None,
    ) -> None:
        self.connection = connect(path)
        self.owner = connector.owner_instance_id
        self.host_id = host_id
        self._owner_recorded = False
        process = connector.process
        self._owner_values = {
            "owner_instance_id": connector.owner_instance_id,
            "created_at": connector.created_at,
            "boot_id": process.boot_id,
            "pid": process.pid,
            "start_time_ticks": process.start_time_ticks,
            "pid_namespace_inode": process.pid_namespace_inode,
            "ppid": process.ppid,
            "pgrp": process.pgrp,
            "session": process.session,
        }
        self._identity_tail = (
            "stdin",
            connector.owner_instance_id,
            connector.created_at,
            process.boot_id,
            process.pid,
            process.start_time_ticks,
            process.pid_namespace_inode,
            process.ppid,
            process.pgrp,
            process.session,
            child.boot_id,
            child.pid,
            child.start_time_ticks,
            child.pid_namespace_inode,
            child.ppid,
            child.pgrp,
            child.session,
        )
        self._trace = trace
        self._cursor: Any = None

    def close(self) -> None:
        """Close the connection."""
        self.connection.close()

    # --- the driver-level twin of ``admission_plane.store.tx.Tx`` -------------------------------------

    def _begin(self, mode: str = "BEGIN IMMEDIATE") -> None:
        self._cursor = self.connection.cursor()
        self._cursor.execute(mode)

    def _commit(self) -> None:
        self._cursor.close()
        self.connection.commit()

    def _run(self, statement: Statement, params: Mapping[str, Any] | None = None) -> Any:
        sql, defaults = statement.compiled(_DIALECT)
        if defaults:
            params = {**defaults, **params} if params else defaults
        if self._trace is not None:
            self._trace(sql)
        cursor = self._cursor
        cursor.execute(sql, params or {})
        return cursor

    def _one(self, statement: Statement, params: Mapping[str, Any] | None = None) -> Any:
        return self._run(statement, params).fetchone()

    def _scalar(self, statement: Statement, params: Mapping[str, Any] | None = None) -> Any:
        row = self._one(statement, params)
        return None if row is None else row[0]

    def _execute(self, statement: Statement, params: Mapping[str, Any] | None = None) -> int:
        return self._run(statement, params).rowcount

    def _journal(self, kind: str, from_state: str, to_state: str, now: int) -> None:
        self._execute(
            journal.INSERT_EVENT,
            {
                "kind": kind,
                "from_state": from_state,
                "to_state": to_state,
                "now": now,
                "correlation_hmac": _CORRELATION,
            },
        )

    # --- the six transactions ------------------------------------------------------------------------

    def enqueue(self, request_id: str, agent_id: str, now: int) -> None:
        """``enqueue_with_payload`` of a new request: the request, its owner, its payload, its index entry."""
        self._begin()
        assert self._one(policy.SELECT_POLICY) is None
        # Inserted first, with no read before it: the stored request is read only on a conflict or a refusal.
        inserted = self._execute(
            requests.INSERT_REQUEST,
            {
                "request_id": request_id,
                "session_id": "session-1",
                "agent_id": agent_id,
                "fingerprint": "fp-1",
                "provider": "antigravity",
                "model": "model-bench",
                "lane": "default",
                "now": now,
                "deadline_at": now + 1_800_000,
                "queued_owner_instance_id": self.owner,  # bound to its connector by the insert
                "queued_owner_recorded_at": now,
            },
        )
        assert inserted == 1
        self._journal("request_enqueued", "absent", "queued", now)
        # The plane reads its own connector record until it has seen it committed (its first admission
        # does), then never again.
        if not self._owner_recorded:
            if self._one(requests.SELECT_QUEUED_OWNER, {"owner_instance_id": self.owner}) is None:
                self._execute(requests.INSERT_QUEUED_OWNER, {**self._owner_values, "now": now, "host_id": self.host_id})
            self._owner_recorded = True
        self._execute(
            requests.INSERT_PAYLOAD,
            {
                "request_id": request_id,
                "nonce": _NONCE,
                "ciphertext": request_id.encode(),
                "auth_tag": _TAG,
                "key_version": 1,
                "content_fingerprint": _FINGERPRINT,
                "expires_at": now + 1_800_001,
                "now": now,
            },
        )
        # A request this transaction created: its place in the index is what it just wrote.
        entry = {
            "request_id": request_id,
            "lane": "default",
            "provider": "antigravity",
            "model": "model-bench",
            "agent_id": agent_id,
            "session_id": "session-1",
            "enqueued_at": now,
        }
        self._execute(queue.INSERT_ENTRY, entry)
        for lower in (queue.LOWER_SESSION_HEAD, queue.LOWER_AGENT_HEAD, queue.LOWER_KEY_HEAD):
            if self._execute(lower, entry) == 0:
                break
        self._commit()

    def _choose(self, now: int) -> tuple[str, int]:
        """The admission rule's friendly case: capacity, then the first idle agent's head in the only key.

        What the rule reads (``service._selection``): the policy, the seat-holding leases,
        the active cooldowns and the pauses; the lanes' keys; a page of the key's agents in
        head order; the chosen request. With no start interval no start is read.
        """
        assert self._one(policy.SELECT_POLICY) is None
        seats = self._run(queue.SELECT_SEATS).fetchall()
        assert len(seats) < 8
        busy_agents = {seat[4] for seat in seats}
        reserved = [seat[1] for seat in seats if seat[0] in START_WINDOW_PHASES]
        assert len(reserved) < 8
        assert self._run(queue.SELECT_ACTIVE_COOLDOWNS, {"now": now}).fetchall() == []
        assert self._run(queue.SELECT_PAUSES).fetchall() == []
        ((lane, provider, model, _, _),) = self._run(queue.SELECT_KEYS).fetchall()
        # No minimum start interval: nothing to space out, so neither the reservations' stamps nor the
        # latest start hold anything back, and the latest start is not read.
        page = self._run(
            queue.AGENT_PAGE,
            {
                "lane": lane,
                "provider": provider,
                "model": model,
                "after_enqueued_at": -1,
                "after_request_id": "",
                "page": 8,
            },
        ).fetchall()
        request_id = next(head for agent, _, head in page if agent not in busy_agents)
        candidate = self._one(admission.SELECT_CANDIDATE, {"request_id": request_id})
        assert candidate is not None
        return candidate[0], candidate[1]

    def _unindex(self, request_id: str) -> None:
        """Take the admitted request out of the admission index (``service._queue_index.remove``)."""
        lane, provider, model, agent, session, _ = self._one(queue.SELECT_ENTRY, {"request_id": request_id})
        self._execute(queue.DELETE_ENTRY, {"request_id": request_id})
        group = {
            "lane": lane,
            "provider": provider,
            "model": model,
            "agent_id": agent,
            "session_id": session,
            "departed": request_id,
        }
        for drop, move in (
            (queue.DROP_SESSION, queue.MOVE_SESSION_HEAD),
            (queue.DROP_AGENT, queue.MOVE_AGENT_HEAD),
            (queue.DROP_KEY, queue.MOVE_KEY_HEAD),
        ):
            # An emptied group goes (and its parent's head was the request too); else its head moves
            # on; a group whose head was another request stops the walk.
            if self._execute(drop, group) == 0 and self._execute(move, group) == 0:
                return

    def admit_next(self, now: int) -> tuple[str, str, int]:
        """``admit_next``: the admission in one writing transaction: (lease, request, generation)."""
        self._begin()
        assert self._run(admission.SELECT_EXPIRED, {"now": now}).fetchall() == []
        request_id, previous_generation = self._choose(now)
        generation = previous_generation + 1
        lease_id = str(uuid.uuid4())
        params = {
            "lease_id": lease_id,
            "request_id": request_id,
            "generation": generation,
            "owner_instance_id": self.owner,
            "source": "queued",
            "target": "admitted",
            "now": now,
        }
        assert self._execute(transitions.RESERVE_REQUEST, params) == 1
        self._execute(transitions.INSERT_LEASE, params)
        self._unindex(request_id)
        self._journal("request_admitted", "queued", "admitted", now)
        self._commit()
        return lease_id, request_id, generation

    def _lease(self, lease_id: str, generation: int) -> tuple[str, str, int, str, str]:
        lease = self._one(leases.SELECT_LEASE, {"lease_id": lease_id})
        assert lease is not None
        *fence, charged = lease  # ``charged``: a budget reservation (none here: no budget)
        _, _, lease_generation, owner, _ = fence
        assert (lease_generation, owner, bool(charged)) == (generation, self.owner, False)
        return tuple(fence)  # type: ignore[return-value]

    def _move(self, lease: tuple[str, str, int, str, str], target: str, kind: str, now: int) -> None:
        lease_id, request_id, generation, owner, phase = lease
        fence = {"lease_id": lease_id, "owner_instance_id": owner, "generation": generation, "phase": phase, "now": now}
        assert self._execute(transitions.SET_LEASE_PHASE, {**fence, "source": phase, "target": target}) == 1
        assert (
            self._execute(
                transitions.SET_REQUEST_STATE,
                {"request_id": request_id, "generation": generation, "now": now, "source": phase, "target": target},
            )
            == 1
        )
        if target == "active":
            self._execute(transitions.DELETE_PAYLOAD, {"request_id": request_id})
        self._journal(kind, phase, target, now)

    def mark_starting(self, lease_id: str, generation: int, now: int) -> None:
        """``mark_starting`` (minimum start interval 0)."""
        self._begin()
        lease = self._lease(lease_id, generation)
        assert lease[4] == "admitted"
        assert self._one(policy.SELECT_POLICY) is None
        assert self._scalar(leases.COUNT_STARTING_LEASES) < 8
        # No minimum interval: there is nothing to space out, so the latest start is not read.
        self._move(lease, "starting", "request_starting", now)
        self._execute(leases.DELETE_OLD_STARTS, {"cutoff": now})
        self._execute(leases.INSERT_START, {"lease_id": lease_id, "now": now})
        self._commit()

    def commit_dispatch_intent(self, lease_id: str, request_id: str, generation: int, now: int) -> None:
        """``commit_dispatch_intent`` with the connector's and the child's process identity."""
        self._begin()
        # The lease and whether process evidence exists for it, in one read.
        found = self._one(dispatch.SELECT_LEASE_FOR_DISPATCH, {"lease_id": lease_id})
        assert found is not None
        *fence, charged, identified = found
        assert (fence[2], fence[3], bool(charged), bool(identified)) == (generation, self.owner, False, False)
        lease: tuple[str, str, int, str, str] = tuple(fence)  # type: ignore[assignment]
        assert lease[4] == "starting"
        self._move(lease, "dispatch_intent", "request_dispatch_intent", now)
        values = (request_id, generation, self.owner, *self._identity_tail)
        names = [field.name for field in attrs.fields(IdentityRow)]
        self._execute(
            dispatch.INSERT_IDENTITY,
            {"lease_id": lease_id, "now": now, "host_id": self.host_id, **dict(zip(names, values, strict=True))},
        )
        self._commit()

    def mark_active(self, lease_id: str, generation: int, now: int) -> None:
        """``mark_active``: the payload is deleted in the same transaction."""
        self._begin()
        lease = self._lease(lease_id, generation)
        assert lease[4] == "dispatch_intent"
        self._move(lease, "active", "request_active", now)
        self._commit()

    def complete(self, lease_id: str, generation: int, now: int) -> None:
        """``complete_live_turn`` with outcome ``completed``."""
        self._begin()
        lease = self._lease(lease_id, generation)
        assert lease[4] == "active"
        request_id = lease[1]  # not a capacity failure: the request's provider and model are not read
        request = {"request_id": request_id, "generation": generation, "now": now}
        assert (
            self._execute(transitions.SET_REQUEST_STATE, {**request, "source": "active", "target": "provider_terminal"})
            == 1
        )
        self._journal("request_provider_terminal", "active", "provider_terminal", now)
        fence = {
            "lease_id": lease_id,
            "owner_instance_id": self.owner,
            "generation": generation,
            "phase": "active",
            "now": now,
        }
        assert self._execute(transitions.DELETE_LEASE, fence) == 1
        assert (
            self._execute(
                transitions.END_LEASED_REQUEST, {**request, "source": "provider_terminal", "target": "completed"}
            )
            == 1
        )
        self._execute(transitions.DELETE_PAYLOAD, {"request_id": request_id})
        self._journal("request_released", "provider_terminal", "completed", now)
        assert self._one(policy.SELECT_POLICY) is None
        self._commit()

    def turn(self, request_id: str, now: int) -> None:
        """One full turn: the six transactions."""
        self.enqueue(request_id, "agent-0", now)
        lease_id, admitted, generation = self.admit_next(now + 1)
        assert admitted == request_id
        self.mark_starting(lease_id, generation, now + 2)
        self.commit_dispatch_intent(lease_id, request_id, generation, now + 3)
        self.mark_active(lease_id, generation, now + 4)
        self.complete(lease_id, generation, now + 5)


def raw_commit(connection: sqlite3.Connection, value: int) -> None:
    """The smallest durable write transaction: one row into ``probe``."""
    connection.execute("BEGIN IMMEDIATE")
    connection.execute("INSERT INTO probe (v) VALUES (?)", (value,))
    connection.commit()


def raw_commit_connection(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A connection with the service's pragmas on a fresh file holding only ``probe``."""
    connection = connect(path)
    connection.execute("CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
    return connection
