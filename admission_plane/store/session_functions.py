"""PostgreSQL: what each pooled connection is given when the pool opens it: generic plans and no bitmap scans
for the plane's prepared statements (:data:`GENERIC_PLANS`), the admission index's chains of statements as one
server-side call each, and the checks of a lease edge sent with its unit's commit (:data:`_EXPECT_EDGE`,
:data:`_EXPECT_SENT`).

Why: keeping the admission index (:mod:`admission_plane.store.statements.queue`) in step is a
chain of statements, each deciding whether the next runs (a group's head is lowered, or moved
on, only while the level below changed). On PostgreSQL each is a round trip and a turn of the
driver's Python, about a tenth of a turn's statements. The two functions below run the same
chains on the server, statement for statement and in the same order as
:func:`admission_plane.service._queue_index.add` and ``remove``, so one call replaces each chain
(:data:`admission_plane.store.statements.queue.QUEUE_ADD` and ``QUEUE_REMOVE``).

Why ``pg_temp`` and not the schema: they are created per connection, when the pool opens it, in
the connection's own temporary schema, from the text in this module. So the functions a
connection runs always come from the same library version as the statements around them
(two versions of the library may share one database during a rolling upgrade), nothing is
installed that a migration would have to track or the schema check verify, and a database
administrator's schema holds the tables only. A connection that cannot create them (a
read-only role, a transaction pooler that does not keep session state: pass
``connect_args={"prepare_threshold": None}`` there, which turns them off too) runs the
statements one by one, as SQLite does; :attr:`admission_plane.store.tx.Tx.functions` says which applies.
"""

from __future__ import annotations

import logging
from typing import Any

from ..states import SEAT_PHASES, START_WINDOW_PHASES, DrainState, RequestState
from . import group_commit

__all__ = ["FENCE_REFUSED", "FUNCTIONS_KEY", "INSTALL", "REQUEST_DIVERGED", "SENT_REFUSED", "install"]

_IDLE = 0  # libpq's PQTRANS_IDLE
#: The pool record's ``info`` key that says whether a connection holds the functions.
FUNCTIONS_KEY = "admission_plane_session_functions"

_LOG = logging.getLogger(__name__)

_KEY = "g.lane = p_lane AND g.provider = p_provider AND g.model = p_model"
_AGENT = f"{_KEY} AND g.agent_id = p_agent"
_SESSION = f"{_AGENT} AND g.session_id = p_session"


def _lower(table: str, columns: str, values: str, conflict: str, last: bool) -> str:
    """Insert a group's head, or lower it to the new entry when that is older; stop when unchanged."""
    stop = "" if last else "\n  IF NOT FOUND THEN RETURN; END IF;"
    return (
        f"\n  INSERT INTO {table} AS g ({columns}, head_enqueued_at, head_request_id)"
        f"\n    VALUES ({values}, p_at, p_request)"
        f"\n    ON CONFLICT ({conflict}) DO UPDATE SET head_enqueued_at = p_at, head_request_id = p_request"
        f"\n    WHERE (p_at, p_request) < (g.head_enqueued_at, g.head_request_id);{stop}"
    )


_ADD = (
    "CREATE OR REPLACE FUNCTION pg_temp.admission_plane_queue_add("
    "p_request text, p_lane text, p_provider text, p_model text, p_agent text, p_session text, p_at bigint) "
    "RETURNS void LANGUAGE plpgsql AS $fn$\nBEGIN"
    "\n  INSERT INTO queue_entries (request_id, lane, provider, model, agent_id, session_id, enqueued_at)"
    "\n    VALUES (p_request, p_lane, p_provider, p_model, p_agent, p_session, p_at);"
    + _lower(
        "queue_sessions",
        "lane, provider, model, agent_id, session_id",
        "p_lane, p_provider, p_model, p_agent, p_session",
        "lane, provider, model, agent_id, session_id",
        False,
    )
    + _lower(
        "queue_agents",
        "lane, provider, model, agent_id",
        "p_lane, p_provider, p_model, p_agent",
        "lane, provider, model, agent_id",
        False,
    )
    + _lower("queue_keys", "lane, provider, model", "p_lane, p_provider, p_model", "lane, provider, model", True)
    + "\nEND\n$fn$"
)


def _level(table: str, group: str, members: str, in_group: str, at: str, request: str, last: bool) -> str:
    """A group whose head departed: dropped if empty, else its head moved on; stop when neither happened."""
    oldest = f"SELECT m.{at}, m.{request} FROM {members} m WHERE {in_group} ORDER BY m.{at}, m.{request} LIMIT 1"
    stop = "" if last else "\n    IF NOT FOUND THEN RETURN; END IF;"
    return (
        f"\n  DELETE FROM {table} g WHERE {group} AND g.head_request_id = p_request"
        f"\n    AND NOT EXISTS (SELECT 1 FROM {members} m WHERE {in_group});"
        f"\n  IF NOT FOUND THEN"
        f"\n    UPDATE {table} g SET (head_enqueued_at, head_request_id) = ({oldest})"
        f"\n      WHERE {group} AND g.head_request_id = p_request;{stop}"
        f"\n  END IF;"
    )


def _members(*columns: str) -> str:
    return " AND ".join(f"m.{column} = g.{column}" for column in columns)


_REMOVE = (
    "CREATE OR REPLACE FUNCTION pg_temp.admission_plane_queue_remove(p_request text) "
    "RETURNS void LANGUAGE plpgsql AS $fn$\nDECLARE"
    "\n  p_lane text; p_provider text; p_model text; p_agent text; p_session text;\nBEGIN"
    "\n  DELETE FROM queue_entries WHERE request_id = p_request"
    "\n    RETURNING lane, provider, model, agent_id, session_id INTO p_lane, p_provider, p_model, p_agent, p_session;"
    "\n  IF NOT FOUND THEN RETURN; END IF;"
    + _level(
        "queue_sessions",
        _SESSION,
        "queue_entries",
        _members("lane", "provider", "model", "agent_id", "session_id"),
        "enqueued_at",
        "request_id",
        False,
    )
    + _level(
        "queue_agents",
        _AGENT,
        "queue_sessions",
        _members("lane", "provider", "model", "agent_id"),
        "head_enqueued_at",
        "head_request_id",
        False,
    )
    + _level(
        "queue_keys",
        _KEY,
        "queue_agents",
        _members("lane", "provider", "model"),
        "head_enqueued_at",
        "head_request_id",
        True,
    )
    + "\nEND\n$fn$"
)

#: ``SQLSTATE`` of :data:`_EXPECT_EDGE`'s refusals: the lease's fence (``..001``) and a request that diverged
#: from its lease (``..002``), turned into the library's errors by :func:`admission_plane.store.unit_of_work.run`.
FENCE_REFUSED, REQUEST_DIVERGED = "AP001", "AP002"
#: A lease edge's checks on the server, for an edge sent with its unit's commit: raise (so nothing commits)
#: unless exactly one lease and one request changed (``store.statements.transitions.sent_edge``).
_EXPECT_EDGE = (
    "CREATE OR REPLACE FUNCTION pg_temp.admission_plane_expect_edge(p_leases bigint, p_requests bigint, "
    "p_target text) RETURNS void LANGUAGE plpgsql AS $fn$\nBEGIN"
    f"\n  IF p_leases <> 1 THEN RAISE EXCEPTION USING ERRCODE = '{FENCE_REFUSED}',"
    " MESSAGE = 'lease fence does not match'; END IF;"
    f"\n  IF p_requests <> 1 THEN RAISE EXCEPTION USING ERRCODE = '{REQUEST_DIVERGED}',"
    " MESSAGE = 'lease and request state diverged at ' || p_target; END IF;"
    "\nEND\n$fn$"
)

#: ``SQLSTATE`` of :data:`_EXPECT_SENT`'s refusal: a unit sent whole with its commit found the database
#: otherwise than it assumed; nothing committed, and the operation runs again the long way (reading first).
SENT_REFUSED = "AP003"
#: The check of a unit sent whole with its commit (``store.statements.transitions.sent_move``): raise, so
#: nothing commits, unless everything the unit assumed held (``p_held``).
_EXPECT_SENT = (
    "CREATE OR REPLACE FUNCTION pg_temp.admission_plane_expect_sent(p_held boolean) RETURNS void"
    " LANGUAGE plpgsql AS $fn$\nBEGIN"
    f"\n  IF p_held IS NOT TRUE THEN RAISE EXCEPTION USING ERRCODE = '{SENT_REFUSED}',"
    " MESSAGE = 'the unit sent with its commit does not apply; run it reading first'; END IF;"
    "\nEND\n$fn$"
)


def _in(values: frozenset[str]) -> str:
    return "(" + ", ".join(f"'{value}'" for value in sorted(values)) + ")"


#: The seat-holding leases (``SEAT_PHASES``) with their requests' agents, and those inside the start window. Each
#: request is read by its key, one lease at a time (``LATERAL ... LIMIT 1``, which the planner cannot turn into a
#: hash join): as a plain join, a plan made while ``turn_requests`` was small (a new database, before its first
#: ``ANALYZE``) scanned the whole table, every request ever queued, for each admission
#: (``store.statements.queue.SELECT_SEATS`` says more).
_SEATS = (
    "FROM leases l CROSS JOIN LATERAL (SELECT r.agent_id FROM turn_requests r WHERE r.request_id = l.request_id"
    f" LIMIT 1) r WHERE l.phase IN {_in(frozenset(map(str, SEAT_PHASES)))}"
)
_STARTING = f"l.phase IN {_in(frozenset(map(str, START_WINDOW_PHASES)))}"
_COOLING = "c.provider = {0}.provider AND c.model = {0}.model AND c.not_before > p_now"
_KEY_PAUSED = "p.lane = '' AND p.provider <> '' AND p.provider = {0}.provider AND p.model = {0}.model"
#: The earliest deadline of a queued request that has passed (``NULL``: none), one step of
#: ``turn_requests_state_deadline``: a generic plan of "any queued row with ``deadline_at <= p_now``" scans the queue
#: (``statements.admission.ANY_EXPIRED`` says why, and why the range stays).
EARLIEST_PASSED_DEADLINE = (
    f"(SELECT min(deadline_at) FROM turn_requests WHERE state = '{RequestState.QUEUED}' AND deadline_at <= p_now)"
)
#: Whether a waiter's request may take a seat now, decided on the server under the admission gate, for an
#: admission sent whole with its commit (``store.statements.transitions.SENT_BLIND_ADMIT``, chosen by
#: :func:`admission_plane.service._admission.blind_applies`). It is the rule's answer for the case the rule
#: decides from the idle agents ahead alone (:func:`admission_plane.service._selection.rank_among_idle` and
#: ``parallel_choice``), and ``false`` for every other case, which the caller then takes the long way:
#:
#: * the durable policy is the revision the caller assumed (``p_revision``; its limits are simple: no keyed or
#:   session limit, no budget, no start interval, which the caller checked), and nothing is draining;
#: * no queued request is past its deadline (the long way times them out first);
#: * the request is in the admission index (queued, with its payload), and the index holds its lane only;
#: * at most ``p_horizon`` keys of its lane have their head before it (cooling and paused ones included);
#: * nothing is paused for everything, its lane or its key, its key is not cooling down, its agent holds no seat;
#: * the agents holding no seat whose head, in an open key of the lane, is before the request: fewer than
#:   ``p_horizon`` rows of them, its own agent not among them, and free seats and start slots for each of them
#:   and for it (``p_parallel``: a waiter, admitted beside them); without ``p_parallel``, none of them (the rule's
#:   own choice).
#:
#: What it reads is bounded whatever the queue's depth: the lanes queued are the first and the last of the keys'
#: index, the keys ahead one range of it (at most ``p_horizon`` + 1 read), and per key at most ``p_horizon`` agent
#: heads past the ones holding seats; a queue with more keys ahead is left to the long way.
#: ``tests/admission/database/test_blind_admission.py`` holds it to the rule.
_BLIND_DECLARE = (
    "p_now bigint, p_revision bigint, p_default_seats bigint, p_max_starts bigint, p_parallel boolean, "
    "p_horizon bigint) RETURNS boolean LANGUAGE plpgsql AS $fn$\nDECLARE"
    "\n  x queue_entries; v_revision bigint; v_drain text; v_limit bigint; v_seats bigint; v_starts bigint;"
    "\n  v_seated text[]; v_rows bigint; v_agents bigint; v_mine boolean;\nBEGIN"
)
_BLIND_POLICY = (
    "\n  SELECT revision, drain_state, max_active_turns INTO v_revision, v_drain, v_limit FROM policy_state LIMIT 1;"
    "\n  IF NOT FOUND THEN"
    "\n    IF p_revision <> 0 THEN RETURN false; END IF;"
    "\n    v_limit := p_default_seats;"
    f"\n  ELSIF v_revision IS DISTINCT FROM p_revision OR v_drain IS DISTINCT FROM '{DrainState.STEADY}' THEN"
    "\n    RETURN false;"
    "\n  END IF;"
    f"\n  IF {EARLIEST_PASSED_DEADLINE} IS NOT NULL THEN RETURN false; END IF;"
)
_BLIND_RULE = (
    "\n  IF (SELECT min(k.lane) FROM queue_keys k) < x.lane OR (SELECT max(k.lane) FROM queue_keys k) > x.lane THEN"
    "\n    RETURN false;"
    "\n  END IF;"
    "\n  IF (SELECT count(*) FROM (SELECT 1 FROM queue_keys k WHERE k.lane = x.lane"
    "\n        AND (k.head_enqueued_at, k.head_request_id) < (x.enqueued_at, x.request_id) LIMIT p_horizon + 1) ahead)"
    "\n      > p_horizon THEN RETURN false; END IF;"
    "\n  IF EXISTS (SELECT 1 FROM admission_pauses p WHERE p.lane = x.lane OR (p.lane = '' AND p.provider = '')"
    f" OR ({_KEY_PAUSED.format('x')})) THEN RETURN false; END IF;"
    f"\n  IF EXISTS (SELECT 1 FROM cooldowns c WHERE {_COOLING.format('x')}) THEN RETURN false; END IF;"
    f"\n  SELECT count(*), count(*) FILTER (WHERE {_STARTING}), coalesce(array_agg(r.agent_id), '{{}}')"
    f"\n    INTO v_seats, v_starts, v_seated {_SEATS};"
    "\n  IF x.agent_id = ANY(v_seated) OR NOT (least(v_limit - v_seats, p_max_starts - v_starts) >= 1) THEN"
    "\n    RETURN false;"
    "\n  END IF;"
    "\n  SELECT count(*), count(DISTINCT a.agent_id), coalesce(bool_or(a.agent_id = x.agent_id), false)"
    "\n    INTO v_rows, v_agents, v_mine"
    "\n    FROM (SELECT ahead.agent_id FROM queue_keys k CROSS JOIN LATERAL ("
    "\n      SELECT qa.agent_id FROM queue_agents qa"
    "\n        WHERE qa.lane = k.lane AND qa.provider = k.provider AND qa.model = k.model"
    "\n          AND (qa.head_enqueued_at, qa.head_request_id) < (x.enqueued_at, x.request_id)"
    "\n          AND qa.agent_id <> ALL(v_seated)"
    "\n        ORDER BY qa.head_enqueued_at, qa.head_request_id LIMIT p_horizon) ahead"
    "\n      WHERE k.lane = x.lane AND (k.head_enqueued_at, k.head_request_id) < (x.enqueued_at, x.request_id)"
    f"\n        AND NOT EXISTS (SELECT 1 FROM cooldowns c WHERE {_COOLING.format('k')})"
    f"\n        AND NOT EXISTS (SELECT 1 FROM admission_pauses p WHERE {_KEY_PAUSED.format('k')})"
    "\n      LIMIT p_horizon) a;"
    "\n  RETURN v_rows < p_horizon AND NOT v_mine AND (p_parallel OR v_agents = 0)"
    "\n    AND least(v_limit - v_seats, p_max_starts - v_starts) >= v_agents + 1;"
    "\nEND\n$fn$"
)
_BLIND_ADMISSIBLE = (
    "CREATE OR REPLACE FUNCTION pg_temp.admission_plane_blind_admissible(p_request text, "
    + _BLIND_DECLARE
    + _BLIND_POLICY
    + (
        "\n  SELECT * INTO x FROM queue_entries WHERE request_id = p_request;"
        "\n  IF NOT FOUND THEN RETURN false; END IF;"
    )
    + _BLIND_RULE
)
#: ``admission_plane_blind_admissible`` for a request its own unit has just queued with its payload and not yet
#: put in the admission index (an enqueue that tries its admission, ``SENT_BLIND_TRY``): its place is given
#: (lane, key, agent, enqueue time) instead of read. The answer is the one the first function gives once the
#: request is in the index: every comparison with the index is strictly before the request's own place, and the
#: entry changes no group's head before it (``test_blind_admission`` holds the two to each other). The
#: statement puts the request in the index only when the answer is no, so an enqueue admitted at once never
#: writes and deletes its index rows in one transaction.
_BLIND_ADMISSIBLE_NEW = (
    "CREATE OR REPLACE FUNCTION pg_temp.admission_plane_blind_admissible_new(p_request text, p_lane text, "
    "p_provider text, p_model text, p_agent text, p_at bigint, "
    + _BLIND_DECLARE
    + _BLIND_POLICY
    + (
        "\n  x.request_id := p_request; x.lane := p_lane; x.provider := p_provider; x.model := p_model;"
        "\n  x.agent_id := p_agent; x.enqueued_at := p_at;"
    )
    + _BLIND_RULE
)

#: Every statement of the plane is prepared on the server once per connection (``prepare_threshold=0``),
#: and its tables are small and keyed: a generic plan serves each execution as well as a fresh one.
#: PostgreSQL would plan each of the first executions again, and keeps doing so when it estimates a
#: generic plan dearer (planning the admission's one-statement read costs twice its execution).
#: No bitmap scans: the hot tables churn (a lease is inserted, moved three times and deleted every turn),
#: so their indexes hold an entry for every dead row version since the last vacuum. A bitmap scan walks
#: all of them on every execution (the seat and start-window counts read 9 000-12 000 entries for one live
#: lease in a 3 s benchmark window); a plain or index-only btree scan marks the dead ones as it meets them
#: and skips them after. Measured, same windows: P = 1 x1.06, P = 8 x1.07 turns/s; the adversarial depth
#: benchmarks on PostgreSQL unchanged (median ratio 1.03 over 92 cases, no case slower on a re-run).
GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan; SET enable_bitmapscan = off"
#: The text that creates the functions on a connection (one round trip, the simple query protocol).
INSTALL = f"{_ADD}; {_REMOVE}; {_EXPECT_EDGE}; {_EXPECT_SENT}; {_BLIND_ADMISSIBLE}; {_BLIND_ADMISSIBLE_NEW}"


def install(dbapi_connection: Any, record: Any) -> None:
    """Create the functions on a new PostgreSQL connection; remember in ``record.info`` whether that worked.

    Never raises for the connection's sake: a connection already inside a transaction (another ``connect``
    listener ran a query first) or one that refuses the creation is simply marked without them.
    """
    record.info[FUNCTIONS_KEY] = False
    record.info[group_commit.POSTGRES_FLUSH_INFO] = False
    autocommit = dbapi_connection.autocommit
    if not autocommit and dbapi_connection.info.transaction_status != _IDLE:
        _LOG.debug("admission index functions not created (connection in a transaction); using statements")
        return
    try:
        dbapi_connection.autocommit = True
        dbapi_connection.execute(GENERIC_PLANS, prepare=False)
        dbapi_connection.execute(INSTALL, prepare=False)
    except dbapi_connection.Error as error:  # a read-only role, a pooler without session state: statements then
        _LOG.debug("admission index functions not created (%s); using statements", type(error).__name__)
    else:
        record.info[FUNCTIONS_KEY] = True
        try:
            record.info[group_commit.POSTGRES_FLUSH_INFO] = group_commit.postgres_flush_allowed(dbapi_connection)
        except dbapi_connection.Error as error:
            _LOG.debug("gated commits flushed under their gate (%s)", type(error).__name__)
    finally:
        dbapi_connection.autocommit = autocommit
