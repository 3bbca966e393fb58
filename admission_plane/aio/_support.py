"""Running a step to its end although the task awaiting it is cancelled, and calling optional coroutines."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def settle(step: Awaitable[T]) -> T:
    """Await ``step`` to its end even if the caller is cancelled meanwhile, then re-raise that cancellation.

    A transaction running in a worker thread cannot be stopped half-way, and the turn must
    know whether it committed (a lease taken, a dispatch intent written) to settle the
    request correctly; so a cancellation is acted on between steps, never inside one.
    The caller's own ``CancelledError`` is re-raised (not a new one), so ``asyncio.timeout``
    and anyio cancel scopes still recognise it as theirs.
    """
    task = asyncio.ensure_future(step)
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError as error:
            if task.cancelled():
                raise  # the step itself was cancelled (by its own code): nothing left to wait for
            cancelled = error  # ours, not the step's: look again (a finished step answers at once)
            continue
        except BaseException:
            if cancelled is not None:
                raise cancelled  # noqa: B904 - the cancellation wins, the step's error is its context
            raise
        if cancelled is not None:
            raise cancelled
        return result


async def maybe_await(value: object) -> None:
    """Await ``value`` if a callback returned an awaitable (callbacks may be plain or ``async``)."""
    if inspect.isawaitable(value):
        await value
