"""The admission policy value object.

Defaults are the 2.2.0 connector's: 8 seats, 8 concurrent starts, 2 s between starts,
a 30 min queue timeout and a 30 s capacity cooldown. Seats and starts accept any
integer >= 1; the other fields any non-negative integer in memory. The durable
``policy_state`` row is stricter (see :data:`DURABLE_BOUNDS`).
"""

from __future__ import annotations

from typing import Any

import attrs

from ._validate import is_safe_integer
from .errors import InvalidInputError

DEFAULT_MAX_ACTIVE_TURNS = 8
DEFAULT_MAX_CONCURRENT_STARTS = 8
DEFAULT_MIN_START_INTERVAL_MS = 2_000
DEFAULT_QUEUE_TIMEOUT_MS = 1_800_000
DEFAULT_CAPACITY_COOLDOWN_MS = 30_000


def _non_negative(instance: Any, attribute: attrs.Attribute[int], value: Any) -> None:
    if not is_safe_integer(value) or value < 0:
        raise InvalidInputError(f"invalid admission policy {attribute.name}")


def _at_least_one(instance: Any, attribute: attrs.Attribute[int], value: Any) -> None:
    if not is_safe_integer(value) or value < 1:
        raise InvalidInputError(f"invalid admission policy {attribute.name}")


@attrs.frozen
class Policy:
    """How many turns may be in flight, how fast they may start, and how long they may wait.

    Raises :class:`~admission_plane.errors.InvalidInputError` on construction when a
    field is not a (non-negative, or for the two limits positive) integer.
    """

    max_active_turns: int = attrs.field(default=DEFAULT_MAX_ACTIVE_TURNS, validator=_at_least_one)
    max_concurrent_starts: int = attrs.field(default=DEFAULT_MAX_CONCURRENT_STARTS, validator=_at_least_one)
    min_start_interval_ms: int = attrs.field(default=DEFAULT_MIN_START_INTERVAL_MS, validator=_non_negative)
    queue_timeout_ms: int = attrs.field(default=DEFAULT_QUEUE_TIMEOUT_MS, validator=_non_negative)
    capacity_cooldown_ms: int = attrs.field(default=DEFAULT_CAPACITY_COOLDOWN_MS, validator=_non_negative)

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        """The seed's normalized policy tuple (the order the fingerprint hashes)."""
        return (
            self.max_active_turns,
            self.max_concurrent_starts,
            self.min_start_interval_ms,
            self.queue_timeout_ms,
            self.capacity_cooldown_ms,
        )

    def check_durable(self) -> None:
        """Refuse a policy the durable ``policy_state`` row's CHECK constraints would reject.

        The seed lets the database raise a raw constraint error here; we refuse first,
        with a clear message, and write nothing.
        """
        for name, (low, high) in DURABLE_BOUNDS.items():
            value = getattr(self, name)
            if value < low or (high is not None and value > high):
                bound = f">= {low}" if high is None else f"in {low}..{high}"
                raise InvalidInputError(f"durable admission policy {name} must be {bound}")


#: Bounds enforced by the ``policy_state`` CHECK constraints: name -> (minimum, maximum or None).
DURABLE_BOUNDS: dict[str, tuple[int, int | None]] = {
    "max_active_turns": (1, None),
    "max_concurrent_starts": (1, None),
    "min_start_interval_ms": (2_000, None),
    "queue_timeout_ms": (1, 1_800_000),
    "capacity_cooldown_ms": (30_000, None),
}
