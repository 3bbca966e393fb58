"""``AsyncTurn``: one agent turn driven through the lifecycle by ``async with`` (see :mod:`admission_plane.aio`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

from ..clock import wall_clock_ms
from ..errors import AdmissionError, AdmissionStateError, InvalidInputError, LeaseFenceError, UnknownLeaseError
from ..evidence import capture
from ..states import PromptChannel, RequestState
from ..turns._decisions import TurnDecisions
from ..turns._support import (
    DEFAULT_FINGERPRINT,
    Backoff,
    DispatchRefusedError,
    TurnNotAdmittedError,
    check_turn,
    payload_expiry,
    withdraw,
)
from ..turns._turn import _RETRYABLE_START_REFUSALS, _Stage
from ..values import AdmittedLease, DispatchRecord, LiveTurnCompletion, QueueSnapshot
from ._child import Process, spawn_child, terminate, write_to_stdin
from ._service import AsyncAdmissionService
from ._support import maybe_await, settle

S = RequestState
#: Errors that mean "stopped from outside" rather than "went wrong": the turn ends ``cancelled``.
_STOPPED = (KeyboardInterrupt, asyncio.CancelledError)
Progress = Callable[["AsyncTurn", str], object]
Spawn = Callable[[], "Awaitable[Process | int] | Process | int"]
WritePrompt = Callable[["AsyncTurn", str], Awaitable[object]]


async def _write_to_stdin(turn: AsyncTurn, prompt: str) -> None:
    await write_to_stdin(turn.child, prompt)


class AsyncTurn(TurnDecisions):
    """One agent turn driven through the lifecycle by ``async with`` (see :mod:`admission_plane.aio`).

    The options, attributes and outcomes are those of :class:`admission_plane.turns.Turn`,
    except that ``child`` is an :class:`asyncio.subprocess.Process`; ``spawn`` may return one
    (or a pid, or an awaitable of either); ``write_prompt(turn, prompt)`` and ``sleep(seconds)``
    are coroutine functions; ``progress`` may be a plain or a coroutine function.
    """

    def __init__(
        self,
        plane: AsyncAdmissionService,
        *,
        request_id: str,
        session_id: str,
        agent_id: str,
        provider: str,
        model: str,
        prompt: str,
        lane: str | None = None,
        estimated_tokens: int | None = None,
        command: Sequence[str] | None = None,
        spawn: Spawn | None = None,
        write_prompt: WritePrompt | None = None,
        fingerprint: str = DEFAULT_FINGERPRINT,
        prompt_channel: PromptChannel | str = PromptChannel.STDIN,
        progress: Progress | None = None,
        wait_timeout_ms: int | None = None,
        start_timeout_ms: int = 60_000,
        backoff: Backoff | None = None,
        heartbeat_interval_ms: int = 1_000,
        payload_grace_ms: int = 300_000,
        clock: Callable[[], int] = wall_clock_ms,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        checked = check_turn(
            {
                "request_id": request_id,
                "session_id": session_id,
                "agent_id": agent_id,
                "fingerprint": fingerprint,
                "provider": provider,
                "model": model,
                "lane": lane,
                "estimated_tokens": estimated_tokens,
            },
            prompt=prompt,
            command=command,
            spawn=spawn,
            prompt_channel=prompt_channel,
            heartbeat_interval_ms=heartbeat_interval_ms,
            payload_grace_ms=payload_grace_ms,
            wait_timeout_ms=wait_timeout_ms,
            start_timeout_ms=start_timeout_ms,
            backoff=backoff,
            hooks={"clock": clock, "sleep": sleep, "progress": progress, "spawn": spawn, "write_prompt": write_prompt},
        )
        self.prompt_channel = checked.prompt_channel
        self._metadata = checked.metadata
        self.aplane = plane
        self.plane = plane.plane
        self.request_id = request_id
        self._prompt: str | None = prompt
        self._command = None if checked.argv is None else list(checked.argv)
        self._spawn = spawn
        self._write_prompt: WritePrompt = write_prompt or _write_to_stdin
        self._progress = progress
        self._wait_timeout_ms = wait_timeout_ms
        self._start_timeout_ms = start_timeout_ms
        self._backoff = backoff or Backoff()
        self._heartbeat_interval_s = heartbeat_interval_ms / 1000
        self._payload_grace_ms = payload_grace_ms
        self._clock = clock
        self._sleep = sleep
        self._stage = _Stage.NEW
        self._completion = LiveTurnCompletion(S.COMPLETED)
        self._heartbeat: asyncio.Task[None] | None = None
        self.lease: AdmittedLease | None = None
        self.snapshot: QueueSnapshot | None = None
        self.enqueued_at: int | None = None
        self.admitted_at: int | None = None
        self.child: Process | None = None
        self.pid: int | None = None
        self.lease_lost = False
        self.state: RequestState | None = None

    def __repr__(self) -> str:
        return f"<AsyncTurn {self.state or self._stage_name()}>"

    # --- the lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> AsyncTurn:
        if self._stage != _Stage.NEW:
            raise AdmissionStateError("a turn can be entered only once")
        try:
            await self._enqueue()
            if self.lease is None:
                await self._wait_for_admission()
            self._start_heartbeat()
            await self._start()
            await self._dispatch()
        except BaseException as error:
            await self._unwind(error)
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc is not None:
            await self._unwind(exc)
            return
        await settle(self._complete())

    async def _complete(self) -> None:
        try:
            await self._stop_heartbeat()
            await terminate(self.child)
            assert self.lease is not None
            await self._call(self.plane.complete_live_turn, self.lease, self._clock(), self._settled_completion())
        except BaseException as error:
            await self._settle_after(error)
            raise
        await self._finish(self._completion.outcome)

    async def _enqueue(self) -> None:
        now = self._clock()
        prompt, self._prompt = self._prompt, None
        assert prompt is not None
        expires_at = payload_expiry(self.plane.policy.queue_timeout_ms, now, self._payload_grace_ms)

        def enqueue() -> None:
            owner = self.plane.owner_identity.owner_instance_id
            result = self.plane.enqueue_with_payload(
                **self._metadata, now=now, plaintext=prompt, expires_at=expires_at, admit_as=owner
            )
            self.enqueued_at = now  # in the worker thread: a cancellation meanwhile still sees the stage
            self._stage = _Stage.QUEUED
            if result.admitted is not None:  # admitted with its enqueue: adopted here, as a wait's lease is
                self._adopt(result.admitted)

        await self.aplane.call(enqueue)
        await self._report("enqueued")
        if self.lease is not None:
            await self._report(S.ADMITTED)

    def _adopt(self, lease: AdmittedLease) -> None:
        self.lease, self.admitted_at = lease, self._clock()
        self._stage = _Stage.LEASED

    async def _wait_for_admission(self) -> None:
        async def on_wait(now: int) -> None:
            self.snapshot = await self._call(self.plane.get_queue_snapshot, self.request_id, now)
            await self._report(S.QUEUED)

        lease = await self.aplane._wait(
            self.request_id,
            self.plane.owner_identity.owner_instance_id,
            timeout_ms=self._wait_timeout_ms,
            initial_delay_ms=self._backoff.initial_ms,
            max_delay_ms=self._backoff.max_ms,
            sleep=self._sleep,
            on_wait=on_wait,
            adopt=self._adopt,
            start=True,
        )
        if lease is None:
            stored = await self._call(self.plane.get_request, self.request_id)
            if stored is None or stored.state is not S.QUEUED:
                state = "absent" if stored is None else str(stored.state)
                raise TurnNotAdmittedError(f"the request left the queue without being admitted here ({state})")
            raise TurnNotAdmittedError("timed out waiting for admission")
        await self._report(S.ADMITTED)

    async def _start(self) -> None:
        assert self.lease is not None
        if self.lease.starting:  # started by its admission (``wait_for_admission(start=True)``)
            await self._report(S.STARTING)
            return
        started = self._clock()
        delays = self._backoff.delays()
        while True:
            now = self._clock()
            try:
                await self._call(self.plane.mark_starting, self.lease, now)
            except AdmissionStateError as error:
                if str(error) not in _RETRYABLE_START_REFUSALS or now - started >= self._start_timeout_ms:
                    raise
                await self._sleep(next(delays))
                continue
            await self._report(S.STARTING)
            return

    async def _dispatch(self) -> None:
        assert self.lease is not None
        await settle(self._spawn_child())
        assert self.pid is not None
        record = DispatchRecord.for_lease(
            self.lease, self.plane.owner_identity, capture(self.pid), prompt_channel=self.prompt_channel
        )
        result = await self._call(self.plane.commit_dispatch_intent, record)
        if not result.ok:
            raise DispatchRefusedError(result.reason)
        await self._report(S.DISPATCH_INTENT)
        prompt = await self._call(self.plane.read_payload, self.request_id, self._clock())
        self._stage = _Stage.WRITING
        await self._write_prompt(self, prompt)
        del prompt
        await self._call(self.plane.mark_active, self.lease, self._clock())
        await self._report(S.ACTIVE)

    async def _spawn_child(self) -> None:
        # Run to its end under cancellation (see settle): a started child is always known, so stopped.
        if self._command is not None:
            spawned: object = await spawn_child(self._command)
        else:
            assert self._spawn is not None
            spawned = self._spawn()  # checked as returned: a spawn callable may return anything
            if asyncio.iscoroutine(spawned) or isinstance(spawned, asyncio.Future):
                spawned = await spawned
        if isinstance(spawned, Process):
            self.child, self.pid = spawned, spawned.pid
        elif isinstance(spawned, int) and not isinstance(spawned, bool):
            self.pid = spawned
        else:
            raise InvalidInputError("spawn must return an asyncio.subprocess.Process or a pid")

    # --- settling after an error or a cancellation: the sync turn's rules, never a requeue ------------
    # Queued: the request is cancelled. Admitted but no byte of the prompt written: the lease is abandoned
    # (``cancelled`` for a task cancellation, a time-out or ``KeyboardInterrupt``, else ``failed``) and the
    # seat is free. The write began: the execution is ``recovery_required`` and the seat stays held. The whole
    # settlement runs to its end although the task is cancelled again meanwhile (see ``_support.settle``).

    async def _unwind(self, error: BaseException) -> None:
        """Settle after ``error`` (which the caller re-raises), to the end whatever happens meanwhile."""
        await settle(self._settle_after(error))

    async def _settle_after(self, error: BaseException) -> None:
        """Settle the request after ``error`` without ever requeueing it; notes cleanup failures on ``error``."""
        stage = self._stage
        self._stage = _Stage.DONE
        await self._stop_heartbeat()
        try:
            if stage == _Stage.QUEUED:
                await self._cancel_queued()
            elif stage == _Stage.LEASED:
                await terminate(self.child)
                outcome = S.CANCELLED if isinstance(error, _STOPPED) else S.FAILED
                assert self.lease is not None
                await self._call(self.plane.abandon_before_prompt, self.lease, self._clock(), outcome)
                await self._finish(outcome)
            elif stage == _Stage.WRITING:
                assert self.lease is not None
                await self._call(self.plane.mark_execution_recovery_required, self.lease, self._clock())
                await terminate(self.child)
                await self._finish(S.RECOVERY_REQUIRED)
        except Exception as cleanup_error:  # noqa: BLE001 - the caller must see the original error
            error.add_note(f"admission-plane: settling the turn failed too: {cleanup_error}")
            await terminate(self.child)

    async def _cancel_queued(self) -> None:
        settled, stored = await self.aplane.call(withdraw, self.plane, self.request_id, self._clock())
        if settled is not None:
            await self._finish(settled)
        else:
            self.state = stored

    async def _finish(self, state: RequestState) -> None:
        """Record the final ``state`` and report it to ``progress``."""
        self._stage = _Stage.DONE
        self.state = state
        await self._report(state)

    # --- heartbeats and progress ----------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._heartbeat = asyncio.get_running_loop().create_task(
            self._heartbeat_loop(), name=f"admission-plane-heartbeat-{id(self):x}"
        )

    async def _heartbeat_loop(self) -> None:
        lease = self.lease
        assert lease is not None
        while True:
            await asyncio.sleep(self._heartbeat_interval_s)
            try:
                await self._call(self.plane.heartbeat, lease, self._clock())
            except (LeaseFenceError, UnknownLeaseError):
                self.lease_lost = True
                return
            except AdmissionError:
                continue  # contention or a transient fault: the next beat tries again

    async def _stop_heartbeat(self) -> None:
        task, self._heartbeat = self._heartbeat, None
        if task is None or task is asyncio.current_task():
            return
        task.cancel()
        # Wait for a beat in flight to end, as the sync API joins its thread; its outcome is not news.
        await asyncio.wait({task})

    async def _report(self, phase: str) -> None:
        if self._progress is not None:
            await maybe_await(self._progress(self, str(phase)))

    async def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        return await self.aplane.call(lambda: function(*args))

    def _stage_name(self) -> str:
        return {0: "new", 1: "queued", 2: "leased", 3: "writing", 4: "done"}[self._stage]
