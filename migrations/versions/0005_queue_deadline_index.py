"""Partial index on queued deadlines (ours, after the seed's v3).

Revision ID: 0005_queue_deadline_index
Revises: 0004_host_identity
Create Date: 2026-12-02

Every admission first times out the queued requests whose deadline passed. Without an
index on ``deadline_at`` that sweep reads every queued row, so admission slows down with
queue depth; with this partial index it reads only the rows that actually expire.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005_queue_deadline_index"
down_revision: str | None = "0004_host_identity"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``turn_requests_queued_deadline`` on ``deadline_at`` where ``state = 'queued'``."""
    op.create_index(
        "turn_requests_queued_deadline",
        "turn_requests",
        ["deadline_at"],
        sqlite_where=sa.text("state = 'queued'"),
        postgresql_where=sa.text("state = 'queued'"),
    )


def downgrade() -> None:
    """Drop the index."""
    op.drop_index("turn_requests_queued_deadline", table_name="turn_requests")
