"""``AsyncAdmissionService``: the operations of an :class:`~admission_plane.AdmissionPlane` for asyncio code.

:class:`~admission_plane.aio.AsyncTurn` is built on it, and :class:`~admission_plane.aio.AsyncAdmissionPlane`
adds the turn shortcuts on top, as the sync :class:`~admission_plane.AdmissionPlane` does over
:class:`~admission_plane.service.AdmissionService`: the turn's module never imports the plane's.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Self, TypeVar

from sqlalchemy import URL, Engine

from .. import _validate as v
from ..errors import InvalidInputError
from ..plane import AdmissionPlane
from ..service import AdmissionService
from ..service._waiting import DOORBELL_FALLBACK_MS
from ..states import RequestState
from ..values import AdmittedLease
from ._bell import AsyncBell, wait_for_admission
from ._support import settle

T = TypeVar("T")
#: Worker threads of a plane's executor: enough to overlap a look with a heartbeat and a write;
#: SQLite serialises writers anyway, and every thread holds one pooled connection at most.
DEFAULT_WORKERS = 4
#: How often the shared doorbell reader reads the counters while anyone waits (ms).
DEFAULT_BELL_INTERVAL_MS = 5


class AsyncAdmissionService:
    """The operations of an :class:`~admission_plane.AdmissionPlane` for asyncio code, without the turn API
    (see :mod:`admission_plane.aio`; :class:`~admission_plane.aio.AsyncAdmissionPlane` adds it).

    ``AsyncAdmissionPlane(plane)`` wraps an open plane (closing the async plane leaves it
    open); ``AsyncAdmissionPlane(database, **options)`` opens one with the options of
    :class:`~admission_plane.AdmissionPlane` and closes it in :meth:`aclose`. ``workers``
    threads run the transactions; one doorbell reader per event loop serves every waiter: on
    SQLite under Linux the loop watches the doorbell's file and reads the counters at each ring,
    elsewhere a task reads them every ``bell_interval_ms`` (default 5) while anyone waits.
    Use it as ``async with AsyncAdmissionPlane(...) as aplane:`` or call :meth:`aclose`.
    """

    def __init__(
        self,
        plane_or_database: AdmissionService | str | os.PathLike[str] | URL | Engine,
        /,
        *,
        workers: int = DEFAULT_WORKERS,
        bell_interval_ms: int = DEFAULT_BELL_INTERVAL_MS,
        **plane_options: Any,
    ) -> None:
        v.positive_integer(workers, "async plane workers")
        v.positive_integer(bell_interval_ms, "async plane doorbell interval")
        if isinstance(plane_or_database, AdmissionService):
            if plane_options:
                raise InvalidInputError("plane options are given when opening a plane, not when wrapping one")
            self.plane: AdmissionService = plane_or_database
            self._owns_plane = False
        else:
            self.plane = AdmissionPlane(plane_or_database, **plane_options)
            self._owns_plane = True
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="admission-plane-aio")
        self.bell = AsyncBell(self.plane._ctx.doorbell, bell_interval_ms / 1000)
        self._closed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.plane!r}>"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.aclose()

    async def call(self, function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``function(*args, **kwargs)`` (e.g. any :class:`~admission_plane.AdmissionPlane` operation)
        in the plane's executor and return its result.

        A cancellation of the caller lets the call finish first (a transaction cannot be
        stopped half-way) and is re-raised after it; the call's result is then lost.
        """
        if self._closed:
            raise InvalidInputError("the async admission plane is closed")
        loop = asyncio.get_running_loop()
        return await settle(loop.run_in_executor(self._executor, functools.partial(function, *args, **kwargs)))

    async def wait_for_admission(
        self,
        request_id: str,
        owner_instance_id: str,
        *,
        timeout_ms: int | None = None,
        initial_delay_ms: float = 1.0,
        max_delay_ms: float = 4.0,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        on_wait: Callable[[int], object] | None = None,
        fallback_ms: int = DOORBELL_FALLBACK_MS,
        start: bool = False,
    ) -> AdmittedLease | None:
        """:meth:`AdmissionPlane.wait_for_admission <admission_plane.AdmissionPlane.wait_for_admission>`
        without blocking the event loop: the same options, result and errors.

        ``sleep`` is a coroutine function (used only while there is no doorbell);
        ``on_wait(now)`` may be a plain or a coroutine function. If the caller is cancelled
        while an admission it will never see commits, that lease is abandoned (the request
        ends ``cancelled``, the seat is free) before the cancellation is re-raised.
        """
        taken: list[AdmittedLease] = []
        try:
            return await self._wait(
                request_id,
                owner_instance_id,
                timeout_ms=timeout_ms,
                initial_delay_ms=initial_delay_ms,
                max_delay_ms=max_delay_ms,
                sleep=sleep,
                on_wait=on_wait,
                fallback_ms=fallback_ms,
                adopt=taken.append,
                start=start,
            )
        except BaseException:
            if taken:
                lease = taken[0]
                await self.call(lambda: self.plane.abandon_before_prompt(lease, self.plane._ctx.now(), _CANCELLED))
            raise

    async def _wait(
        self,
        request_id: str,
        owner_instance_id: str,
        *,
        timeout_ms: int | None,
        initial_delay_ms: float,
        max_delay_ms: float,
        sleep: Callable[[float], Awaitable[object]],
        on_wait: Callable[[int], object] | None,
        fallback_ms: int = DOORBELL_FALLBACK_MS,
        adopt: Callable[[AdmittedLease], object] | None = None,
        start: bool = False,
    ) -> AdmittedLease | None:
        return await wait_for_admission(
            self.plane._ctx,
            self.bell,
            self.call,
            request_id,
            owner_instance_id,
            timeout_ms=timeout_ms,
            initial_delay_ms=initial_delay_ms,
            max_delay_ms=max_delay_ms,
            sleep=sleep,
            on_wait=on_wait,
            fallback_ms=fallback_ms,
            adopt=adopt,
            start=start,
        )

    async def aclose(self) -> None:
        """Stop the doorbell reader, wait for the transactions in flight, close the executor and, if
        this object opened the plane, the plane (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.bell.close()
        # Joining the workers (and closing the engine) blocks: do it off the loop.
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        if self._owns_plane:
            await asyncio.to_thread(self.plane.close)


_CANCELLED = RequestState.CANCELLED
