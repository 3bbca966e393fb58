"""The dashboard's view of a reading, as JSON, and the hub that shares one reading per tick with every page.

The view holds what ``admission-plane status`` shows (counts, states, times, lane and
provider/model names, budget windows) plus the journal's kinds and states; never a prompt,
and never a request, session, agent or host identifier (a lease is an opaque per-server
handle).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from ._journal import chart_series
from ._readings import Reading

#: How often the hub reads the plane while a page listens (seconds).
TICK_SECONDS = 1.0


def view(reading: Reading) -> dict[str, Any]:
    """The JSON-ready view of ``reading``."""
    now = reading.now
    policy = reading.policy
    journal = reading.journal
    return {
        "now": now,
        "queue": {
            "depth": reading.queue_depth,
            "oldest_age_ms": None if reading.oldest_enqueued_at is None else max(0, now - reading.oldest_enqueued_at),
            "groups": [
                {
                    "lane": g.lane,
                    "provider": g.provider,
                    "model": g.model,
                    "depth": g.depth,
                    "oldest_age_ms": max(0, now - g.oldest_enqueued_at),
                }
                for g in reading.queue
            ],
        },
        "seats": {
            "in_use": reading.seats_in_use,
            "limit": None if policy is None else policy.max_active_turns,
            "starts_in_window": reading.starts_in_window,
            "starts_limit": None if policy is None else policy.max_concurrent_starts,
            "groups": [
                {"lane": g.lane, "provider": g.provider, "model": g.model, "seats": g.seats, "starts": g.starts}
                for g in reading.seats
            ],
        },
        "leases": {
            "by_phase": reading.leases_by_phase,
            "suspects_by_phase": reading.suspects_by_phase,
            "rows": [
                {
                    "handle": lease.handle,
                    "phase": lease.phase,
                    "lane": lease.lane,
                    "provider": lease.provider,
                    "model": lease.model,
                    "held_ms": max(0, now - lease.acquired_at),
                    "heartbeat_age_ms": max(0, now - lease.heartbeat_at),
                    "suspect_reason": lease.suspect_reason,
                    "evidence": lease.evidence,
                }
                for lease in reading.leases
            ],
        },
        "requests_by_state": reading.requests_by_state,
        "recovery_required": reading.recovery_required,
        "cooldowns": [{"provider": p, "model": m, "remaining_ms": max(0, nb - now)} for p, m, nb in reading.cooldowns],
        "pauses": [
            {"scope": p.scope, "lane": p.lane, "provider": p.provider, "model": p.model, "since": p.since}
            for p in reading.pauses
        ],
        "budgets": [
            {
                "provider": w.provider,
                "model": w.model,
                "window_ms": w.window_ms,
                "requests": w.requests,
                "max_requests": w.max_requests,
                "remaining_requests": w.remaining_requests,
                "reserved_tokens": w.reserved_tokens,
                "used_tokens": w.used_tokens,
                "max_tokens": w.max_tokens,
                "remaining_tokens": w.remaining_tokens,
                "next_reset_ms": None if w.next_reset_at is None else max(0, w.next_reset_at - now),
            }
            for w in reading.budgets
        ],
        "policy": None
        if policy is None
        else {"revision": reading.policy_revision, "document": policy.to_json() if hasattr(policy, "to_json") else {}},
        "journal": {
            "last_seq": journal.last_seq,
            "tail": [
                {"seq": e.seq, "at": e.occurred_at, "kind": e.kind, "from": e.from_state, "to": e.to_state}
                for e in journal.tail
            ],
            "events_by_kind": journal.events_by_kind,
            "admissions": journal.admission_wait.count,
        },
        "charts": chart_series(journal.minutes, now, reading.queue_depth, reading.seats_in_use),
    }


class Hub:
    """Reads the plane once per tick while at least one page listens, and hands every page the same view.

    ``read`` is called in a worker thread; a failing read is published as ``{"error": ...}``
    and retried on the next tick.
    """

    def __init__(self, read: Callable[[], dict[str, Any]], tick_seconds: float = TICK_SECONDS) -> None:
        self._read = read
        self._tick = tick_seconds
        self._changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._listeners = 0
        self._version = 0
        self._message = b""
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def stopping(self) -> bool:
        """Whether the server is shutting down (every stream ends)."""
        return self._stopping.is_set()

    def start(self) -> None:
        """Start the reading loop (in the running event loop)."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """End every stream and the loop."""
        self.request_stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def request_stop(self) -> None:
        """Ask every stream to end (safe from a signal handler running in the loop's thread)."""
        self._stopping.set()
        self._wake.set()

    def poke(self) -> None:
        """Read again now (after an action), instead of at the next tick."""
        self._wake.set()

    async def _run(self) -> None:
        while not self._stopping.is_set():
            if self._listeners == 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                data = await run_in_threadpool(self._read)
            except Exception as error:  # noqa: BLE001 (the boundary: a failed read is shown, then retried)
                data = {"error": " ".join(str(error).split())[:300] or type(error).__name__}
            message = b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
            async with self._changed:
                self._version += 1
                self._message = message
                self._changed.notify_all()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._tick)

    async def stream(self) -> Any:
        """Server-sent events for one page: the latest view at once, then each new one; a comment every 15 s
        of silence. Ends within a second of :meth:`request_stop`."""
        self._listeners += 1
        self._wake.set()
        seen, idle = 0, 0
        try:
            yield b"retry: 2000\n\n"
            while not self._stopping.is_set():
                async with self._changed:
                    if self._version == seen:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._changed.wait(), 1.0)
                    version, message = self._version, self._message
                if self._stopping.is_set():
                    break
                if version == seen:
                    idle += 1
                    if idle >= 15:
                        idle = 0
                        yield b": keep-alive\n\n"
                    continue
                seen, idle = version, 0
                yield message
        finally:
            self._listeners -= 1
