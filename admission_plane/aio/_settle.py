"""How an async turn settles after an error or a cancellation: the sync turn's rules, never a requeue.

Queued: the request is cancelled. Admitted but no byte of the prompt written: the lease is
abandoned (``cancelled`` for a task cancellation, a time-out or ``KeyboardInterrupt``, else
``failed``) and the seat is free. The write began: the execution is ``recovery_required``
and the seat stays held. The whole settlement runs to its end although the task is
cancelled again meanwhile (see :func:`~admission_plane.aio._support.settle`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..states import RequestState
from ..turns._turn import _Stage
from ._child import terminate
from ._support import settle

if TYPE_CHECKING:
    from ._turn import AsyncTurn

S = RequestState
#: Errors that mean "stopped from outside" rather than "went wrong": the turn ends ``cancelled``.
_STOPPED = (KeyboardInterrupt, asyncio.CancelledError)


async def unwind(turn: AsyncTurn, error: BaseException) -> None:
    """Settle ``turn`` after ``error`` (which the caller re-raises), to the end whatever happens meanwhile."""
    await settle(settle_after(turn, error))


async def settle_after(turn: AsyncTurn, error: BaseException) -> None:
    """Settle the request after ``error`` without ever requeueing it; notes cleanup failures on ``error``."""
    stage = turn._stage
    turn._stage = _Stage.DONE
    await turn._stop_heartbeat()
    call = turn.aplane.call
    plane = turn.plane
    try:
        if stage == _Stage.QUEUED:
            await _cancel_queued(turn)
        elif stage == _Stage.LEASED:
            await terminate(turn.child)
            outcome = S.CANCELLED if isinstance(error, _STOPPED) else S.FAILED
            lease = turn.lease
            assert lease is not None
            await call(plane.abandon_before_prompt, lease, turn._clock(), outcome)
            await finish(turn, outcome)
        elif stage == _Stage.WRITING:
            lease = turn.lease
            assert lease is not None
            await call(plane.mark_execution_recovery_required, lease, turn._clock())
            await terminate(turn.child)
            await finish(turn, S.RECOVERY_REQUIRED)
    except Exception as cleanup_error:  # noqa: BLE001 - the caller must see the original error
        error.add_note(f"admission-plane: settling the turn failed too: {cleanup_error}")
        await terminate(turn.child)


async def _cancel_queued(turn: AsyncTurn) -> None:
    plane = turn.plane
    request_id = turn.request_id
    now = turn._clock()
    owner = plane.owner_identity.owner_instance_id

    def cancel() -> RequestState | None:
        stored = plane.get_request(request_id)
        if stored is not None and stored.state is S.QUEUED:
            plane.cancel_queued(request_id, now)
            return S.CANCELLED
        # An admission may have committed although its call raised: find our lease and abandon it.
        for dispatch in plane.list_recoverable_dispatches():
            mine = dispatch.request_id == request_id and dispatch.fence.owner_instance_id == owner
            if mine and dispatch.phase is S.ADMITTED:
                plane.abandon_before_prompt(dispatch.fence, now, S.FAILED)
                return S.FAILED
        turn.state = None if stored is None else stored.state
        return None

    settled = await turn.aplane.call(cancel)
    if settled is not None:
        await finish(turn, settled)


async def finish(turn: AsyncTurn, state: RequestState) -> None:
    """Record the final ``state`` and report it to ``progress``."""
    turn._stage = _Stage.DONE
    turn.state = state
    await turn._report(state)
