"""Budgets: what counts against a provider/model's request and token budgets, and token estimates (ours).

Revision ID: 0007_budgets
Revises: 0006_policy_v2
Create Date: 2026-12-03

* ``budget_charges``: one row per admitted turn under a budget (its request and its
  estimated, then used, tokens), per usage recorded outside the plane and per correction
  from the provider's remaining-budget headers (``window_ms``: the window a correction
  counts in); indexed by key and time for the sliding windows.
* ``turn_estimates``: a request's estimated token cost, given at enqueue.

Nothing existing changes, so the downgrade only drops the two tables.
"""

from __future__ import annotations

from alembic import op

from admission_plane.migrate import execute_script

revision: str = "0007_budgets"
down_revision: str | None = "0006_policy_v2"
branch_labels: str | None = None
depends_on: str | None = None

_TABLES = (
    "CREATE TABLE budget_charges (charge_id TEXT NOT NULL PRIMARY KEY, provider TEXT NOT NULL, "
    "model TEXT NOT NULL, charged_at {int} NOT NULL, requests {int} NOT NULL, reserved_tokens {int} NOT NULL, "
    "used_tokens {int}, state TEXT NOT NULL, window_ms {int})",
    "CREATE TABLE turn_estimates (request_id TEXT NOT NULL PRIMARY KEY, tokens {int} NOT NULL)",
)
_INDEXES = (
    "CREATE INDEX budget_charges_key ON budget_charges (provider, model, charged_at)",
    "CREATE INDEX budget_charges_provider ON budget_charges (provider, charged_at)",
)


def _run(statements: list[str]) -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        execute_script(bind, "".join(f"{statement};\n" for statement in statements))
    else:
        for statement in statements:
            op.execute(statement)


def upgrade() -> None:
    """Create the two tables and their indexes."""
    integer = "INTEGER" if op.get_bind().dialect.name == "sqlite" else "BIGINT"
    _run([*(table.format(int=integer) for table in _TABLES), *_INDEXES])


def downgrade() -> None:
    """Drop them (every budget charge and estimate is lost; the queue and the leases are untouched)."""
    _run(["DROP TABLE budget_charges", "DROP TABLE turn_estimates"])
