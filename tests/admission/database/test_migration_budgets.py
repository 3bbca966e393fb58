"""Revision 0007 (budgets) on SQLite and PostgreSQL: up from 0006 it adds the charge and estimate tables with the two
window indexes, down to 0006 it drops them and nothing else, up again it works; and the schema check (the function,
``db check`` and opening a plane) refuses a head database missing one of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from dbutil import execute, query, table_dump
from planes import CONTENT_KEY, ENCRYPTION_KEY

from admission_plane import AdmissionPlane, Budget, Policy, migrate
from admission_plane.cli import main
from admission_plane.errors import SchemaIntegrityError
from admission_plane.store.engine import create_admission_engine
from admission_plane.store.schema_check import check_schema

BEFORE_BUDGETS = "0006_policy_v2"
BUDGET_REVISION = "0007_budgets"
BUDGET_TABLES = {"budget_charges", "turn_estimates"}
#: The indexes of revision 0007 and their columns, in order.
BUDGET_INDEXES = {
    "budget_charges_key": ["provider", "model", "charged_at"],
    "budget_charges_provider": ["provider", "charged_at"],
}
CHARGE_COLUMNS = [
    "charge_id",
    "provider",
    "model",
    "charged_at",
    "requests",
    "reserved_tokens",
    "used_tokens",
    "state",
    "window_ms",
]
POLICY = Policy(
    2,
    2,
    0,
    1_800_000,
    30_000,
    budgets=(Budget("p1", window_ms=60_000, max_requests=100, max_tokens=100_000),),
)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each dialect: an SQLite file path, or a fresh PostgreSQL database's URL."""
    if request.param == "sqlite":
        return str(tmp_path / "admission.sqlite")
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def head(fresh: str) -> str:
    """The fresh database migrated to head."""
    migrate.upgrade(fresh)
    return fresh


@pytest.fixture
def engine(fresh: str) -> Iterator[sa.Engine]:
    """An admission engine on the fresh database (disposed afterwards)."""
    engine = create_admission_engine(fresh)
    yield engine
    engine.dispose()


def inspect(engine: sa.Engine) -> tuple[set[str], dict[str, list[str]]]:
    """The tables of the database, and each budget-table index by name with its columns."""
    inspector = sa.inspect(engine)
    tables = set(inspector.get_table_names())
    indexes = {
        index["name"]: list(index["column_names"])
        for table in sorted(BUDGET_TABLES & tables)
        for index in inspector.get_indexes(table)
        if index["name"] is not None
    }
    return tables, indexes


def open_plane(database: str) -> AdmissionPlane:
    return AdmissionPlane(database, policy=POLICY, encryption_key=ENCRYPTION_KEY, content_fingerprint_key=CONTENT_KEY)


def enqueue(plane: AdmissionPlane, request_id: str, now: int, tokens: int | None) -> None:
    plane.enqueue_with_payload(
        request_id=request_id,
        session_id="s1",
        agent_id="agent-a",
        fingerprint="f",
        provider="p1",
        model="m1",
        now=now,
        plaintext=f"prompt {request_id}",
        expires_at=10_000_000,
        estimated_tokens=tokens,
    )


def fill(database: str) -> None:
    """An admitted request with its reservation, a queued one with an estimate, one without, and outside usage."""
    plane = open_plane(database)
    try:
        enqueue(plane, "r-admitted", 100, 1_000)
        enqueue(plane, "r-queued", 101, 2_000)
        enqueue(plane, "r-plain", 102, None)
        lease = plane.admit_request("r-admitted", 200, plane.owner_identity.owner_instance_id)
        assert lease is not None
        plane.record_external_usage("p1", "m1", requests=1, tokens=500, now=300)
    finally:
        plane.close()


def without(dump: dict[str, list[tuple[Any, ...]]], *tables: str) -> dict[str, list[tuple[Any, ...]]]:
    return {name: rows for name, rows in dump.items() if name not in tables}


def test_upgrading_from_0006_creates_the_two_tables_and_their_indexes(fresh: str, engine: sa.Engine) -> None:
    """At 0006 there is no budget table; the upgrade to head adds budget_charges and turn_estimates with their
    columns, the key and provider window indexes on their columns, and passes the schema check."""
    migrate.upgrade(fresh, BEFORE_BUDGETS)
    assert migrate.current_revision(fresh) == BEFORE_BUDGETS
    tables, indexes = inspect(engine)
    assert not BUDGET_TABLES & tables
    assert "queue_keys" in tables  # 0006's tables are there
    check_schema(engine, revision=BEFORE_BUDGETS)

    migrate.upgrade(fresh)
    assert migrate.current_revision(fresh) == migrate.HEAD_REVISION == BUDGET_REVISION
    tables, indexes = inspect(engine)
    assert tables >= BUDGET_TABLES
    assert indexes == BUDGET_INDEXES
    inspector = sa.inspect(engine)
    assert [column["name"] for column in inspector.get_columns("budget_charges")] == CHARGE_COLUMNS
    assert [column["name"] for column in inspector.get_columns("turn_estimates")] == ["request_id", "tokens"]
    assert inspector.get_pk_constraint("budget_charges")["constrained_columns"] == ["charge_id"]
    assert inspector.get_pk_constraint("turn_estimates")["constrained_columns"] == ["request_id"]
    check_schema(engine)


def test_down_to_0006_drops_only_the_budget_tables_and_up_again_works(head: str, engine: sa.Engine) -> None:
    """With charges, estimates, a lease and a queue at head, the downgrade to 0006 drops the two budget tables (their
    indexes too) and leaves every other row as it was and the exact 0006 schema; the upgrade again creates them
    empty, passes the schema check, and the plane admits the queued requests."""
    fill(head)
    assert query(
        head, "SELECT charge_id, requests, reserved_tokens FROM budget_charges WHERE charge_id = ?", ("r-admitted",)
    ) == [("r-admitted", 1, 1_000)]
    assert sorted(query(head, "SELECT request_id, tokens FROM turn_estimates")) == [
        ("r-admitted", 1_000),
        ("r-queued", 2_000),
    ]
    assert query(head, "SELECT COUNT(*) FROM budget_charges") == [(2,)]
    before = without(table_dump(head), *BUDGET_TABLES, "alembic_version")
    assert before["leases"]  # so the comparisons below are not vacuous
    assert len(before["turn_requests"]) == 3

    migrate.downgrade(head, BEFORE_BUDGETS)
    assert migrate.current_revision(head) == BEFORE_BUDGETS
    tables, indexes = inspect(engine)
    assert not BUDGET_TABLES & tables
    assert indexes == {}
    assert without(table_dump(head), "alembic_version") == before
    check_schema(engine, revision=BEFORE_BUDGETS)

    migrate.upgrade(head)
    assert migrate.current_revision(head) == BUDGET_REVISION
    tables, indexes = inspect(engine)
    assert tables >= BUDGET_TABLES
    assert indexes == BUDGET_INDEXES
    assert query(head, "SELECT COUNT(*) FROM budget_charges") == [(0,)]
    assert query(head, "SELECT COUNT(*) FROM turn_estimates") == [(0,)]
    assert without(table_dump(head), *BUDGET_TABLES, "alembic_version") == before
    check_schema(engine)
    plane = open_plane(head)
    try:
        owner = plane.owner_identity.owner_instance_id
        admitted = plane.admit_next(1_000, owner)
        assert admitted is not None
        assert admitted.request_id == "r-queued"
        assert len(plane.budget_status(1_000)) == 1
    finally:
        plane.close()
    assert query(head, "SELECT charge_id, requests, reserved_tokens FROM budget_charges") == [("r-queued", 1, 0)]


# --- the schema check refuses a head database missing part of 0007 ---------------------------------------------

TAMPERING = {
    "budget_charges dropped": ("DROP TABLE budget_charges", "table budget_charges is missing"),
    "turn_estimates dropped": ("DROP TABLE turn_estimates", "table turn_estimates is missing"),
    "budget_charges_key dropped": ("DROP INDEX budget_charges_key", "index budget_charges_key is missing"),
    "budget_charges_provider dropped": (
        "DROP INDEX budget_charges_provider",
        "index budget_charges_provider is missing",
    ),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_the_schema_check_refuses_a_head_database_missing_a_budget_table_or_index(
    head: str, engine: sa.Engine, case: str
) -> None:
    """A head database whose budget_charges or turn_estimates table, or one of the two window indexes, was dropped is
    refused by the schema check naming what is missing, and opening a plane on it raises SchemaIntegrityError."""
    statement, message = TAMPERING[case]
    check_schema(engine)
    execute(head, statement)
    with pytest.raises(SchemaIntegrityError, match=message):
        check_schema(engine)
    with pytest.raises(SchemaIntegrityError, match=message):
        open_plane(head).close()


def test_the_schema_check_refuses_a_window_index_on_other_columns(head: str, engine: sa.Engine) -> None:
    """The key index rebuilt without its time column (same name) is refused naming the index."""
    execute(
        head,
        "DROP INDEX budget_charges_key",
        "CREATE INDEX budget_charges_key ON budget_charges (provider, model)",
    )
    with pytest.raises(SchemaIntegrityError, match="index budget_charges_key"):
        check_schema(engine)


@pytest.mark.parametrize("statement", ["DROP TABLE budget_charges", "DROP INDEX budget_charges_provider"])
def test_db_check_fails_on_a_missing_budget_table_or_index(
    head: str, statement: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`db check` passes on the head database and exits 1 with one error line once a budget table or index is
    dropped."""
    assert main(["db", "check", "--db", head]) == 0
    execute(head, statement)
    capsys.readouterr()
    assert main(["db", "check", "--db", head]) == 1
    err = capsys.readouterr().err
    assert err.startswith("admission-plane: error: "), err
    assert err.count("\n") == 1, err
