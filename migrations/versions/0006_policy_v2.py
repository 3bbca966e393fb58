"""Policy v2: lanes, live policy revisions, pauses, lane credits and the admission index (ours).

Revision ID: 0006_policy_v2
Revises: 0005_queue_deadline_index
Create Date: 2026-12-03

* ``turn_requests.lane`` (``'default'`` for every request written before) and an index on
  ``(session_id, state)`` for the per-session limit at enqueue.
* ``policy_state.revision``: the live policy revision in force (0: none yet), with every
  revision kept in ``policy_revisions``.
* ``admission_pauses``: what is paused (everything, a lane, a provider/model key).
* ``lane_credits``: the round of the weighted share between lanes.
* The admission index: ``queue_entries`` (queued requests with a payload) and the heads of
  the groups they form (``queue_sessions``, ``queue_agents``, ``queue_keys``), filled here
  from the queue as it stands, so a database written by the original keeps its queue order.
"""

from __future__ import annotations

from alembic import op

from admission_plane.migrate import assert_drop_column_available, execute_script, read_sqlite_version

revision: str = "0006_policy_v2"
down_revision: str | None = "0005_queue_deadline_index"
branch_labels: str | None = None
depends_on: str | None = None

_HEAD = "head_enqueued_at {int} NOT NULL, head_request_id TEXT NOT NULL"
_TABLES = (
    "CREATE TABLE policy_revisions (revision {int} NOT NULL PRIMARY KEY, created_at {int} NOT NULL, "
    "document TEXT NOT NULL)",
    "CREATE TABLE admission_pauses (lane TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, "
    "since {int} NOT NULL, PRIMARY KEY (lane, provider, model))",
    "CREATE TABLE lane_credits (lane TEXT NOT NULL PRIMARY KEY, credits {int} NOT NULL)",
    "CREATE TABLE queue_entries (request_id TEXT NOT NULL PRIMARY KEY, lane TEXT NOT NULL, provider TEXT NOT NULL, "
    "model TEXT NOT NULL, agent_id TEXT NOT NULL, session_id TEXT NOT NULL, enqueued_at {int} NOT NULL)",
    "CREATE TABLE queue_sessions (lane TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, "
    "agent_id TEXT NOT NULL, session_id TEXT NOT NULL, " + _HEAD + ", "
    "PRIMARY KEY (lane, provider, model, agent_id, session_id))",
    "CREATE TABLE queue_agents (lane TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, "
    "agent_id TEXT NOT NULL, " + _HEAD + ", PRIMARY KEY (lane, provider, model, agent_id))",
    "CREATE TABLE queue_keys (lane TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, "
    + _HEAD
    + ", PRIMARY KEY (lane, provider, model))",
)
_INDEXES = (
    "CREATE INDEX turn_requests_session_state ON turn_requests (session_id, state)",
    "CREATE INDEX queue_entries_group ON queue_entries "
    "(lane, provider, model, agent_id, session_id, enqueued_at, request_id)",
    "CREATE INDEX queue_sessions_order ON queue_sessions "
    "(lane, provider, model, agent_id, head_enqueued_at, head_request_id)",
    "CREATE INDEX queue_agents_order ON queue_agents (lane, provider, model, head_enqueued_at, head_request_id)",
    "CREATE INDEX queue_keys_order ON queue_keys (lane, head_enqueued_at, head_request_id)",
)
# The index as it must stand for the queue as it is: one entry per queued request with a
# payload, and each group's head the oldest (enqueued_at, request_id) below it.
_FILL = (
    "INSERT INTO queue_entries (request_id, lane, provider, model, agent_id, session_id, enqueued_at) "
    "SELECT r.request_id, r.lane, r.provider, r.model, r.agent_id, r.session_id, r.enqueued_at "
    "FROM turn_requests r WHERE r.state = 'queued' "
    "AND EXISTS (SELECT 1 FROM turn_payloads p WHERE p.request_id = r.request_id)",
    "INSERT INTO queue_sessions SELECT e.lane, e.provider, e.model, e.agent_id, e.session_id, e.enqueued_at, "
    "e.request_id FROM queue_entries e WHERE NOT EXISTS (SELECT 1 FROM queue_entries o WHERE o.lane = e.lane "
    "AND o.provider = e.provider AND o.model = e.model AND o.agent_id = e.agent_id AND o.session_id = e.session_id "
    "AND (o.enqueued_at, o.request_id) < (e.enqueued_at, e.request_id))",
    "INSERT INTO queue_agents SELECT s.lane, s.provider, s.model, s.agent_id, s.head_enqueued_at, s.head_request_id "
    "FROM queue_sessions s WHERE NOT EXISTS (SELECT 1 FROM queue_sessions o WHERE o.lane = s.lane "
    "AND o.provider = s.provider AND o.model = s.model AND o.agent_id = s.agent_id "
    "AND (o.head_enqueued_at, o.head_request_id) < (s.head_enqueued_at, s.head_request_id))",
    "INSERT INTO queue_keys SELECT a.lane, a.provider, a.model, a.head_enqueued_at, a.head_request_id "
    "FROM queue_agents a WHERE NOT EXISTS (SELECT 1 FROM queue_agents o WHERE o.lane = a.lane "
    "AND o.provider = a.provider AND o.model = a.model "
    "AND (o.head_enqueued_at, o.head_request_id) < (a.head_enqueued_at, a.head_request_id))",
)
_NEW_TABLES = (
    "policy_revisions",
    "admission_pauses",
    "lane_credits",
    "queue_entries",
    "queue_sessions",
    "queue_agents",
    "queue_keys",
)


def upgrade() -> None:
    """Add the columns, tables and indexes, and fill the admission index from the queue."""
    bind = op.get_bind()
    integer = "INTEGER" if bind.dialect.name == "sqlite" else "BIGINT"
    statements = [
        "ALTER TABLE turn_requests ADD COLUMN lane TEXT NOT NULL DEFAULT 'default'",
        f"ALTER TABLE policy_state ADD COLUMN revision {integer} NOT NULL DEFAULT 0",
        *(table.format(int=integer) for table in _TABLES),
        *_INDEXES,
        *_FILL,
    ]
    if bind.dialect.name == "sqlite":
        execute_script(bind, "".join(f"{statement};\n" for statement in statements))
    else:
        for statement in statements:
            op.execute(statement)


def downgrade() -> None:
    """Drop them again (SQLite 3.35 or newer); queued requests keep their place by ``enqueued_at``."""
    bind = op.get_bind()
    statements = [
        *(f"DROP TABLE {table}" for table in _NEW_TABLES),
        "DROP INDEX turn_requests_session_state",
        "ALTER TABLE turn_requests DROP COLUMN lane",
        "ALTER TABLE policy_state DROP COLUMN revision",
    ]
    if bind.dialect.name == "sqlite":
        assert_drop_column_available(read_sqlite_version(bind))
        execute_script(bind, "".join(f"{statement};\n" for statement in statements))
    else:
        for statement in statements:
            op.execute(statement)
