"""The real tmux: the server probe (``list-sessions`` plus ``/proc``), the spawner, and exact cleanup.

Everything here runs processes; tests inject fakes through :class:`ExecutionDependencies`
and the ``read_cgroup`` / ``read_start_time`` seams of :class:`TmuxProbe`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from ._argv import argv_tuple, is_native_session_id, tmux_control_argv
from ._cgroup import CgroupInfo, classify_cgroup
from ._execute import SpawnResult
from ._jscompat import MAX_DIAGNOSTIC_CHARS, is_safe_integer, js_trim
from ._plan_records import AttemptCapability, DirectExecution, write_attempt
from ._procstat import read_linux_proc_start_time
from ._server_proof import ServerState, TmuxServerProof

_NO_SERVER = re.compile(r"no server running|failed to connect to server|error connecting to")
_ROW_PID = re.compile(r"[1-9][0-9]*")
TMUX_TIMEOUT_S = 10.0
# A proved server is as safe as its cgroup; any classification not listed is unverifiable.
_SERVER_STATE_OF_CGROUP: dict[str, ServerState] = {"safe": "safe", "unsafe_service": "unsafe"}


def read_proc_cgroup(entry: str) -> str | None:
    """The text of ``/proc/<entry>/cgroup`` (``entry`` is ``self`` or a pid), ``None`` if unreadable."""
    try:
        return Path("/proc", entry, "cgroup").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def run_argv(argv: Sequence[str], stdin_line: str | None = None, *, timeout: float = TMUX_TIMEOUT_S) -> SpawnResult:
    """Run ``argv`` without a shell, feed ``stdin_line`` (else ``/dev/null``), and capture stdout."""
    try:
        completed = subprocess.run(
            list(argv),
            input=stdin_line,
            stdin=None if stdin_line is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return SpawnResult(None, None)
    return SpawnResult(completed.returncode, completed.stdout)


def _parse_session_rows(stdout: str) -> tuple[int, tuple[str, ...]] | None:
    lines = stdout.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    pid: int | None = None
    names: list[str] = []
    for raw in lines:
        line = raw[:-1] if raw.endswith("\r") else raw
        columns = line.split("\t")
        if len(columns) != 2 or _ROW_PID.fullmatch(columns[0]) is None or not js_trim(columns[1]):
            return None
        row_pid = int(columns[0])
        if not is_safe_integer(row_pid) or (pid is not None and pid != row_pid):
            return None
        pid = row_pid
        names.append(columns[1])
    return None if pid is None else (pid, tuple(names))


@attrs.define
class TmuxProbe:
    """The real probe: ``<control argv> list-sessions`` for the server, ``/proc`` for its identity.

    ``control_argv`` (e.g. ``["tmux", "-S", "/run/x/sock"]``) is used when a caller gives
    none; ``read_cgroup`` (``"self"`` or a pid -> cgroup text) is the one seam tests inject.
    """

    control_argv: tuple[str, ...] = attrs.field(converter=argv_tuple, default=())
    platform: str = sys.platform
    read_cgroup: Callable[[str], str | None] = read_proc_cgroup
    read_start_time: Callable[[int], str | None] = read_linux_proc_start_time

    def read_caller_cgroup(self) -> str | None:
        """This process's own cgroup text."""
        return self.read_cgroup("self")

    def probe_server(self, socket_key: str, control_argv: Sequence[str] | None = None) -> TmuxServerProof:
        """Prove the server reachable through ``control_argv`` (the seed CLI's ``tmuxServerProof``).

        ``socket_key`` is opaque here: the control argv names the socket.
        """
        del socket_key
        argv = list(self.control_argv if control_argv is None else control_argv)
        if not argv:
            return TmuxServerProof("unverifiable")
        completed = subprocess.run(
            [*argv, "list-sessions", "-F", "#{pid}\t#{session_name}"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TMUX_TIMEOUT_S,
            check=False,
        )
        if completed.returncode != 0:
            diagnostic = completed.stderr.strip().lower()
            absent = 0 < len(diagnostic) <= MAX_DIAGNOSTIC_CHARS and _NO_SERVER.search(diagnostic) is not None
            return TmuxServerProof("absent" if absent else "unverifiable")
        if not completed.stdout.strip():
            return TmuxServerProof("absent")
        rows = _parse_session_rows(completed.stdout)
        if rows is None:
            return TmuxServerProof("unverifiable")
        pid, names = rows
        if self.platform != "linux":
            return TmuxServerProof("safe", pid, "not_applicable", CgroupInfo("not_applicable"), names)
        cgroup = classify_cgroup("linux", self.read_cgroup(str(pid)))
        start_time = self.read_start_time(pid)
        if not start_time:
            return TmuxServerProof("unverifiable", pid, None, cgroup, names)
        state = _SERVER_STATE_OF_CGROUP.get(cgroup.classification, "unverifiable")
        return TmuxServerProof(state, pid, start_time, cgroup, names)

    def record_attempt(self, *, state_dir: str, session_id: str, generation: str, attempt: AttemptCapability) -> None:
        """Persist the attempt as ``attempt-<token>.json`` (the async seed plan's ``writeAttempt``)."""
        write_attempt(state_dir, session_id, generation, attempt)


def spawn_tmux(argv: Sequence[str], stdin_line: str | None = None) -> SpawnResult:
    """The real spawner for :class:`ExecutionDependencies`: run the planned argv exactly."""
    return run_argv(argv, stdin_line)


def kill_spawned_session(execution: DirectExecution, native_session_id: str, server: TmuxServerProof) -> None:
    """Remove exactly the spawned session ``$N`` on the proved server; raise if tmux refuses."""
    del server
    control = tmux_control_argv(execution.argv)
    if not control or not is_native_session_id(native_session_id):
        raise ValueError("cleanup_target_unproven")
    result = run_argv([*control, "kill-session", "-t", native_session_id])
    if result.exit_code != 0:
        raise RuntimeError("cleanup_failed")
