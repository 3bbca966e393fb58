"""The dispatch child of an async turn: an asyncio subprocess in its own session, stopped with its group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidInputError
from ..turns._child import _TERMINATE_GRACE_S, _process_group

Process = asyncio.subprocess.Process


async def spawn_child(command: Sequence[str], **options: Any) -> Process:
    """Start a dispatch child with ``asyncio.create_subprocess_exec`` in its own process group and
    session (so the reaper can inspect its group), with pipes on stdin and, unless overridden, stdout."""
    options.setdefault("stdin", asyncio.subprocess.PIPE)
    options.setdefault("stdout", asyncio.subprocess.PIPE)
    options.setdefault("start_new_session", True)
    arguments = list(command)
    if not arguments:
        raise InvalidInputError("turn command must name a program")
    return await asyncio.create_subprocess_exec(*arguments, **options)


async def write_to_stdin(child: Process | None, prompt: str) -> None:
    """Write the whole prompt to the child's stdin pipe, wait until it is flushed, and close it."""
    if child is None or child.stdin is None:
        raise InvalidInputError("the default prompt writer needs a spawned child with a stdin pipe")
    stdin = child.stdin
    try:
        stdin.write(prompt.encode("utf-8"))
        await stdin.drain()
    finally:
        stdin.close()
        # The child has its whole prompt (or the pipe broke): a failure to close is not news.
        with contextlib.suppress(OSError):
            await stdin.wait_closed()


async def terminate(child: Process | None) -> None:
    """Stop a child the turn spawned, if it still runs: SIGTERM to its whole group when it leads
    one, SIGKILL after a grace period, as :func:`admission_plane.turns._child.terminate` does."""
    if child is None or child.returncode is not None:
        return
    # While the leader is unreaped its pid (and so its group id) cannot be reused.
    group = child.pid if _process_group(child.pid) == child.pid else None
    for sig, grace in ((signal.SIGTERM, _TERMINATE_GRACE_S), (signal.SIGKILL, None)):
        try:
            if group is not None:
                os.killpg(group, sig)
            else:
                child.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            await asyncio.wait_for(child.wait(), grace)
            return
        except TimeoutError:
            continue
