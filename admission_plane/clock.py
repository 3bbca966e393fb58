"""The plane's clock: integer milliseconds since the epoch, as every operation takes ``now``."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "wall_clock_ms"]

#: A source of ``now``: integer milliseconds since the epoch.
Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """Milliseconds since the epoch, from the system clock."""
    return time.time_ns() // 1_000_000
