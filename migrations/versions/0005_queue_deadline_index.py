"""Index on (state, deadline_at) for the queue-timeout sweep (ours, after the seed's v3).

Revision ID: 0005_queue_deadline_index
Revises: 0004_host_identity
Create Date: 2026-12-02

Every admission first times out the queued requests whose deadline passed. Without an
index on ``deadline_at`` that sweep reads every queued row, so admission slows down with
queue depth; with this index it reads only the rows that actually expire. (A partial index
``WHERE state = 'queued'`` is not chosen by SQLite's planner over ``turn_requests_queue``,
whose leading column is the equality on ``state``; a composite index is.)
"""

from __future__ import annotations

from alembic import op

revision: str = "0005_queue_deadline_index"
down_revision: str | None = "0004_host_identity"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``turn_requests_state_deadline`` on ``(state, deadline_at)``."""
    op.create_index("turn_requests_state_deadline", "turn_requests", ["state", "deadline_at"])


def downgrade() -> None:
    """Drop the index."""
    op.drop_index("turn_requests_state_deadline", table_name="turn_requests")
