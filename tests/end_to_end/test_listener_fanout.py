"""``benchmarks.listener_fanout``: a window rings the probe channel while idle connections listen.

Nothing here looks at how fast. The window checks for itself that every listener heard every notification (it
raises otherwise), and reports the server's CPU per ring, read from ``/proc``. Without a PostgreSQL server on this
machine the test skips (and fails under ``CI=true``).
"""

from __future__ import annotations

from gates import require

from benchmarks._lock_sampler import libpq_dsn
from benchmarks.cpu_split import server_cpu_seconds
from benchmarks.listener_fanout import window


def test_every_listener_hears_every_ring_of_a_window(postgres_url: str) -> None:
    """Three idle listeners and twenty ringing commits: the window completes (so each listener heard all twenty
    and the warm-up's), and reports what it measured."""
    require(server_cpu_seconds() > 0, "no PostgreSQL server process on this machine")
    figures = window(libpq_dsn(postgres_url)[0], listeners=3, rings=20)
    assert figures["listeners"] == 3
    assert figures["rings"] == 20
    assert figures["server_ms_per_ring"] >= 0
    assert figures["wall_s"] > 0
