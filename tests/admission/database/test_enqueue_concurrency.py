"""Enqueues side by side (PostgreSQL runs them under the shared gate; SQLite serialises every writer).

What an enqueue reads that another enqueue may change at the same moment: the same request
enqueued twice, the same connector recorded twice, and a session's count under a policy that
refuses requests beyond the session's limit. Threads release their enqueues together, on
both dialects, and the outcome must be what one-at-a-time enqueues give.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dbutil import count, query, scalar
from planes import PlaneFactory, enqueue

from admission_plane import AdmissionConflictError, EnqueueResult, Policy, SessionLimitError
from admission_plane.service._enqueue import ENQUEUE_GATE
from admission_plane.store.unit_of_work import Gate

THREADS = 8


def together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` on threads released at once; each result, or the exception it raised."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = calls[index]()
        except Exception as error:
            results[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_enqueue_takes_the_shared_gate() -> None:
    """Enqueues are lease-like units on PostgreSQL: they take the plane's gate shared, not exclusively."""
    assert ENQUEUE_GATE is Gate.ENQUEUE


def test_the_same_request_enqueued_at_once_is_inserted_once(make_plane: PlaneFactory, database_url: str) -> None:
    """Eight threads enqueue one request at the same moment: one inserts it (existed=False), seven see a replay,
    and the journal holds one enqueue event and the index one entry."""
    plane = make_plane()
    results = together([lambda: enqueue(plane, "same", now=1_000) for _ in range(THREADS)])
    assert all(isinstance(result, EnqueueResult) for result in results), results
    assert sorted(result.existed for result in results) == [False] + [True] * (THREADS - 1)
    assert count(database_url, "turn_requests") == 1
    assert count(database_url, "events", "kind = 'request_enqueued'") == 1
    assert count(database_url, "queue_entries") == 1
    assert count(database_url, "turn_payloads") == 1


def test_a_different_request_under_the_same_id_at_once_conflicts(make_plane: PlaneFactory, database_url: str) -> None:
    """Two threads enqueue the same id with different metadata at once: one wins, the other gets
    AdmissionConflictError, and the stored request is the winner's."""
    plane = make_plane()
    results = together([lambda agent=agent: enqueue(plane, "same", agent_id=agent) for agent in ("agent-a", "agent-b")])
    winners = [result for result in results if isinstance(result, EnqueueResult)]
    assert len(winners) == 1
    assert [type(result) for result in results if not isinstance(result, EnqueueResult)] == [AdmissionConflictError]
    assert count(database_url, "turn_requests") == 1


def test_one_connector_enqueueing_from_many_threads_is_recorded_once(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Eight threads of one plane enqueue different requests at once: all succeed, one connector record,
    every request bound to it."""
    plane = make_plane()
    results = together([lambda index=index: enqueue(plane, f"r-{index}", agent_id=f"a-{index}") for index in range(8)])
    assert all(isinstance(result, EnqueueResult) and not result.existed for result in results), results
    assert count(database_url, "queued_owner_instances") == 1
    owner = plane.owner_identity.owner_instance_id
    assert count(database_url, "turn_requests", "queued_owner_instance_id = ?", (owner,)) == THREADS


def test_a_refusing_session_limit_holds_when_enqueues_race(make_plane: PlaneFactory, database_url: str) -> None:
    """With max_turns_per_session=2 and session_overflow="refuse", eight enqueues of one session at once:
    exactly two are queued and six are refused with SessionLimitError."""
    plane = make_plane(policy=Policy(8, 8, 0, 1_800_000, 30_000, max_turns_per_session=2, session_overflow="refuse"))
    results = together([lambda index=index: enqueue(plane, f"r-{index}", agent_id=f"a-{index}") for index in range(8)])
    assert sum(isinstance(result, EnqueueResult) for result in results) == 2
    assert sum(isinstance(result, SessionLimitError) for result in results) == THREADS - 2
    assert count(database_url, "turn_requests") == 2


def test_racing_enqueues_keep_the_admission_index_heads_exact(make_plane: PlaneFactory, database_url: str) -> None:
    """Enqueues of one group released together leave each group head at its oldest request, and admission takes
    them oldest first."""
    plane = make_plane()
    results = together(
        [lambda index=index: enqueue(plane, f"r-{index}", agent_id="agent-a", now=1_000 + index) for index in range(8)]
    )
    assert all(isinstance(result, EnqueueResult) for result in results), results
    assert scalar(database_url, "SELECT head_request_id FROM queue_keys") == "r-0"
    assert scalar(database_url, "SELECT head_request_id FROM queue_agents") == "r-0"
    assert scalar(database_url, "SELECT head_request_id FROM queue_sessions") == "r-0"
    owner = plane.owner_identity.owner_instance_id
    admitted = []
    for step in range(3):
        lease = plane.admit_next(2_000 + step, owner)
        assert lease is not None
        admitted.append(lease.request_id)
        plane.abandon_before_prompt(lease, 2_000 + step, "cancelled")
    assert admitted == ["r-0", "r-1", "r-2"]


def test_index_heads_after_races_match_the_queue(make_plane: PlaneFactory, database_url: str) -> None:
    """After enqueues across two agents and three models released together, every key and agent group's head is
    the oldest queued entry of its group (what db check verifies)."""
    plane = make_plane()
    calls = [
        lambda index=index: enqueue(
            plane, f"r-{index:02d}", agent_id=f"a-{index % 2}", model=f"m-{index % 3}", now=1_000 + (index * 7) % 16
        )
        for index in range(16)
    ]
    assert all(isinstance(result, EnqueueResult) for result in together(calls))
    entries = sorted(query(database_url, "SELECT enqueued_at, request_id, model, agent_id FROM queue_entries"))
    oldest_by_key: dict[str, str] = {}
    oldest_by_agent: dict[tuple[str, str], str] = {}
    for _at, request_id, model, agent in entries:
        oldest_by_key.setdefault(model, request_id)
        oldest_by_agent.setdefault((model, agent), request_id)
    assert dict(query(database_url, "SELECT model, head_request_id FROM queue_keys")) == oldest_by_key
    heads = query(database_url, "SELECT model, agent_id, head_request_id FROM queue_agents")
    assert {(model, agent): head for model, agent, head in heads} == oldest_by_agent
