"""The lifecycle lock database: verified before SQLite opens it, and never disturbing a lock this process holds."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tmux_support import SESSION, root_of

from tmux_owner import TmuxOwnerError, replace_owner_generation
from tmux_owner._dirfd import LifecycleDir
from tmux_owner._locks import acquire_lock

TRY_LOCK = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
try:
    connection.execute("BEGIN IMMEDIATE")
except sqlite3.OperationalError:
    print("busy")
else:
    print("taken")
"""


def other_process_can_lock(database: Path) -> bool:
    completed = subprocess.run(
        [sys.executable, "-c", TRY_LOCK, str(database)], capture_output=True, text=True, timeout=60, check=True
    )
    return completed.stdout.strip() == "taken"


def test_polling_for_the_lock_keeps_a_lock_another_connection_of_this_process_holds(tmp_path: Path) -> None:
    """While another SQLite connection of this process holds the lock, a timed-out acquisition leaves that lock in
    force for other processes (closing a descriptor of the database would silently drop it).
    """
    replace_owner_generation(tmp_path, SESSION, "generation")
    database = root_of(tmp_path) / "owner-locks.sqlite"
    holder = sqlite3.connect(database, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        assert not other_process_can_lock(database)
        directory = LifecycleDir.open(tmp_path, SESSION)
        assert directory is not None
        with directory:
            assert acquire_lock(directory, 50) is None
        assert not other_process_can_lock(database)
    finally:
        holder.close()
    assert other_process_can_lock(database)


def test_the_lock_database_is_created_0600_and_a_wider_one_is_narrowed(tmp_path: Path) -> None:
    """The lock database is created with mode 0600, and an existing one with a wider mode is chmodded to 0600."""
    replace_owner_generation(tmp_path, SESSION, "generation")
    database = root_of(tmp_path) / "owner-locks.sqlite"
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
    database.chmod(0o644)
    directory = LifecycleDir.open(tmp_path, SESSION)
    assert directory is not None
    with directory:
        lock = acquire_lock(directory, 1_000)
        assert lock is not None
        lock.release()
    assert stat.S_IMODE(database.stat().st_mode) == 0o600


@pytest.mark.parametrize("kind", ["directory", "fifo", "hard_link"])
def test_a_lock_database_that_is_not_a_lone_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    """A directory, a FIFO or a second hard link at owner-locks.sqlite is refused with untrusted_lifecycle_file."""
    replace_owner_generation(tmp_path, SESSION, "generation")
    database = root_of(tmp_path) / "owner-locks.sqlite"
    database.unlink()
    if kind == "directory":
        database.mkdir()
    elif kind == "fifo":
        os.mkfifo(database)
    else:
        (tmp_path / "elsewhere.sqlite").write_bytes(b"")
        database.hardlink_to(tmp_path / "elsewhere.sqlite")
    directory = LifecycleDir.open(tmp_path, SESSION)
    assert directory is not None
    with directory, pytest.raises(TmuxOwnerError, match=r"^untrusted_lifecycle_file$"):
        acquire_lock(directory, 50)
