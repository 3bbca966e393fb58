"""Plans executed against real tmux servers on private sockets.

Only the cgroup reader is injected (a test machine's real cgroup is usually unverifiable),
except in the fail-closed tests, which use the real reader. Every test kills its server.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import pytest
from tmux_support import plan_request_json

from tmux_owner._cgroup import classify_cgroup
from tmux_owner._execute import ExecutionDependencies, ExecutionFailure, ExecutionSuccess, SpawnResult, execute_plan
from tmux_owner._generations import (
    OwnerGenerationBaseline,
    capture_owner_generation_baseline,
    is_owner_generation_baseline_current,
    replace_owner_generation,
)
from tmux_owner._plan import plan_owner_isolation
from tmux_owner._plan_records import DirectExecution, PlanFailure, PlanSuccess
from tmux_owner._procstat import parse_linux_proc_start_time
from tmux_owner._tmux import TmuxProbe, kill_spawned_session, spawn_tmux

pytestmark = pytest.mark.tmux

SAFE_ROOT_CGROUP = "0::/\n"


@attrs.frozen
class TmuxSocket:
    """A private tmux socket in a short temporary directory (unix socket paths are limited)."""

    tmux: str
    path: Path

    @property
    def control(self) -> list[str]:
        return [self.tmux, "-S", str(self.path)]

    def new_session_argv(self, name: str) -> list[str]:
        """A new-session argv with a long-lived pane that prints the native session id."""
        return [*self.control, "new-session", "-d", "-s", name, "-P", "-F", "#{session_id}", "sleep", "600"]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.control, *args], capture_output=True, text=True, timeout=10, check=False)

    def server_pid(self) -> int:
        """The live server's pid, from tmux itself."""
        return int(self.run("display-message", "-p", "#{pid}").stdout.strip())


@pytest.fixture
def tmux_socket(tmux_binary: str) -> Iterator[TmuxSocket]:
    """A private socket whose server (if any) is killed after the test."""
    directory = Path(tempfile.mkdtemp(prefix="tmo-"))
    socket = TmuxSocket(tmux_binary, directory / "sock")
    try:
        yield socket
    finally:
        socket.run("kill-server")
        shutil.rmtree(directory, ignore_errors=True)


def injected_probe(socket: TmuxSocket, cgroup: str = SAFE_ROOT_CGROUP) -> TmuxProbe:
    """The real probe with only its cgroup reader replaced."""
    return TmuxProbe(socket.control, platform="linux", read_cgroup=lambda _entry: cgroup)


def plan_request(state_dir: Path, socket: TmuxSocket, name: str, baseline: OwnerGenerationBaseline) -> dict:
    """A Linux plan request for session ``name`` on the private socket, against ``baseline``."""
    return plan_request_json(
        state_dir,
        socket.new_session_argv(name),
        cwd=str(state_dir),
        socket_key="private-socket",
        baseline=baseline.to_json(),
    )


def deps_for(
    state_dir: Path,
    probe: TmuxProbe,
    baseline: OwnerGenerationBaseline,
    spawn: Callable[[Sequence[str], str | None], SpawnResult] = spawn_tmux,
) -> ExecutionDependencies:
    return ExecutionDependencies(
        socket_key="private-socket",
        spawn=spawn,
        probe_server=probe.probe_server,
        is_current_generation=lambda: is_owner_generation_baseline_current(state_dir, "session", baseline),
        cleanup_spawned=kill_spawned_session,
    )


def is_dead(pid: int) -> bool:
    """Gone, or a zombie/dead entry: a killed server lingers as state Z until it is reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X", "x")


def kill_and_wait(socket: TmuxSocket) -> None:
    """Kill the server, wait until it is really dead, and remove its stale socket file.

    A client that connects while the old server is still shutting down gets
    `server exited unexpectedly` instead of starting a fresh server.
    """
    pid = socket.server_pid()
    assert socket.run("kill-server").returncode == 0
    deadline = time.monotonic() + 10
    while not is_dead(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert is_dead(pid)
    socket.path.unlink(missing_ok=True)


def proc_start_time(pid: int) -> str | None:
    return parse_linux_proc_start_time(Path(f"/proc/{pid}/stat").read_text())


def test_a_direct_plan_starts_a_real_session_and_proves_its_server(tmp_path: Path, tmux_socket: TmuxSocket) -> None:
    """With no server, planning then executing starts the session, reads its `$0` id and proves the new server's pid and
    start time.
    """
    baseline = capture_owner_generation_baseline(tmp_path, "session")
    probe = injected_probe(tmux_socket)
    plan = plan_owner_isolation(plan_request(tmp_path, tmux_socket, "owned-a", baseline), probe)
    assert isinstance(plan, PlanSuccess)
    assert (plan.server_state, plan.execution.mode, plan.execution.server_absent_before) == ("absent", "direct", True)
    result = execute_plan(plan, deps_for(tmp_path, probe, baseline))
    assert isinstance(result, ExecutionSuccess), result
    pid = tmux_socket.server_pid()
    assert result.native_session_id == "$0"
    assert result.server_pid == pid
    assert result.server_start_time == proc_start_time(pid)
    assert result.server_session == "owned-a"
    assert "owned-a" in (result.server.session_names or ())


def test_a_second_direct_plan_reuses_the_proved_server_identity(tmp_path: Path, tmux_socket: TmuxSocket) -> None:
    """Against a running safe server the plan carries its identity, and the executed session is `$1` on that server."""
    assert tmux_socket.run(*tmux_socket.new_session_argv("first")[3:]).returncode == 0
    baseline = capture_owner_generation_baseline(tmp_path, "session")
    probe = injected_probe(tmux_socket, "0::/user.slice/user-1000.slice/session-1.scope\n")
    plan = plan_owner_isolation(plan_request(tmp_path, tmux_socket, "second", baseline), probe)
    assert isinstance(plan, PlanSuccess)
    execution = plan.execution
    assert isinstance(execution, DirectExecution)
    pid = tmux_socket.server_pid()
    assert (execution.server_pid, execution.server_start_time) == (pid, proc_start_time(pid))
    result = execute_plan(plan, deps_for(tmp_path, probe, baseline))
    assert isinstance(result, ExecutionSuccess), result
    assert (result.native_session_id, result.server_pid) == ("$1", pid)


def test_a_server_restarted_between_plan_and_execute_is_a_race(tmp_path: Path, tmux_socket: TmuxSocket) -> None:
    """A planned server killed and replaced on the same socket before execution is target_server_identity_changed."""
    assert tmux_socket.run(*tmux_socket.new_session_argv("first")[3:]).returncode == 0
    baseline = capture_owner_generation_baseline(tmp_path, "session")
    probe = injected_probe(tmux_socket)
    plan = plan_owner_isolation(plan_request(tmp_path, tmux_socket, "owned", baseline), probe)
    assert isinstance(plan, PlanSuccess)
    kill_and_wait(tmux_socket)
    replacement = tmux_socket.run(*tmux_socket.new_session_argv("impostor")[3:])
    assert replacement.returncode == 0, replacement.stderr
    result = execute_plan(plan, deps_for(tmp_path, probe, baseline))
    assert result == ExecutionFailure("server_race", "target_server_identity_changed")


def test_a_generation_published_during_the_spawn_cleans_up_the_spawned_session(
    tmp_path: Path, tmux_socket: TmuxSocket
) -> None:
    """A generation published during a real spawn gets exactly the spawned session killed, leaving the others on the
    server.
    """
    assert tmux_socket.run(*tmux_socket.new_session_argv("keeper")[3:]).returncode == 0
    baseline = capture_owner_generation_baseline(tmp_path, "session")
    probe = injected_probe(tmux_socket)
    plan = plan_owner_isolation(plan_request(tmp_path, tmux_socket, "doomed", baseline), probe)
    assert isinstance(plan, PlanSuccess)

    def spawn_then_publish(argv: Sequence[str], stdin_line: str | None) -> SpawnResult:
        result = spawn_tmux(argv, stdin_line)
        replace_owner_generation(tmp_path, "session", "newer")
        return result

    result = execute_plan(plan, deps_for(tmp_path, probe, baseline, spawn_then_publish))
    assert result == ExecutionFailure("scope_bootstrap_failed", "owner_generation_stale")
    assert tmux_socket.run("has-session", "-t", "=doomed").returncode != 0
    assert tmux_socket.run("has-session", "-t", "=keeper").returncode == 0


def test_with_the_real_cgroup_reader_an_absent_server_plan_fails_closed_here(
    tmp_path: Path, tmux_socket: TmuxSocket
) -> None:
    """With the real cgroup reader, an absent-server plan is as verifiable as this machine's own cgroup, and fails
    closed where that is unverifiable.
    """
    caller = Path("/proc/self/cgroup").read_text(encoding="utf-8")
    expected = classify_cgroup("linux", caller)
    probe = TmuxProbe(tmux_socket.control, platform="linux")
    baseline = capture_owner_generation_baseline(tmp_path, "session")
    plan = plan_owner_isolation(plan_request(tmp_path, tmux_socket, "owned", baseline), probe)
    if expected.classification == "unverifiable":
        assert plan == PlanFailure("server_unverifiable", expected.diagnostic or "")
        if ":/process_api/" in caller:
            assert plan == PlanFailure("server_unverifiable", "cgroup_ownership_unproven")
    else:
        assert isinstance(plan, PlanSuccess) or plan.code == "server_unverifiable"
    assert tmux_socket.run("has-session").returncode != 0


def test_with_the_real_cgroup_reader_a_running_server_is_not_trusted_here(
    tmp_path: Path, tmux_socket: TmuxSocket
) -> None:
    """With the real cgroup reader, a running server that inherited an unverifiable cgroup makes the plan
    target_server_unverifiable.
    """
    assert tmux_socket.run(*tmux_socket.new_session_argv("first")[3:]).returncode == 0
    server_cgroup = Path(f"/proc/{tmux_socket.server_pid()}/cgroup").read_text(encoding="utf-8")
    probe = TmuxProbe(tmux_socket.control, platform="linux")
    baseline = capture_owner_generation_baseline(tmp_path, "session")
    plan = plan_owner_isolation(plan_request(tmp_path, tmux_socket, "owned", baseline), probe)
    if classify_cgroup("linux", server_cgroup).classification == "unverifiable":
        assert plan == PlanFailure("server_unverifiable", "target_server_unverifiable")
    else:
        assert isinstance(plan, PlanSuccess) or plan.code in ("server_unverifiable", "server_unsafe")


def test_the_real_probe_reports_a_socket_without_server_as_absent(tmux_socket: TmuxSocket) -> None:
    """The real probe reports a socket without a server as absent and an empty control argv as unverifiable."""
    probe = injected_probe(tmux_socket)
    assert probe.probe_server("key").state == "absent"
    assert probe.probe_server("key", []).state == "unverifiable"
