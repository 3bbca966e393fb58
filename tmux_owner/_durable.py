"""Durable record writes: a record appears under its final name whole, or not at all.

Every write first fills a temporary file ``<final>.<uuid4>.tmp`` (created exclusively,
0600) in the lifecycle directory and fsyncs it. An atomic replace then renames it over
the final name; an immutable publication hard-links it to the final name, which fails
if the name exists (the first writer wins and nothing is ever replaced), and then drops
the temporary name. Either way the directory is fsynced afterwards.

A writer holds an exclusive ``flock`` on its temporary file until the temporary name is
gone. The kernel drops that lock when the writer dies, so :func:`sweep_temporaries` can
tell the leftovers of a killed writer (removable) from a live writer's file (kept).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import uuid
from collections.abc import Iterator
from typing import Any

from ._dirfd import FILE_MODE, LifecycleDir
from ._jscompat import dumps_line

# What a temporary file adds to its final name: "." + a UUID + ".tmp".
TEMPORARY_SUFFIX_BYTES = 41
TEMPORARY_NAME = re.compile(r".+\.[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.tmp")
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_INSPECT_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _locked_temporary(directory: LifecycleDir, final: str) -> tuple[str, int]:
    while True:
        name = f"{final}.{uuid.uuid4()}.tmp"
        fd = os.open(name, _CREATE_FLAGS, FILE_MODE, dir_fd=directory.fd)
        fcntl.flock(fd, fcntl.LOCK_EX)
        # A sweeper may have removed it between the create and the lock: start again.
        if os.fstat(fd).st_nlink > 0:
            return name, fd
        os.close(fd)


@contextlib.contextmanager
def _temporary(directory: LifecycleDir, final: str, data: bytes) -> Iterator[str]:
    """A locked, fsynced temporary file holding ``data``; its name is removed (then the lock dropped) on exit."""
    name, fd = _locked_temporary(directory, final)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        yield name
    finally:
        try:
            with contextlib.suppress(FileNotFoundError):
                directory.unlink(name)
        finally:
            os.close(fd)


def replace_record(directory: LifecycleDir, name: str, record: Any) -> None:
    """Replace ``name`` with ``record`` atomically: temporary file, fsync, rename, fsync directory.

    Refuses with ``untrusted_lifecycle_file`` when ``name`` is a symlink or not a regular
    file. A failure leaves the previous file untouched and no temporary file behind.
    """
    directory.require_replaceable(name)
    with _temporary(directory, name, dumps_line(record)) as temporary:
        os.rename(temporary, name, src_dir_fd=directory.fd, dst_dir_fd=directory.fd)
    directory.fsync()


def publish_record(directory: LifecycleDir, name: str, record: Any) -> bool:
    """Publish the immutable ``record`` as ``name`` unless anything already has that name (then ``False``).

    The final name only ever appears as a link to a complete, fsynced file.
    """
    if directory.exists(name):
        return False
    with _temporary(directory, name, dumps_line(record)) as temporary:
        try:
            os.link(temporary, name, src_dir_fd=directory.fd, dst_dir_fd=directory.fd, follow_symlinks=False)
        except FileExistsError:
            return False
    directory.fsync()
    return True


def sweep_temporaries(directory: LifecycleDir) -> None:
    """Remove the temporary files that killed writers left behind; a live writer's file is left alone."""
    for name in directory.listdir():
        if TEMPORARY_NAME.fullmatch(name) is None:
            continue
        try:
            fd = os.open(name, _INSPECT_FLAGS, dir_fd=directory.fd)
        except OSError:
            # Gone already, or not a file of ours (a symlink is never followed, nor removed).
            continue
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            entry = directory.lstat(name)
            if entry is not None and (entry.st_dev, entry.st_ino) == (opened.st_dev, opened.st_ino):
                directory.unlink(name)
        finally:
            os.close(fd)
