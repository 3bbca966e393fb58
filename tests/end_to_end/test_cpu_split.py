"""``benchmarks.cpu_split``: one window reports its turns, the CPU they cost and the workers' context switches.

Nothing here looks at how fast: the window must complete turns, its workers must report CPU and context
switches, and on PostgreSQL the server's CPU, read from ``/proc``, must have grown with them (or, when the
window samples locks, the admission gate must have been seen held). Without a
PostgreSQL server running on this machine the PostgreSQL test skips (and fails under ``CI=true``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gates import require

from admission_plane.migrate import upgrade
from benchmarks._lock_sampler import backend_state, libpq_dsn
from benchmarks._support import REPO
from benchmarks.cpu_split import server_cpu_seconds, window


def test_a_window_reports_turns_and_the_client_and_server_cpu_they_cost(postgres_url: str) -> None:
    """A short window at P = 1 completes turns; each cost the worker and the server some CPU, and the worker
    blocked on its round trips (voluntary switches); with a seat to spare, nobody looked without admission."""
    require(server_cpu_seconds() > 0, "no PostgreSQL server process on this machine")
    upgrade(postgres_url)
    figures = window(REPO, postgres_url, processes=1, seconds=0.5, seats=2)
    assert figures["turns_per_s"] > 0
    assert figures["client_ms_per_turn"] > 0
    assert figures["server_ms_per_turn"] > 0
    assert figures["voluntary_switches_per_turn"] >= 1  # at least one round trip per turn
    assert figures["looks_per_turn"] == 0


def test_a_sqlite_window_uses_a_fresh_file_of_its_own_and_reports_no_server(tmp_path: Path) -> None:
    """On SQLite (a folder instead of a URL) two workers complete turns in a file made for the window and
    removed after it; there is no server CPU to report, and with a seat each nobody waits."""
    figures = window(REPO, tmp_path, processes=2, seconds=0.5, seats=2)
    assert figures["turns_per_s"] > 0
    assert figures["client_ms_per_turn"] > 0
    assert figures["voluntary_switches_per_turn"] >= 1  # each turn's commits wait for the disk
    assert figures["looks_per_turn"] == 0
    assert "server_ms_per_turn" not in figures
    assert list(tmp_path.iterdir()) == []


def test_a_window_that_samples_locks_sees_the_admission_gate_held(postgres_url: str) -> None:
    """With ``locks`` a PostgreSQL window samples ``pg_locks`` instead of measuring the server's CPU: it took
    samples, saw the admission gate held exclusively (every admission holds it through its commit) and so
    reports how long a turn held it, and saw the backends in some state."""
    upgrade(postgres_url)
    figures = window(REPO, postgres_url, processes=2, seconds=1.0, seats=2, locks=True)
    assert figures["turns_per_s"] > 0
    assert figures["lock_samples"] > 0
    assert figures["admission_gate_exclusive_held"] > 0
    assert figures["admission_gate_exclusive_ms_per_turn"] > 0
    assert sum(value for name, value in figures.items() if name.startswith("backends_")) > 0
    assert "server_ms_per_turn" not in figures


def test_lock_sampling_refuses_a_sqlite_window(tmp_path: Path) -> None:
    """SQLite has no lock table to sample: asking for it is an error, and no window file is left behind."""
    with pytest.raises(ValueError, match="PostgreSQL"):
        window(REPO, tmp_path, processes=1, seconds=0.1, seats=1, locks=True)
    assert list(tmp_path.iterdir()) == []


def test_the_sampler_names_backend_states_and_reads_libpq_urls() -> None:
    """A backend not running a statement waits for its connector (idle); a running one is on the CPU unless
    it waits, named by the wait's kind. A SQLAlchemy URL becomes a libpq one with the password kept."""
    assert backend_state("idle in transaction", None) == "idle"
    assert backend_state("active", None) == "on_cpu"
    assert backend_state("active", "Lock") == "lock"
    assert backend_state("active", "LWLock") == "lwlock"
    assert backend_state("active", "IO") == "io"
    assert backend_state("active", "Client") == "other"
    dsn, database = libpq_dsn("postgresql+psycopg://user:secret@db.example:6543/plane")
    assert (dsn, database) == ("postgresql://user:secret@db.example:6543/plane", "plane")
    with pytest.raises(ValueError, match="no database"):
        libpq_dsn("postgresql+psycopg://user@db.example")
