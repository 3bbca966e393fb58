"""Revision 0006 (policy v2) on SQLite and PostgreSQL: it fills the admission index from the queue as it stands
(a seed database's too), and a downgrade to 0005 and upgrade again keep every row and rebuild the same index."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest
from admission_index import assert_index_consistent, expected_index
from dbutil import columns, query, table_names
from planes import CONTENT_KEY, ENCRYPTION_KEY
from seed_schema import build_seed_database, connect, populate

from admission_plane import AdmissionPlane, Lane, Policy, migrate
from admission_plane.store.schema_check import check_schema

BEFORE_POLICY_V2 = "0005_queue_deadline_index"
POLICY_V2_TABLES = {
    "policy_revisions",
    "admission_pauses",
    "lane_credits",
    "queue_entries",
    "queue_sessions",
    "queue_agents",
    "queue_keys",
}
POLICY = Policy(8, 8, 0, 1_800_000, 30_000, lanes=(Lane("default"), Lane("batch")))
#: Requests of the fixture queue: (request id, enqueued_at, agent, session, model, with a payload).
QUEUE = (
    ("q-01", 100, "agent-a", "s1", "m1", True),
    ("q-02", 100, "agent-a", "s1", "m1", True),  # a tie: the request id decides
    ("q-03", 90, "agent-a", "s2", "m1", True),  # the agent's oldest, in another session
    ("q-04", 95, "agent-b", "s3", "m1", True),
    ("q-05", 80, "agent-b", "s3", "m2", True),  # another key
    ("q-06", 70, "agent-c", "s4", "m1", False),  # no payload: not admissible, not indexed
    ("q-07", 60, "agent-c", "s4", "m1", True),
    ("q-08", 60, "agent-a", "s1", "m1", True),  # ties with q-07 across agents
)


def fill(plane: AdmissionPlane) -> None:
    """The fixture queue, plus one admitted and one cancelled request (which must not be indexed)."""
    for request_id, now, agent, session, model, with_payload in QUEUE:
        fields = {
            "request_id": request_id,
            "session_id": session,
            "agent_id": agent,
            "fingerprint": "f",
            "provider": "p1",
            "model": model,
            "now": now,
        }
        if with_payload:
            plane.enqueue_with_payload(**fields, plaintext=f"prompt {request_id}", expires_at=10_000_000)
        else:
            plane.enqueue(**fields)
    for request_id in ("gone-admitted", "gone-cancelled"):
        plane.enqueue_with_payload(
            request_id=request_id,
            session_id="s9",
            agent_id="agent-z",
            fingerprint="f",
            provider="p1",
            model="m1",
            now=10,
            plaintext="p",
            expires_at=10_000_000,
        )
    lease = plane.admit_request("gone-admitted", 200, "owner")
    assert lease is not None
    plane.cancel_queued("gone-cancelled", 201)


def request_rows(database: str) -> list[tuple[object, ...]]:
    return query(database, "SELECT * FROM turn_requests ORDER BY request_id")


def assert_index_of_the_fixture_queue(database: str) -> None:
    """The index is consistent and holds what the fixture queue implies (so the check is not vacuous)."""
    assert_index_consistent(database)
    index = expected_index(database)
    assert {entry[0] for entry in index["queue_entries"] if entry[2] == "p1"} == {row[0] for row in QUEUE if row[5]}
    assert {key for key in index["queue_keys"] if key[1] == "p1"} == {
        ("default", "p1", "m1", 60, "q-07"),
        ("default", "p1", "m2", 80, "q-05"),
    }
    assert ("default", "p1", "m1", "agent-a", 60, "q-08") in index["queue_agents"]
    assert ("default", "p1", "m1", "agent-a", "s1", 60, "q-08") in index["queue_sessions"]


def round_trip(database: str) -> None:
    """Down to 0005 (the new tables and columns gone), then up to head again."""
    migrate.downgrade(database, BEFORE_POLICY_V2)
    assert not POLICY_V2_TABLES & set(table_names(database))
    assert "lane" not in columns(database, "turn_requests")
    assert "revision" not in columns(database, "policy_state")
    migrate.upgrade(database)


def test_upgrading_a_seed_database_fills_the_admission_index_from_its_queue(tmp_path: Path) -> None:
    """A database written by the original connector, with a queue of several agents, sessions, keys and ties, comes
    out of the upgrade with every queued request that has a payload indexed and every group's head right."""
    path = build_seed_database(tmp_path / "seed.sqlite", 3)
    populate(path, 3)  # r-queued (with a payload), r-active, r-done
    with closing(connect(path)) as connection:
        for request_id, now, agent, session, model, with_payload in QUEUE:
            connection.execute(
                "INSERT INTO turn_requests (request_id, session_id, agent_id, fingerprint, provider, model, state, "
                "enqueued_at, deadline_at) VALUES (?, ?, ?, 'f', 'p1', ?, 'queued', ?, ?)",
                (request_id, session, agent, model, now, now + 1_800_000),
            )
            if with_payload:
                connection.execute(
                    "INSERT INTO turn_payloads SELECT ?, nonce, ciphertext, auth_tag, key_version, "
                    "content_fingerprint, expires_at, created_at FROM turn_payloads WHERE request_id = 'r-queued'",
                    (request_id,),
                )
    migrate.upgrade(path)
    database = str(path)
    assert_index_of_the_fixture_queue_and_the_seeds(database)
    assert query(database, "SELECT DISTINCT lane FROM turn_requests") == [("default",)]
    assert query(database, "SELECT revision FROM policy_state") == [(0,)]


def assert_index_of_the_fixture_queue_and_the_seeds(database: str) -> None:
    assert_index_consistent(database)
    index = expected_index(database)
    assert {entry[0] for entry in index["queue_entries"]} == {row[0] for row in QUEUE if row[5]} | {"r-queued"}
    assert ("default", "antigravity", "m1", 1_700_000_000_100, "r-queued") in index["queue_keys"]
    assert ("default", "p1", "m1", 60, "q-07") in index["queue_keys"]
    assert ("default", "p1", "m1", "agent-a", "s1", 60, "q-08") in index["queue_sessions"]


@pytest.fixture
def sqlite_database(tmp_path: Path) -> str:
    path = str(tmp_path / "admission.sqlite")
    migrate.upgrade(path)
    return path


@pytest.fixture
def postgres_database(postgres_url: str) -> str:
    migrate.upgrade(postgres_url)
    return postgres_url


@pytest.mark.parametrize(
    "database_fixture", ["sqlite_database", pytest.param("postgres_database", marks=pytest.mark.postgres)]
)
def test_a_downgrade_to_0005_and_upgrade_keep_every_row_and_rebuild_the_same_index(
    request: pytest.FixtureRequest, database_fixture: str
) -> None:
    """Rows written at head survive 0006's downgrade and upgrade; the upgrade refills the index from the queue, the
    same index as before; a request's lane is not kept (it returns in the default lane) and the schema check
    passes."""
    database = request.getfixturevalue(database_fixture)
    plane = AdmissionPlane(database, policy=POLICY, encryption_key=ENCRYPTION_KEY, content_fingerprint_key=CONTENT_KEY)
    try:
        fill(plane)
        plane.enqueue_with_payload(
            request_id="in-batch",
            session_id="s5",
            agent_id="agent-d",
            fingerprint="f",
            provider="p2",
            model="m1",
            now=300,
            plaintext="p",
            expires_at=10_000_000,
            lane="batch",
        )
    finally:
        plane.close()
    assert_index_of_the_fixture_queue(database)
    requests_before = request_rows(database)
    round_trip(database)
    assert_index_of_the_fixture_queue(database)
    lane = columns(database, "turn_requests").index("lane")
    assert request_rows(database) == [
        tuple("default" if index == lane else value for index, value in enumerate(row)) for row in requests_before
    ]
    assert ("default", "p2", "m1", 300, "in-batch") in expected_index(database)["queue_keys"]
    engine = AdmissionPlane(database, policy=POLICY, encryption_key=ENCRYPTION_KEY, content_fingerprint_key=CONTENT_KEY)
    try:
        check_schema(engine.engine)
        assert engine.admit_next(1_000, "owner").request_id == "q-07"  # the oldest head, by request id at a tie
    finally:
        engine.close()
