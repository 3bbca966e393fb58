"""``Turn``: one agent turn driven through the lifecycle by a ``with`` block (see :mod:`admission_plane.turns`)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from ..clock import wall_clock_ms
from ..errors import AdmissionError, AdmissionStateError, InvalidInputError, LeaseFenceError, UnknownLeaseError
from ..evidence import capture
from ..service import AdmissionService
from ..states import PromptChannel, RequestState
from ..values import AdmittedLease, DispatchRecord, LiveTurnCompletion, QueueSnapshot
from ._child import spawn_child, terminate, write_to_stdin
from ._decisions import TurnDecisions
from ._support import (
    DEFAULT_FINGERPRINT,
    Backoff,
    DispatchRefusedError,
    TurnNotAdmittedError,
    check_turn,
    payload_expiry,
    withdraw,
)

T = TypeVar("T")
S = RequestState

#: ``mark_starting`` refusals that clear by themselves once other turns move on.
_RETRYABLE_START_REFUSALS = frozenset({"concurrent start limit reached", "start interval has not elapsed"})

Progress = Callable[["Turn", str], object]
Spawn = Callable[[], "subprocess.Popen[bytes] | int"]
WritePrompt = Callable[["Turn", str], object]


def _write_to_stdin(turn: Turn, prompt: str) -> None:
    write_to_stdin(turn.child, prompt)


class _Stage:
    NEW = 0
    QUEUED = 1
    LEASED = 2  # a seat is held and no byte of the prompt was written
    WRITING = 3  # the write began: from here on the dispatch is never undone
    DONE = 4


class Turn(TurnDecisions):
    """One agent turn driven through the lifecycle by ``with`` (see the module docstring).

    Attributes readable in the block and afterwards: ``request_id``, ``lease``
    (:class:`~admission_plane.AdmittedLease`), ``snapshot`` (the last
    :class:`~admission_plane.QueueSnapshot` seen while queued), ``enqueued_at``,
    ``admitted_at``, ``waited_ms``, ``child`` (the :class:`subprocess.Popen`, or ``None``
    for an adopted pid), ``pid``, ``lease_lost`` (a heartbeat found the lease gone) and,
    after the block, ``state`` (the request's final :class:`~admission_plane.RequestState`).
    Every option is checked on construction (the request's metadata by enqueue's rules, the
    prompt, ``command``, intervals, callbacks): a bad one raises ``InvalidInputError``.
    """

    def __init__(
        self,
        plane: AdmissionService,
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
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if not isinstance(plane, AdmissionService):
            raise InvalidInputError("turn needs an AdmissionPlane")
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
        self.plane = plane
        self.request_id = request_id
        self._prompt: str | None = prompt
        argv = checked.argv or ()
        self._spawn: Spawn = spawn if spawn is not None else (lambda: spawn_child(argv))
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
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self.lease: AdmittedLease | None = None
        self.snapshot: QueueSnapshot | None = None
        self.enqueued_at: int | None = None
        self.admitted_at: int | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.lease_lost = False
        self.state: RequestState | None = None

    def __repr__(self) -> str:
        return f"<Turn {self.state or self._stage_name()}>"

    # --- the lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Turn:
        if self._stage != _Stage.NEW:
            raise AdmissionStateError("a turn can be entered only once")
        try:
            self._enqueue()
            if self.lease is None:
                self._wait_for_admission()
            self._start_heartbeat()
            self._start()
            self._dispatch()
        except BaseException as error:
            self._unwind(error)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc is not None:
            self._unwind(exc)
            return
        try:
            self._stop_heartbeat()
            self._terminate_child()
            assert self.lease is not None
            self.plane.complete_live_turn(self.lease, self._clock(), self._settled_completion())
        except BaseException as error:
            self._unwind(error)
            raise
        self._finish(self._completion.outcome)

    def _enqueue(self) -> None:
        now = self._clock()
        prompt, self._prompt = self._prompt, None
        assert prompt is not None
        result = self.plane.enqueue_with_payload(
            **self._metadata,
            now=now,
            plaintext=prompt,
            expires_at=payload_expiry(self.plane.policy.queue_timeout_ms, now, self._payload_grace_ms),
            admit_as=self.plane.owner_identity.owner_instance_id,
        )
        self.enqueued_at = now
        self._stage = _Stage.QUEUED
        self._report("enqueued")
        if result.admitted is not None:  # admitted with its enqueue: no wait
            self._admitted(result.admitted)

    def _wait_for_admission(self) -> None:
        def on_wait(now: int) -> None:
            self.snapshot = self.plane.get_queue_snapshot(self.request_id, now)
            self._report(S.QUEUED)

        lease = self.plane.wait_for_admission(
            self.request_id,
            self.plane.owner_identity.owner_instance_id,
            timeout_ms=self._wait_timeout_ms,
            initial_delay_ms=self._backoff.initial_ms,
            max_delay_ms=self._backoff.max_ms,
            sleep=self._sleep,
            on_wait=on_wait,
            start=True,
        )
        if lease is None:
            stored = self.plane.get_request(self.request_id)
            if stored is None or stored.state is not S.QUEUED:
                state = "absent" if stored is None else str(stored.state)
                raise TurnNotAdmittedError(f"the request left the queue without being admitted here ({state})")
            raise TurnNotAdmittedError("timed out waiting for admission")
        self._admitted(lease)

    def _admitted(self, lease: AdmittedLease) -> None:
        self.lease, self.admitted_at = lease, self._clock()
        self._stage = _Stage.LEASED
        self._report(S.ADMITTED)

    def _start(self) -> None:
        assert self.lease is not None
        if self.lease.starting:  # started by its admission (``wait_for_admission(start=True)``)
            self._report(S.STARTING)
            return
        started = self._clock()
        delays = self._backoff.delays()
        while True:
            now = self._clock()
            try:
                self.plane.mark_starting(self.lease, now)
            except AdmissionStateError as error:
                if str(error) not in _RETRYABLE_START_REFUSALS or now - started >= self._start_timeout_ms:
                    raise
                self._sleep(next(delays))
                continue
            self._report(S.STARTING)
            return

    def _dispatch(self) -> None:
        assert self.lease is not None
        spawned: object = self._spawn()  # checked as returned: a spawn callable may return anything
        if isinstance(spawned, subprocess.Popen):
            self.child, self.pid = spawned, spawned.pid
        elif isinstance(spawned, int) and not isinstance(spawned, bool):
            self.pid = spawned
        else:
            raise InvalidInputError("spawn must return a subprocess.Popen or a pid")
        record = DispatchRecord.for_lease(
            self.lease, self.plane.owner_identity, capture(self.pid), prompt_channel=self.prompt_channel
        )
        result = self.plane.commit_dispatch_intent(record)
        if not result.ok:
            raise DispatchRefusedError(result.reason)
        self._report(S.DISPATCH_INTENT)
        prompt = self.plane.read_payload(self.request_id, self._clock())
        self._stage = _Stage.WRITING
        self._write_prompt(self, prompt)
        del prompt
        self.plane.mark_active(self.lease, self._clock())
        self._report(S.ACTIVE)

    # --- failure paths --------------------------------------------------------------------------------

    def _unwind(self, error: BaseException) -> None:
        """Settle the request after ``error`` without ever requeueing it; notes cleanup failures on ``error``."""
        stage = self._stage
        self._stage = _Stage.DONE
        self._stop_heartbeat()
        try:
            if stage == _Stage.QUEUED:
                self._cancel_queued()
            elif stage == _Stage.LEASED:
                self._terminate_child()
                outcome = S.CANCELLED if isinstance(error, KeyboardInterrupt) else S.FAILED
                assert self.lease is not None
                self.plane.abandon_before_prompt(self.lease, self._clock(), outcome)
                self._finish(outcome)
            elif stage == _Stage.WRITING:
                assert self.lease is not None
                self.plane.mark_execution_recovery_required(self.lease, self._clock())
                self._terminate_child()
                self._finish(S.RECOVERY_REQUIRED)
        except Exception as cleanup_error:  # noqa: BLE001 - the caller must see the original error
            error.add_note(f"admission-plane: settling the turn failed too: {cleanup_error}")
            self._terminate_child()

    def _cancel_queued(self) -> None:
        settled, stored = withdraw(self.plane, self.request_id, self._clock())
        if settled is not None:
            self._finish(settled)
        elif stored is not None:
            self.state = stored

    def _finish(self, state: RequestState) -> None:
        self._stage = _Stage.DONE
        self.state = state
        self._report(state)

    def _terminate_child(self) -> None:
        terminate(self.child)

    # --- heartbeats and progress ----------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        thread = threading.Thread(target=self._heartbeat_loop, name=f"turn-heartbeat-{id(self):x}", daemon=True)
        self._heartbeat_thread = thread
        thread.start()

    def _heartbeat_loop(self) -> None:
        lease = self.lease
        assert lease is not None
        while not self._heartbeat_stop.wait(self._heartbeat_interval_s):
            try:
                self.plane.heartbeat(lease, self._clock())
            except (LeaseFenceError, UnknownLeaseError):
                self.lease_lost = True
                return
            except AdmissionError:
                continue  # contention or a transient fault: the next beat tries again

    def _stop_heartbeat(self) -> None:
        self._heartbeat_stop.set()
        thread = self._heartbeat_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _report(self, phase: str) -> None:
        if self._progress is not None:
            self._progress(self, str(phase))

    def _stage_name(self) -> str:
        return {0: "new", 1: "queued", 2: "leased", 3: "writing", 4: "done"}[self._stage]


def turn(plane: AdmissionService, **options: Any) -> Turn:
    """A :class:`Turn` on ``plane``: use it as ``with turn(plane, ...) as t:`` (see :class:`Turn`)."""
    return Turn(plane, **options)


def run_turn(plane: AdmissionService, handler: Callable[[Turn], T], **options: Any) -> T:
    """Run ``handler`` inside an active turn and return its result (the turn settles as in :class:`Turn`)."""
    with Turn(plane, **options) as active:
        return handler(active)
