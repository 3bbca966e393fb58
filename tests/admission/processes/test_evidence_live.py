"""Process evidence against this host's real /proc and real child processes."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from admission_plane.errors import ProcessGoneError
from admission_plane.evidence import (
    BOOT_ID_PATH,
    LIVE_READERS,
    MAX_PID,
    ConnectorIdentity,
    GroupResidue,
    Observation,
    ProcessIdentity,
    capture,
    inspect_process_group,
    observe,
    parse_stat,
    read_boot_id,
    read_process_ids,
)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A ``sleep 60`` child leading its own session and process group; always killed and reaped."""
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield child
    finally:
        if child.returncode is None:
            child.kill()
            child.wait()


def live_group(identity: ProcessIdentity) -> GroupResidue:
    inventory = read_process_ids(LIVE_READERS)
    assert inventory is not None
    return inspect_process_group(identity, inventory, LIVE_READERS)


def wait_until_zombie(child: subprocess.Popen[bytes]) -> None:
    """Block until ``child`` has exited but leave it unreaped (WNOWAIT), so it stays a zombie."""
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)


def test_capture_of_this_process_matches_what_the_os_reports() -> None:
    """Capturing our own pid yields this host's boot id, our namespace, parent, group and session."""
    identity = capture(os.getpid())
    assert identity.boot_id == read_boot_id(LIVE_READERS)
    with open(BOOT_ID_PATH) as stream:
        assert identity.boot_id == stream.read().strip().lower()
    assert f"pid:[{identity.pid_namespace_inode}]" == os.readlink("/proc/self/ns/pid")
    assert (identity.pid, identity.ppid, identity.pgrp, identity.session) == (
        os.getpid(),
        os.getppid(),
        os.getpgrp(),
        os.getsid(0),
    )


def test_capture_of_this_process_round_trips_through_the_seed_mapping() -> None:
    """A real identity survives to_mapping/from_mapping unchanged and is observed as the same process."""
    identity = capture(os.getpid())
    assert ProcessIdentity.from_mapping(identity.to_mapping()) == identity
    assert observe(identity) is Observation.SAME


def test_connector_capture_defaults_to_this_process_now() -> None:
    """ConnectorIdentity.capture() with no arguments describes this process with a canonical UTC createdAt."""
    connector = ConnectorIdentity.capture()
    assert connector.process.pid == os.getpid()
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z", connector.created_at)
    assert ConnectorIdentity.from_mapping(connector.to_mapping()) == connector


def test_live_readers_raise_enoent_for_a_pid_that_cannot_exist() -> None:
    """The real /proc readers keep the kernel's ENOENT for a pid above pid_max, which capture reports as gone."""
    with pytest.raises(FileNotFoundError) as caught:
        LIVE_READERS.read_file(f"/proc/{MAX_PID}/stat")
    assert caught.value.errno == errno.ENOENT
    with pytest.raises(FileNotFoundError):
        LIVE_READERS.read_link(f"/proc/{MAX_PID}/ns/pid")
    with pytest.raises(ProcessGoneError):
        capture(MAX_PID)


def test_live_inventory_lists_this_process_sorted() -> None:
    """The real /proc inventory contains our own pid and comes back sorted and unique."""
    inventory = read_process_ids(LIVE_READERS)
    assert inventory is not None
    assert os.getpid() in inventory
    assert list(inventory) == sorted(set(inventory))


def test_live_child_is_same_and_its_group_present_while_it_runs(sleeper: subprocess.Popen[bytes]) -> None:
    """A running child is observed as the same process and its process group holds residue."""
    child = capture(sleeper.pid)
    assert (child.pgrp, child.session) == (sleeper.pid, sleeper.pid)
    assert child.ppid == os.getpid()
    assert observe(child) is Observation.SAME
    assert live_group(child) is GroupResidue.PRESENT


def test_live_zombie_child_is_same_and_still_present(sleeper: subprocess.Popen[bytes]) -> None:
    """A killed but unreaped child is a zombie with its start time, so it is still the same process."""
    child = capture(sleeper.pid)
    sleeper.send_signal(signal.SIGKILL)
    wait_until_zombie(sleeper)
    assert parse_stat(LIVE_READERS.read_file(f"/proc/{sleeper.pid}/stat")).state == "Z"
    assert observe(child) is Observation.SAME
    assert live_group(child) is GroupResidue.PRESENT


def test_live_child_is_gone_and_its_group_empty_once_reaped(sleeper: subprocess.Popen[bytes]) -> None:
    """After kill and wait the child is gone and its process group is empty."""
    child = capture(sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    assert observe(child) is Observation.GONE
    assert live_group(child) is GroupResidue.EMPTY


def test_live_grandchild_keeps_the_group_present_after_the_child_is_reaped() -> None:
    """A descendant left in the child's group is residue even when the child itself is gone."""
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; exec sleep 60"], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        assert leader.stdout is not None
        grandchild = capture(int(leader.stdout.readline()))
        child = capture(leader.pid)
        assert (grandchild.pgrp, grandchild.session) == (child.pgrp, child.session)
        leader.kill()
        leader.wait()
        assert observe(child) is Observation.GONE
        assert live_group(child) is GroupResidue.PRESENT
    finally:
        # The group id stays reserved while any member lives, so this cannot hit a stranger.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
        leader.stdout.close()


NAMESPACED_TURN = r"""
import os, sys
from admission_plane import AdmissionPlane, Policy
from admission_plane.evidence import capture
from admission_plane.migrate import upgrade

me = capture(os.getpid())
assert me.session == 0, f"expected a session led from outside the namespace, got {me}"
upgrade(sys.argv[1])
with AdmissionPlane(sys.argv[1], policy=Policy(1, 1, 0), encryption_key=os.urandom(32),
                    content_fingerprint_key=os.urandom(32)) as plane:
    assert plane.owner_identity.process.session == 0
    with plane.turn(request_id="r1", session_id="s1", agent_id="a1", provider="p", model="m",
                    prompt="hello", command=["cat"]) as current:
        echoed = current.child.stdout.read().decode()
    print(current.state, echoed)
"""


def test_a_plane_runs_a_turn_in_a_container_like_pid_namespace(tmp_path) -> None:
    """Where the kernel reports session 0, as for a session leader outside our pid namespace in containers and CI
    runners, a plane opens, records its identity and completes a turn."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a pid namespace here: {probe.stderr.decode().strip()[:120]}")
    script = tmp_path / "turn.py"
    script.write_text(NAMESPACED_TURN)
    database = tmp_path / "ns.sqlite"
    # `setsid`-free: the namespace's init (unshare's child) keeps the outer session, which reads as 0 inside.
    result = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(script), str(database)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "completed hello"
