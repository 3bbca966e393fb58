"""``AsyncAdmissionPlane``: an :class:`~admission_plane.AdmissionPlane` for asyncio code.

It sits above both :class:`~admission_plane.aio.AsyncTurn` and the service it is built on
(:class:`~admission_plane.aio.AsyncAdmissionService`), and only adds the two turn shortcuts,
so the turn's module never imports this one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._service import AsyncAdmissionService
from ._turn import AsyncTurn

__all__ = ["AsyncAdmissionPlane"]

T = TypeVar("T")


class AsyncAdmissionPlane(AsyncAdmissionService):
    """An :class:`~admission_plane.AdmissionPlane` for asyncio code (see :mod:`admission_plane.aio`).

    Every operation of :class:`~admission_plane.aio.AsyncAdmissionService` (opening, wrapping,
    :meth:`~AsyncAdmissionService.call`, :meth:`~AsyncAdmissionService.wait_for_admission`,
    :meth:`~AsyncAdmissionService.aclose`), plus :meth:`turn` and :meth:`run_turn`.
    """

    def turn(self, **options: Any) -> AsyncTurn:
        """An :class:`AsyncTurn` on this plane: ``async with aplane.turn(...) as turn: ...``.

        The options are those of :class:`admission_plane.turns.Turn` (see :class:`AsyncTurn`
        for the few that are coroutine functions here).
        """
        return AsyncTurn(self, **options)

    async def run_turn(self, handler: Callable[[AsyncTurn], Awaitable[T]], **options: Any) -> T:
        """Await ``handler(turn)`` inside an active turn and return its result (the turn settles as in
        :class:`AsyncTurn`)."""
        async with AsyncTurn(self, **options) as active:
            return await handler(active)
