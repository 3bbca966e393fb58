"""The turn API's options and errors."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import TypedDict

import attrs

from .. import _validate as v
from ..errors import AdmissionStateError, InvalidInputError
from ..policy import DURABLE_BOUNDS
from ..service import AdmissionService
from ..states import PromptChannel, RequestState
from ..values import estimated_tokens

#: The request fingerprint used when the caller gives none (it is stored in clear: never derive it from the prompt).
DEFAULT_FINGERPRINT = "admission-plane.turn/1"


class TurnNotAdmittedError(AdmissionStateError):
    """The request left the queue without being admitted here (timed out, cancelled, taken by another owner)."""


class DispatchRefusedError(AdmissionStateError):
    """The dispatch intent was not committed (``reason`` as in :class:`~admission_plane.DispatchIntentResult`)."""

    def __init__(self, reason: str | None) -> None:
        super().__init__(f"dispatch intent was not committed: {reason}")
        self.reason = reason


def _delay(_backoff: object, attribute: attrs.Attribute[int], value: object) -> None:
    v.delay_ms(value, f"backoff {attribute.name}")


def _factor(_backoff: object, _attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= v.MAX_SAFE_INTEGER:
        raise InvalidInputError("backoff factor must be a finite number of at least 1")


def _jitter(_backoff: object, _attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise InvalidInputError("backoff jitter must be a number from 0 up to (not including) 1")


@attrs.frozen
class Backoff:
    """Polling delays: ``initial_ms``, multiplied by ``factor`` up to ``max_ms``, with +/- ``jitter``.

    Waiting for admission uses ``initial_ms`` and ``max_ms`` as
    :meth:`AdmissionPlane.wait_for_admission`'s ``initial_delay_ms`` and ``max_delay_ms``;
    waiting for a start slot uses all four. The delays must be positive finite numbers, the
    factor at least 1 and the jitter in ``[0, 1)``
    (:class:`~admission_plane.errors.InvalidInputError` otherwise).
    """

    initial_ms: int = attrs.field(default=10, validator=_delay)
    factor: float = attrs.field(default=1.6, validator=_factor)
    max_ms: int = attrs.field(default=250, validator=_delay)
    jitter: float = attrs.field(default=0.2, validator=_jitter)

    def delays(self) -> Iterator[float]:
        """Yield successive delays in seconds, forever."""
        delay = float(self.initial_ms)
        while True:
            spread = delay * self.jitter
            yield max(0.0, delay + random.uniform(-spread, spread)) / 1000  # noqa: S311 - jitter, not secrecy
            delay = min(delay * self.factor, float(self.max_ms))


def check_request(metadata: Mapping[str, object], prompt: object, command: object) -> tuple[str, ...] | None:
    """What a turn will enqueue and run, checked as given (:class:`InvalidInputError` before anything is enqueued):
    the request's metadata by enqueue's own rules, the prompt, and the ``command`` argv when given (returned as a
    tuple of strings)."""
    fields = dict(metadata)
    lane = fields.pop("lane", None)
    if lane is not None:
        v.identifier(lane, "request lane")
    if fields.pop("estimated_tokens", None) is not None:
        estimated_tokens(metadata["estimated_tokens"])
    v.request_metadata(**fields)
    v.identifier(metadata["request_id"], "event correlation input")
    v.plaintext(prompt)
    return None if command is None else v.command(command, "turn command")


def check_interval(value: object, label: str, maximum: int) -> int:
    """A turn's interval: an integer of milliseconds in ``1..maximum``."""
    if not v.is_safe_integer(value) or not 1 <= value <= maximum:
        raise InvalidInputError(f"turn {label} must be a positive integer of milliseconds (at most {maximum})")
    return value


def check_options(
    wait_timeout_ms: object, start_timeout_ms: object, backoff: object, hooks: Mapping[str, object]
) -> None:
    """A turn's waiting options and callbacks, checked as given (:class:`InvalidInputError`, before anything
    is enqueued); of the callbacks only ``progress``, ``spawn`` and ``write_prompt`` may be ``None``."""
    if wait_timeout_ms is not None:
        v.timestamp(wait_timeout_ms, "turn wait timeout")
    v.timestamp(start_timeout_ms, "turn start timeout")
    if backoff is not None and not isinstance(backoff, Backoff):
        raise InvalidInputError("turn backoff must be an admission_plane.turns.Backoff")
    for name, hook in hooks.items():
        v.hook(hook, f"turn {name}", optional=name in ("progress", "spawn", "write_prompt"))


class RequestMetadata(TypedDict):
    """The request's identity, passed as is to ``enqueue_with_payload``."""

    request_id: str
    session_id: str
    agent_id: str
    fingerprint: str
    provider: str
    model: str
    #: The policy lane (``None``: its first lane).
    lane: str | None
    #: What the turn is expected to use, reserved by budgets at admission (``None``: no estimate).
    estimated_tokens: int | None


def payload_expiry(plane_timeout_ms: int, now: int, grace_ms: int) -> int:
    """When a turn's sealed prompt expires: after the longest queue time-out the plane may apply
    (a live policy may raise it up to the durable bound), plus the grace."""
    return now + max(plane_timeout_ms, DURABLE_BOUNDS["queue_timeout_ms"][1] or 0) + grace_ms


@attrs.frozen
class CheckedTurn:
    """A turn's options once :func:`check_turn` accepted them."""

    metadata: RequestMetadata
    argv: tuple[str, ...] | None
    prompt_channel: PromptChannel


def check_turn(
    metadata: RequestMetadata,
    *,
    prompt: object,
    command: object,
    spawn: object,
    prompt_channel: PromptChannel | str,
    heartbeat_interval_ms: object,
    payload_grace_ms: object,
    wait_timeout_ms: object,
    start_timeout_ms: object,
    backoff: object,
    hooks: Mapping[str, object],
) -> CheckedTurn:
    """Every option of a turn (sync or asyncio), checked as given before anything is enqueued."""
    if (command is None) == (spawn is None):
        raise InvalidInputError("turn needs exactly one of command and spawn")
    if not isinstance(prompt, str):
        raise InvalidInputError("turn prompt must be a string")
    argv = check_request(metadata, prompt, command)
    # The heartbeat waits this long at a time (a timer refuses more than MAX_TIMER_MS).
    check_interval(heartbeat_interval_ms, "heartbeat interval", v.MAX_TIMER_MS)
    check_interval(payload_grace_ms, "payload grace", v.MAX_SAFE_INTEGER)
    check_options(wait_timeout_ms, start_timeout_ms, backoff, hooks)
    try:
        channel = PromptChannel(prompt_channel)
    except ValueError:
        raise InvalidInputError("prompt channel must be stdin or pty") from None
    return CheckedTurn(metadata, argv, channel)


def withdraw(plane: AdmissionService, request_id: str, now: int) -> tuple[RequestState | None, RequestState | None]:
    """Take a turn's request out of the queue after an error before its admission was seen (blocking; the sync
    and asyncio turns share it): cancel it if it is still queued; if an admission committed although its call
    raised, abandon that lease (``failed``). Returns the turn's final state if this settled it (else ``None``),
    and the state the request was read in (``None``: not found)."""
    stored = plane.get_request(request_id)
    if stored is not None and stored.state is RequestState.QUEUED:
        plane.cancel_queued(request_id, now)
        return RequestState.CANCELLED, stored.state
    owner = plane.owner_identity.owner_instance_id
    for dispatch in plane.list_recoverable_dispatches():
        mine = dispatch.request_id == request_id and dispatch.fence.owner_instance_id == owner
        if mine and dispatch.phase is RequestState.ADMITTED:
            plane.abandon_before_prompt(dispatch.fence, now, RequestState.FAILED)
            return RequestState.FAILED, None if stored is None else stored.state
    return None, None if stored is None else stored.state
