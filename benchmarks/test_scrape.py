"""The cost of a ``/metrics`` scrape and of a dashboard view at a deep queue (issue 15).

D = 100 000 queued requests (1 000 in quick mode) spread over 2 lanes × 4 provider/model
keys × 16 agents, 3 seats held (``active``), on an SQLite file on the real disk. One
measurement is what the server does per scrape: one reading of the plane (the queue by
lane and key through the ``(state, enqueued_at)`` index, requests in the states that are
not history, seat-holding leases, cooldowns, the live policy and the pauses, and the
journal since the previous scrape) and its text exposition; or the dashboard's JSON view
of the same reading. The first reading of a server reads the whole journal once; it is
timed separately (``cold``) and reported in ``extra_info``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from ._queue import Queued, Spec, bulk_queue
from ._support import QUICK, migrated, open_plane, wall_ms
from .test_depth import _hold_seat

DEPTH = 1_000 if QUICK else 100_000
LANES = ("default", "batch")
KEYS = (("prov-a", "model-1"), ("prov-a", "model-2"), ("prov-b", "model-1"), ("prov-b", "model-2"))
AGENTS = 16


class _Served:
    def __init__(self, plane: Any, cold_s: float) -> None:
        from admission_plane.web._readings import Reader

        self.plane = plane
        self.reader = Reader(plane, handle_key=b"k" * 32)
        started = time.perf_counter()
        self.reader.read(wall_ms())
        self.cold_s = time.perf_counter() - started
        self.bulk_s = cold_s


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Served]:
    """A plane with D queued requests and 3 held seats, and a reader that has already read the journal once."""
    path = migrated(tmp_path_factory.mktemp("scrape") / "scrape.sqlite")
    start = wall_ms()
    with open_plane(path) as plane:
        for seat in range(3):
            _hold_seat(plane, f"held-{seat}", seat, start + 10 * seat)
        items = []
        for index in range(DEPTH):
            provider, model = KEYS[index % len(KEYS)]
            spec = Spec(lane=LANES[index % 2], provider=provider, model=model, agent=f"agent-{index % AGENTS}")
            items.append(Queued(f"queued-{index:06d}", spec, start + 100 + index // 10))
        began = time.perf_counter()
        bulk_queue(path, items, plane.owner_identity.owner_instance_id)
        yield _Served(plane, time.perf_counter() - began)


def test_metrics_scrape_at_depth(benchmark: Any, served: _Served) -> None:
    """One /metrics scrape (reading + exposition) at depth D; the exposition shows the whole queue."""
    from admission_plane.web._metrics import exposition

    def scrape() -> bytes:
        began = time.perf_counter()
        reading = served.reader.read(wall_ms())
        return exposition(reading, time.perf_counter() - began)

    text = benchmark.pedantic(scrape, rounds=5 if QUICK else 30, iterations=1, warmup_rounds=1)
    assert b"admission_plane_queue_requests %d.0" % DEPTH in text
    assert b"admission_plane_seats_in_use 3.0" in text
    if benchmark.extra_info is not None:
        benchmark.extra_info.update({"depth": DEPTH, "cold_first_reading_s": served.cold_s})
    print(f"\nscrape at D={DEPTH}: first (cold, whole journal) reading {served.cold_s * 1000:.1f} ms")


def test_dashboard_view_at_depth(benchmark: Any, served: _Served) -> None:
    """One dashboard view (reading + JSON view) at depth D; every lane and key is listed."""
    from admission_plane.web._snapshot import view

    data = benchmark.pedantic(
        lambda: view(served.reader.read(wall_ms())), rounds=5 if QUICK else 30, iterations=1, warmup_rounds=1
    )
    assert data["queue"]["depth"] == DEPTH
    assert len(data["queue"]["groups"]) == len(LANES) * len(KEYS) // 2 * 2 or len(data["queue"]["groups"]) >= 4
