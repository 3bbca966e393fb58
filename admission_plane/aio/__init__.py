"""The turn API for asyncio: ``async with aplane.turn(...) as turn:``, without a thread per waiting turn.

::

    async with AsyncAdmissionPlane("turns.sqlite", policy=..., encryption_key=..., ...) as aplane:
        async with aplane.turn(request_id="r-1", session_id="s-1", agent_id="agent-a",
                               provider="anthropic", model="claude", prompt="hello",
                               command=["my-provider-cli"]) as turn:
            reply = await turn.child.stdout.read()    # active here; heartbeats run in a task
            if b"overloaded" in reply:
                turn.fail("provider_capacity")

The options, outcomes and errors are those of :class:`admission_plane.turns.Turn`
(``run_turn`` and ``wait_for_admission`` have async twins on :class:`AsyncAdmissionPlane`;
:class:`AsyncAdmissionService` is the same plane without the turn API, which :class:`AsyncTurn` is built on).
The provider child is an ``asyncio.create_subprocess_exec(..., start_new_session=True)``
child, the prompt write is awaited (``write`` + ``drain`` + close), and heartbeats are a task.

**Waiting costs no thread.** Every waiting turn of a plane shares one doorbell reader per
event loop (see :mod:`admission_plane.aio._bell`): a task reads the counters every few
milliseconds and wakes, through futures, only the waiters whose awaited counter moved;
on PostgreSQL the plane's listening thread also hands each ring to the loop with
``call_soon_threadsafe``.

**Why an executor, not SQLAlchemy's asyncio engine.** Every transaction runs, unchanged,
in a small bounded ``ThreadPoolExecutor`` owned by the async plane (4 workers by default).
The sync path's unit of work is the contract: the same transaction per operation, the
same lease fences, the same SQLite writer gate (a file lock taken before ``BEGIN
IMMEDIATE``, which rings the doorbell) and the same PostgreSQL advisory lock; a second,
async implementation of all of it would be a second thing to keep correct. An async
engine would not save the threads either: ``aiosqlite`` runs one thread per connection,
and SQLite serialises writers anyway. The executor bounds the threads and connections of
any number of turns to ``workers``; the benchmark (``benchmarks/test_async.py``) shows
200 waiting turns on 4 threads with the event loop's lag staying in the low milliseconds,
against 200+ threads for the sync API (figures in ``BENCHMARKS.md`` and ``ratios.json``).

**Cancellation is safe.** A transaction in flight always finishes (its outcome is
recorded in the worker thread), then the cancellation is acted on: before the first byte
of the prompt is written the turn is abandoned (``cancelled``: the seat is free); from
the write on the execution is ``recovery_required`` (the seat stays held as visible
debt); never a requeue; the child's process group is stopped (SIGTERM, then SIGKILL) as
in the sync API. A cancellation while the block's completion is being written lets it
finish (the turn ends as the block chose) and then propagates. ``asyncio.timeout`` and
anyio cancel scopes behave alike (the time-out is a cancellation inside).

**Event loops.** Plain :mod:`asyncio` and anyio on its asyncio backend. Not trio: the
child is an asyncio subprocess and the executor is awaited through the asyncio loop.
"""

from __future__ import annotations

from ._bell import AsyncBell
from ._child import spawn_child, terminate, write_to_stdin
from ._plane import AsyncAdmissionPlane
from ._service import DEFAULT_BELL_INTERVAL_MS, DEFAULT_WORKERS, AsyncAdmissionService
from ._turn import AsyncTurn

__all__ = [
    "DEFAULT_BELL_INTERVAL_MS",
    "DEFAULT_WORKERS",
    "AsyncAdmissionPlane",
    "AsyncAdmissionService",
    "AsyncBell",
    "AsyncTurn",
    "spawn_child",
    "terminate",
    "write_to_stdin",
]
