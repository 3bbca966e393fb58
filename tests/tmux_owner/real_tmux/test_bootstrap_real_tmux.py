"""The scoped bootstrap run in-process against a real tmux server on a private socket.

systemd cannot run here, so only the bootstrap's own cgroup and the server's cgroup are
injected; the spawn and the server probe are the real ones.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from tmux_support import World

from tmux_owner._bootstrap import BootstrapDependencies, bootstrap_owner_isolation
from tmux_owner._timestamps import current_ms
from tmux_owner._tmux import TmuxProbe, run_argv


def test_a_bootstrap_spawns_a_real_tmux_session_with_only_its_self_cgroup_faked(
    tmp_path: Path, tmux_binary: str
) -> None:
    """A bootstrap with a real tmux spawn and a real server probe answers a receipt naming the live server's pid."""
    directory = Path(tempfile.mkdtemp(prefix="tmo-"))
    control = [tmux_binary, "-S", str(directory / "sock")]
    try:
        argv = [*control, "new-session", "-d", "-s", "owned", "-P", "-F", "#{session_id}", "sleep", "600"]
        world = World(tmp_path, argv, now=current_ms()).setup()
        probe = TmuxProbe(control, platform="linux", read_cgroup=lambda _entry: "0::/")
        deps = BootstrapDependencies(
            read_self_cgroup=lambda: f"0::/{world.scope}",
            spawn=lambda spawn_argv: run_argv(spawn_argv),
            probe_server=probe.probe_server,
        )
        result = bootstrap_owner_isolation(world.request(), deps)
        shown = subprocess.run([*control, "display-message", "-p", "#{pid}"], capture_output=True, text=True)
        pid = int(shown.stdout)
        assert (result.ok, result.native_session_id, result.server_pid, result.session_name) == (
            True,
            "$0",
            pid,
            "owned",
        )
    finally:
        subprocess.run([*control, "kill-server"], capture_output=True, check=False)
        shutil.rmtree(directory, ignore_errors=True)
