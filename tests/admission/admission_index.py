"""The admission index (revision 0006) recomputed from the queue, to compare with the one the plane maintains.

The index holds one ``queue_entries`` row per queued request that has its payload, and the head
of every group those entries form: ``queue_sessions`` (lane, provider, model, agent, session),
``queue_agents`` (lane, provider, model, agent) and ``queue_keys`` (lane, provider, model). A
group's head is its oldest ``(enqueued_at, request_id)``. :func:`expected_index` derives all of it
from ``turn_requests`` and ``turn_payloads`` alone; :func:`assert_index_consistent` fails with
the difference when the maintained index disagrees. Works on an SQLite file and on PostgreSQL.
"""

from __future__ import annotations

from typing import Any

from dbutil import query

Index = dict[str, set[tuple[Any, ...]]]
#: The group columns of each head table, outermost first.
GROUPS = {
    "queue_sessions": ("lane", "provider", "model", "agent_id", "session_id"),
    "queue_agents": ("lane", "provider", "model", "agent_id"),
    "queue_keys": ("lane", "provider", "model"),
}
#: Every table of the index: what follows from the queue's rows and nothing else.
INDEX_TABLES = ("queue_entries", *GROUPS)
ENTRY_COLUMNS = ("request_id", "lane", "provider", "model", "agent_id", "session_id", "enqueued_at")
_ADMISSIBLE = (
    "SELECT r.request_id, r.lane, r.provider, r.model, r.agent_id, r.session_id, r.enqueued_at FROM turn_requests r "
    "WHERE r.state = 'queued' AND EXISTS (SELECT 1 FROM turn_payloads p WHERE p.request_id = r.request_id)"
)


def expected_index(database: str) -> Index:
    """The index as it must stand for the queue in ``database`` (computed in Python from the queue's rows)."""
    entries = {tuple(row) for row in query(database, _ADMISSIBLE)}
    index: Index = {"queue_entries": entries}
    for table, columns in GROUPS.items():
        heads: dict[tuple[Any, ...], tuple[int, str]] = {}
        for entry in entries:
            row = dict(zip(ENTRY_COLUMNS, entry, strict=True))
            group = tuple(row[column] for column in columns)
            head = (row["enqueued_at"], row["request_id"])
            # Request ids order as bytes in both databases (the C collation of the tests' PostgreSQL).
            if group not in heads or _order(head) < _order(heads[group]):
                heads[group] = head
        index[table] = {(*group, *head) for group, head in heads.items()}
    return index


def actual_index(database: str) -> Index:
    """The index the plane maintains in ``database``."""
    index: Index = {
        "queue_entries": {
            tuple(row) for row in query(database, f"SELECT {', '.join(ENTRY_COLUMNS)} FROM queue_entries")
        }
    }
    for table, columns in GROUPS.items():
        selected = ", ".join((*columns, "head_enqueued_at", "head_request_id"))
        index[table] = {tuple(row) for row in query(database, f"SELECT {selected} FROM {table}")}
    return index


def index_differences(database: str) -> dict[str, dict[str, set[tuple[Any, ...]]]]:
    """Per table, the rows the index lacks (``missing``) and the rows it should not hold (``extra``)."""
    expected, actual = expected_index(database), actual_index(database)
    return {
        table: {"missing": expected[table] - actual[table], "extra": actual[table] - expected[table]}
        for table in expected
        if expected[table] != actual[table]
    }


def assert_index_consistent(database: str) -> None:
    """Fail, showing the difference, unless the maintained admission index is exactly the recomputed one."""
    differences = index_differences(database)
    assert not differences, f"the admission index disagrees with the queue: {differences}"


def _order(head: tuple[int, str]) -> tuple[int, bytes]:
    return head[0], head[1].encode()


__all__ = ["INDEX_TABLES", "actual_index", "assert_index_consistent", "expected_index", "index_differences"]
