"""Idle waiters: what waiting connectors cost while every seat stays held, with and without the doorbell.

Two seats are held by this process; ``WAITERS`` connector processes
(:mod:`benchmarks._waiter`) each enqueue a request and wait for it for
``WAITERS_SECONDS``, all starting together, then time out. In ``doorbell`` mode they wait
as :meth:`AdmissionPlane.wait_for_admission` does on an SQLite file (reading the
doorbell's counters between looks); in ``polling`` mode the doorbell is disabled, so
every back-off step runs the admission look, as on a database without one. Figures: CPU
seconds the waiters used per second of waiting (summed over the waiters) and admission
looks per waiter per second. The summary reports the doorbell/polling CPU ratio. The same on
PostgreSQL (``test_idle_waiters_postgresql``), where the doorbell is the listening thread: a
waiter blocks on it between rings and wakes for its clock only (``LISTENING_CLOCK_CHECK_S``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ._support import (
    COMPLETED,
    RESULTS,
    WAITERS,
    WAITERS_POLICY,
    WAITERS_SECONDS,
    migrated,
    open_plane,
    run_together,
    wall_ms,
)


def run_waiters(path: Path | str, mode: str) -> dict[str, Any]:
    """Hold every seat, let ``WAITERS`` processes wait in ``mode``, gather their reports (``path``: an
    SQLite file, or a migrated and emptied PostgreSQL database URL)."""
    holder = open_plane(path, WAITERS_POLICY)
    leases = []
    try:
        now = wall_ms()
        for seat in range(WAITERS_POLICY.max_active_turns):
            holder.enqueue_with_payload(
                request_id=f"held-{seat}",
                session_id="holder",
                agent_id=f"holder-{seat}",
                fingerprint="fp-1",
                provider="antigravity",
                model="model-bench",
                now=now,
                plaintext="prompt",
                expires_at=now + 1_800_001,
            )
            lease = holder.admit_next(now, "holder")
            assert lease is not None
            leases.append(lease)
        arguments = [
            "--database",
            os.fspath(path),
            "--seconds",
            str(WAITERS_SECONDS),
            "--mode",
            mode,
            "--policy",
            json.dumps(list(WAITERS_POLICY.as_tuple())),
        ]
        reports = run_together("benchmarks._waiter", arguments, WAITERS, WAITERS_SECONDS + 120)
        for lease in leases:
            holder.mark_starting(lease, wall_ms())
            holder.mark_dispatch_intent(lease, wall_ms())
            holder.mark_active(lease, wall_ms())
            holder.complete_live_turn(lease, wall_ms(), COMPLETED)
    finally:
        holder.close()
    assert not any(report["admitted"] for report in reports), "the seats stayed held, so nobody was admitted"
    cpu = sum(report["cpu_s"] for report in reports)
    looks = sum(report["looks"] for report in reports)
    return {
        "waiters": WAITERS,
        "seconds": WAITERS_SECONDS,
        "cpu_s": cpu,
        "cpu_s_per_s": cpu / WAITERS_SECONDS,
        "looks": looks,
        "looks_per_waiter_per_s": looks / WAITERS / WAITERS_SECONDS,
    }


@pytest.mark.parametrize("mode", ["doorbell", "polling"])
def test_idle_waiters(benchmark, disk_dir: Path, mode: str) -> None:
    """Waiters on a full plane time out without being admitted; their CPU and looks are recorded."""
    path = migrated(disk_dir / "waiters.sqlite")
    figures: dict[str, Any] = {}
    benchmark.pedantic(lambda: figures.update(run_waiters(path, mode)), rounds=1, iterations=1)
    benchmark.extra_info.update(figures)
    RESULTS.setdefault("waiters", {})[mode] = figures
    assert figures["looks"] >= WAITERS, "every waiter looked at least once"


@pytest.mark.parametrize("mode", ["doorbell", "polling"])
def test_idle_waiters_postgresql(benchmark, postgres_url: str, mode: str) -> None:
    """As :func:`test_idle_waiters`, on PostgreSQL: the waiters time out without being admitted."""
    figures: dict[str, Any] = {}
    benchmark.pedantic(lambda: figures.update(run_waiters(postgres_url, mode)), rounds=1, iterations=1)
    benchmark.extra_info.update(figures)
    RESULTS.setdefault("waiters_postgresql", {})[mode] = figures
    assert figures["looks"] >= WAITERS, "every waiter looked at least once"
