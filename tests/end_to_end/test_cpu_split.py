"""``benchmarks.cpu_split``: one window on a real PostgreSQL database reports its turns and both CPU shares.

Nothing here looks at how fast: the window must complete turns, its workers must report CPU, and the
server's CPU, read from ``/proc``, must have grown with them. Without a PostgreSQL server running on this
machine the test skips (and fails under ``CI=true``).
"""

from __future__ import annotations

from gates import require

from admission_plane.migrate import upgrade
from benchmarks._support import REPO
from benchmarks.cpu_split import server_cpu_seconds, window


def test_a_window_reports_turns_and_the_client_and_server_cpu_they_cost(postgres_url: str) -> None:
    """A short window at P = 1 completes turns; each cost the worker and the server some CPU."""
    require(server_cpu_seconds() > 0, "no PostgreSQL server process on this machine")
    upgrade(postgres_url)
    figures = window(REPO, postgres_url, processes=1, seconds=0.5, seats=2)
    assert figures["turns_per_s"] > 0
    assert figures["client_ms_per_turn"] > 0
    assert figures["server_ms_per_turn"] > 0
