"""Exact owner close: SIGTERM only the proven owner process, then wait for its verdict.

The start-time proof, the intent and the signal all happen under the generation
lock, so a generation replacement cannot revoke the authorization between the
last proof and the dispatch. The verdict wait happens after the lock is released,
so the observer that publishes the verdict can take it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import attrs

from ._dirfd import LifecycleDir
from ._errors import InvalidRecordError, TmuxOwnerError
from ._files import GENERATION_LOCK_WAIT_MS, LifecyclePaths, RetiredIntentSuffix, lifecycle_paths, open_lifecycle
from ._generations import GENERATION_FILE
from ._intents import OwnerIntent, create_owner_intent
from ._jscompat import is_safe_integer
from ._locks import acquire_lock
from ._procstat import read_linux_proc_start_time
from ._timestamps import current_ms, parse_timestamp_ms
from ._validators import field_validator, validate_non_empty
from ._verdict_records import EXPECTED, OwnerVerdict

VERDICT_POLL_SECONDS = 0.05


def _is_positive_pid(value: object) -> bool:
    return is_safe_integer(value) and isinstance(value, int) and value > 0


@attrs.frozen(kw_only=True)
class ExactOwnerCloseRequest:
    """Which owner to close: its generation, server, pid and the start time that proves the pid."""

    state_dir: str | os.PathLike[str]
    session_id: str = attrs.field(validator=validate_non_empty)
    generation: str = attrs.field(validator=validate_non_empty)
    server_key: str = attrs.field(validator=validate_non_empty)
    pid: int = attrs.field(validator=field_validator(_is_positive_pid))
    start_time: str = attrs.field(validator=validate_non_empty)
    dispatch_id: str = attrs.field(validator=validate_non_empty)
    # Intent timestamps are checked where the seed checks them: creating the intent
    # raises owner_intent_invalid, after the start-time proof.
    created_at: str
    expires_at: str


def read_proc_start_time(pid: int) -> str | None:
    """The live start time of ``pid`` (``/proc/<pid>/stat`` field 22, counted after the last ``)``), or ``None``."""
    return read_linux_proc_start_time(pid)


def send_sigterm(pid: int) -> None:
    """Deliver a real SIGTERM to ``pid``."""
    os.kill(pid, signal.SIGTERM)


def verdict_poller(request: ExactOwnerCloseRequest) -> Callable[[], OwnerVerdict | None]:
    """A live ``wait_for_verdict``: poll ``verdict-<G>.json`` until the intent expires."""

    def wait() -> OwnerVerdict | None:
        paths = lifecycle_paths(request.state_dir, request.session_id, request.generation)
        expires_ms = parse_timestamp_ms(request.expires_at) or 0
        while True:
            value = _read_verdict(paths)
            if value is not None:
                try:
                    verdict = OwnerVerdict.from_json(value)
                except TmuxOwnerError:
                    return None
                if verdict.generation == request.generation and verdict.server_key == request.server_key:
                    return verdict
            if current_ms() >= expires_ms:
                return None
            time.sleep(VERDICT_POLL_SECONDS)

    return wait


def _read_verdict(paths: LifecyclePaths) -> dict[str, Any] | None:
    directory = open_lifecycle(paths)
    if directory is None:
        return None
    with directory:
        return directory.read_json(paths.verdict_file.name)


@attrs.frozen(kw_only=True)
class ExactOwnerCloseDependencies:
    """What close needs from the world; every field defaults to the live implementation.

    ``wait_for_verdict`` defaults to polling the generation's verdict file until the
    intent expires; ``cleanup_session`` defaults to doing nothing.
    """

    read_start_time: Callable[[int], str | None] = read_proc_start_time
    send_sigterm: Callable[[int], None] = send_sigterm
    wait_for_verdict: Callable[[], OwnerVerdict | None] | None = None
    cleanup_session: Callable[[], None] = lambda: None


def close_exact_tmux_owner(
    request: ExactOwnerCloseRequest, deps: ExactOwnerCloseDependencies | None = None
) -> OwnerVerdict:
    """SIGTERM the exact owner of ``request.generation`` and return its expected-shutdown verdict.

    Raises ``generation_lock_contended``, ``owner_pid_identity_mismatch`` (no signal sent),
    ``owner_generation_mismatch``, ``owner_intent_invalid`` / ``owner_intent_replay``,
    ``owner_term_verdict_timeout`` (the intent is renamed ``.expired``), or whatever
    ``send_sigterm`` raised (the intent is renamed ``.cancelled``). Cleanup runs only
    after a verdict that names this close's intent.

    Beyond the seed: anything but an :class:`ExactOwnerCloseRequest` raises
    ``InvalidRecordError``; a session without a lifecycle directory is refused
    (``owner_pid_identity_mismatch`` or ``owner_generation_mismatch``) without creating
    one; a symlinked directory or lock database raises ``untrusted_root`` /
    ``untrusted_lifecycle_file``.
    """
    given: object = request  # callers outside the type checker may pass anything
    if not isinstance(given, ExactOwnerCloseRequest):
        raise InvalidRecordError(ExactOwnerCloseRequest.__name__)
    deps = deps or ExactOwnerCloseDependencies()
    wait_for_verdict = deps.wait_for_verdict or verdict_poller(request)
    paths = lifecycle_paths(request.state_dir, request.session_id, request.generation)
    directory = open_lifecycle(paths)
    if directory is None:
        # No lifecycle directory means no current generation; refuse without creating one.
        if deps.read_start_time(request.pid) != request.start_time:
            raise TmuxOwnerError("owner_pid_identity_mismatch")
        raise TmuxOwnerError("owner_generation_mismatch")
    with directory:
        intent = _signal_under_lock(request, deps, paths, directory)
    verdict = wait_for_verdict()
    if verdict is None or verdict.intent_id != intent.intent_id or verdict.classification != EXPECTED:
        _retire(paths, ".expired")
        raise TmuxOwnerError("owner_term_verdict_timeout")
    deps.cleanup_session()
    return verdict


def _retire(paths: LifecyclePaths, suffix: RetiredIntentSuffix, directory: LifecycleDir | None = None) -> None:
    """Rename the pending intent to its terminal form; failures are ignored, as in the seed."""
    with contextlib.suppress(OSError, TmuxOwnerError):
        opened = directory or open_lifecycle(paths)
        if opened is None:
            return
        try:
            opened.rename(paths.intent_file.name, paths.retired_intent_file(suffix).name)
        finally:
            if directory is None:
                opened.close()


def _signal_under_lock(
    request: ExactOwnerCloseRequest, deps: ExactOwnerCloseDependencies, paths: LifecyclePaths, directory: LifecycleDir
) -> OwnerIntent:
    def generation_is_current() -> bool:
        record = directory.read_json(GENERATION_FILE)
        return record is not None and record.get("generation") == request.generation

    lock = acquire_lock(directory, GENERATION_LOCK_WAIT_MS)
    if lock is None:
        raise TmuxOwnerError("generation_lock_contended")
    with lock:
        if deps.read_start_time(request.pid) != request.start_time:
            raise TmuxOwnerError("owner_pid_identity_mismatch")
        if not generation_is_current():
            raise TmuxOwnerError("owner_generation_mismatch")
        intent = create_owner_intent(
            request.state_dir,
            generation=request.generation,
            session_id=request.session_id,
            server_key=request.server_key,
            dispatch_id=request.dispatch_id,
            created_at=request.created_at,
            expires_at=request.expires_at,
        )
        if not generation_is_current():
            _retire(paths, ".cancelled", directory)
            raise TmuxOwnerError("owner_generation_mismatch")
        expires_ms = parse_timestamp_ms(intent.expires_at)
        if expires_ms is None or expires_ms <= current_ms():
            _retire(paths, ".expired", directory)
            raise TmuxOwnerError("owner_term_verdict_timeout")
        try:
            if deps.read_start_time(request.pid) != request.start_time:
                raise TmuxOwnerError("owner_pid_identity_mismatch")
            if not generation_is_current():
                raise TmuxOwnerError("owner_generation_mismatch")
            deps.send_sigterm(request.pid)
        except BaseException:
            _retire(paths, ".cancelled", directory)
            raise
    return intent
