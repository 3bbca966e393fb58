"""The turn API's options and errors."""

from __future__ import annotations

import random
from collections.abc import Iterator

import attrs

from ..errors import AdmissionStateError

#: The request fingerprint used when the caller gives none (it is stored in clear: never derive it from the prompt).
DEFAULT_FINGERPRINT = "admission-plane.turn/1"


class TurnNotAdmittedError(AdmissionStateError):
    """The request left the queue without being admitted here (timed out, cancelled, taken by another owner)."""


class DispatchRefusedError(AdmissionStateError):
    """The dispatch intent was not committed (``reason`` as in :class:`~admission_plane.DispatchIntentResult`)."""

    def __init__(self, reason: str | None) -> None:
        super().__init__(f"dispatch intent was not committed: {reason}")
        self.reason = reason


@attrs.frozen
class Backoff:
    """Polling delays: ``initial_ms``, multiplied by ``factor`` up to ``max_ms``, with +/- ``jitter``.

    Waiting for admission uses ``initial_ms`` and ``max_ms`` as
    :meth:`AdmissionPlane.wait_for_admission`'s ``initial_delay_ms`` and ``max_delay_ms``;
    waiting for a start slot uses all four.
    """

    initial_ms: int = 10
    factor: float = 1.6
    max_ms: int = 250
    jitter: float = 0.2

    def delays(self) -> Iterator[float]:
        """Yield successive delays in seconds, forever."""
        delay = float(self.initial_ms)
        while True:
            spread = delay * self.jitter
            yield max(0.0, delay + random.uniform(-spread, spread)) / 1000  # noqa: S311 - jitter, not secrecy
            delay = min(delay * self.factor, float(self.max_ms))
