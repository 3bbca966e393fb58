"""The dispatch child: started in its own session, given its prompt on stdin, stopped with its group."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

from .. import _validate as v
from ..errors import InvalidInputError

_TERMINATE_GRACE_S = 2.0


def spawn_child(command: Sequence[str], **popen_options: Any) -> subprocess.Popen[bytes]:
    """Start a dispatch child in its own process group and session (so the reaper can inspect its
    group), with a pipe on stdin for the prompt and, unless overridden, one on stdout.

    A ``command`` that is not a non-empty list of strings without NUL raises
    :class:`~admission_plane.errors.InvalidInputError` before anything is started.
    """
    argv = v.command(command, "dispatch child command")
    popen_options.setdefault("stdin", subprocess.PIPE)
    popen_options.setdefault("stdout", subprocess.PIPE)
    popen_options.setdefault("start_new_session", True)
    return subprocess.Popen(argv, **popen_options)


def write_to_stdin(child: subprocess.Popen[bytes] | None, prompt: str) -> None:
    """Write the whole prompt to the child's stdin pipe and close it."""
    if child is None or child.stdin is None:
        raise InvalidInputError("the default prompt writer needs a spawned child with a stdin pipe")
    stdin = child.stdin
    try:
        stdin.write(prompt.encode("utf-8"))
        stdin.flush()
    finally:
        stdin.close()
        # Popen.communicate() would flush the closed pipe; the child has its whole prompt now.
        child.stdin = None


def terminate(child: subprocess.Popen[bytes] | None) -> None:
    """Stop a child the turn spawned, if it still runs (its whole group when it leads one)."""
    if child is None or child.poll() is not None:
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
            child.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
