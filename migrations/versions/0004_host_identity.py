"""Host identity of process evidence (ours, after the seed's v3).

Revision ID: 0004_host_identity
Revises: 0003_seed_v3
Create Date: 2026-12-02

Process evidence is host-local. When connectors on several machines share one plane
(PostgreSQL), a reaper may judge only the evidence its own host recorded, so the
dispatch identity and the queued-owner identity record which host captured them. NULL
means "recorded before this revision" (by a single-host connector, or the original one)
and is treated as local evidence. After this revision the original connector refuses the
database (its integrity guard expects the exact v3 columns).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from admission_plane.migrate import assert_drop_column_available, execute_script, read_sqlite_version

revision: str = "0004_host_identity"
down_revision: str | None = "0003_seed_v3"
branch_labels: str | None = None
depends_on: str | None = None

TABLES = ("lease_process_identities", "queued_owner_instances")


def upgrade() -> None:
    """Add a nullable ``host_id`` to both identity tables."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        execute_script(bind, "".join(f"ALTER TABLE {table} ADD COLUMN host_id TEXT NULL;\n" for table in TABLES))
    else:
        for table in TABLES:
            op.add_column(table, sa.Column("host_id", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop ``host_id`` again (SQLite 3.35 or newer)."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        assert_drop_column_available(read_sqlite_version(bind))
        execute_script(bind, "".join(f"ALTER TABLE {table} DROP COLUMN host_id;\n" for table in TABLES))
    else:
        for table in TABLES:
            op.drop_column(table, "host_id")
