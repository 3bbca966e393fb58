"""What the block of a turn may decide, shared by the sync and the asyncio turn."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

import attrs

from ..errors import InvalidInputError
from ..signals import RetryAfter, as_retry_after
from ..states import FailureCategory, RequestState
from ..values import LiveTurnCompletion, LiveTurnFailure, Usage


class TurnDecisions:
    """The outcome the block chooses (``complete``, ``cancel``, ``fail``) and the time it waited."""

    _completion: LiveTurnCompletion
    _usage: Usage | None = None
    enqueued_at: int | None
    admitted_at: int | None

    def record_usage(self, usage: Usage | None = None, *, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Record what the provider reported the turn used (a :class:`~admission_plane.Usage`, or its two counts).

        When the block exits, the turn's budget reservation is settled to it instead of to its
        estimate, whatever the outcome. A later call replaces an earlier one. Bad counts raise
        :class:`~admission_plane.errors.InvalidInputError` here, in the block.
        """
        given: object = usage  # checked as given
        if given is None:
            usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens)
        elif not isinstance(given, Usage) or input_tokens or output_tokens:
            raise InvalidInputError("record_usage takes a Usage or the two token counts, not both")
        self._usage = usage

    @property
    def usage(self) -> Usage | None:
        """What :meth:`record_usage` recorded (``None``: nothing)."""
        return self._usage

    def _settled_completion(self) -> LiveTurnCompletion:
        """The outcome the block chose, with the usage it recorded."""
        if self._usage is None:
            return self._completion
        return attrs.evolve(self._completion, usage=self._usage)

    def complete(self) -> None:
        """End the turn ``completed`` when the block exits (the default)."""
        self._completion = LiveTurnCompletion(RequestState.COMPLETED)

    def cancel(self) -> None:
        """End the turn ``cancelled`` when the block exits (this is not task or thread cancellation)."""
        self._completion = LiveTurnCompletion(RequestState.CANCELLED)

    def fail(
        self,
        category: FailureCategory | str = FailureCategory.UNKNOWN,
        *,
        http_status: int | None = None,
        code: str | None = None,
        reason: str | None = None,
        retry_after: RetryAfter | float | timedelta | datetime | str | Mapping[str, str] | None = None,
    ) -> None:
        """End the turn ``failed``; ``provider_capacity`` cools its provider/model down for every connector.

        ``retry_after`` is when the provider said to come back (seconds, a timedelta, an aware
        datetime, a ``Retry-After`` value, or the response's headers, read by
        :func:`admission_plane.signals.retry_after_from_headers`): the cooldown then lasts until
        then, capped by the policy's ``max_cooldown_ms``. A malformed signal raises
        :class:`~admission_plane.errors.InvalidInputError` here, in the block.
        """
        failure = LiveTurnFailure(
            category, http_status=http_status, code=code, reason=reason, retry_after=as_retry_after(retry_after)
        )
        self._completion = LiveTurnCompletion(RequestState.FAILED, failure)

    @property
    def waited_ms(self) -> int | None:
        """Milliseconds from enqueue to admission (``None`` before admission)."""
        if self.enqueued_at is None or self.admitted_at is None:
            return None
        return max(0, self.admitted_at - self.enqueued_at)
