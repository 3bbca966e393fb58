"""``benchmarks.cpu_split``: one window reports its turns, the CPU they cost and the workers' context switches.

Nothing here looks at how fast: the window must complete turns, its workers must report CPU and context
switches, and on PostgreSQL the server's CPU, read from ``/proc``, must have grown with them. Without a
PostgreSQL server running on this machine the PostgreSQL test skips (and fails under ``CI=true``).
"""

from __future__ import annotations

from pathlib import Path

from gates import require

from admission_plane.migrate import upgrade
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
