"""What a waiting connector waits for between two admission looks (``_admission.look`` answers it)."""

from __future__ import annotations

import attrs

from ..store.doorbell import EVERYONE_STEP, Chimes


@attrs.frozen
class Wake:
    """What a waiting connector waits for before its next admission look (see ``store.doorbell``).

    ``queue``: that many requests must leave the queue first (0: departures do not
    matter); ``seats``/``starts``: a freed seat / start slot; ``at``: a plane-clock time
    after which time alone may change the answer. A change for everyone always counts.

    ``first``, a hint outside equality (it says what to try after the wait, not what to wait for): the
    request is the rule's next choice and only capacity holds it back, so once what it waits for rings, an
    admission attempt is likely to succeed and may go to the server without looking first (PostgreSQL:
    one round trip instead of a look's several).
    """

    queue: int = 0
    seats: bool = False
    starts: bool = False
    at: int | None = None
    first: bool = attrs.field(default=False, eq=False)

    def rung(self, seen: Chimes, current: Chimes) -> bool:
        """Whether the counters moved from ``seen`` to ``current`` in a way this waiter cares about."""
        moved = current.since(seen)
        return (
            min(moved.queue, moved.seats, moved.starts) >= EVERYONE_STEP
            or (self.queue > 0 and moved.queue >= self.queue)
            or (self.seats and moved.seats > 0)
            or (self.starts and moved.starts > 0)
        )
