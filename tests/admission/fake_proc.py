"""The one in-memory /proc of the test suite, for evidence, reaper and multi-host tests.

:class:`FakeProc` shows chosen processes alive, gone (ENOENT) or unreadable (EACCES, or any
other error), logs every read, and lists its processes as the pid inventory.
"""

from __future__ import annotations

import errno
import os
import re

import attrs

from admission_plane.evidence import BOOT_ID_PATH, ConnectorIdentity, ProcessIdentity, format_created_at

BOOT = "0d1c2b3a-4f5e-4d6c-8b7a-112233445566"
OTHER_BOOT = "ffeeddcc-bbaa-4999-8888-777766665555"
NS = 4_026_531_836
OWNER_A = "3f2b8c1e-9a4d-4e7f-b6c5-0123456789ab"
OWNER_B = "7c1d2e3f-4a5b-4c6d-9e8f-abcdef012345"
CREATED_AT = format_created_at(1_700_000_000_000)
#: The pid and start ticks of the process that ``FakeProc().add()`` shows by default.
PID = 4242
START = "424242"


def process(
    pid: int,
    *,
    boot_id: str = BOOT,
    start: str | None = None,
    ns: int = NS,
    ppid: int = 1,
    pgrp: int | None = None,
    session: int | None = None,
) -> ProcessIdentity:
    """A process identity; by default its own group and session leader, started at ``pid * 10`` ticks."""
    return ProcessIdentity(
        boot_id=boot_id,
        pid=pid,
        start_time_ticks=str(pid * 10) if start is None else start,
        pid_namespace_inode=ns,
        ppid=ppid,
        pgrp=pid if pgrp is None else pgrp,
        session=pid if session is None else session,
    )


def connector(pid: int, owner: str = OWNER_A, **fields: object) -> ConnectorIdentity:
    """A connector identity for ``owner`` running as ``pid``."""
    return ConnectorIdentity(owner_instance_id=owner, created_at=CREATED_AT, process=process(pid, **fields))  # type: ignore[arg-type]


def stat_line(
    pid: int,
    *,
    comm: str = "worker",
    state: str = "S",
    ppid: int = 1,
    pgrp: int | None = None,
    session: int | None = None,
    start: str = START,
) -> str:
    """A full 52-field stat line; unnamed fields hold 100 + their proc(5) number, so an off-by-one shows."""
    fields = [state, str(ppid), str(pid if pgrp is None else pgrp), str(pid if session is None else session), "0", "-1"]
    fields += [str(100 + number) for number in range(9, 22)]
    fields.append(start)
    fields += [str(100 + number) for number in range(23, 53)]
    return f"{pid} ({comm}) {' '.join(fields)}\n"


def os_error(code: int, path: str = "") -> OSError:
    """An OSError carrying ``code`` as its errno, as the kernel would raise it."""
    return OSError(code, os.strerror(code), path)


def give(value: str | BaseException) -> str:
    """Return ``value``, or raise it when it is an exception."""
    if isinstance(value, BaseException):
        raise value
    return value


@attrs.define
class FakeProc:
    """``ProcReaders`` over dicts: unknown pids are ENOENT, every read is logged, ``pids`` overrides the inventory.

    A ``stats``, ``links`` or ``pids`` value (or ``boot_id``) may be an exception, which the read raises.
    """

    boot_id: str | BaseException = BOOT + "\n"
    stats: dict[int, str | BaseException] = attrs.Factory(dict)
    links: dict[int, str | BaseException] = attrs.Factory(dict)
    pids: object = None
    reads: list[str] = attrs.Factory(list)

    def add(self, pid: int = PID, *, ns: int = NS, **stat: object) -> FakeProc:
        """Show a running process ``pid`` in pid namespace ``ns``; ``stat`` are the fields of :func:`stat_line`."""
        self.stats[pid] = stat_line(pid, **stat)  # type: ignore[arg-type]
        self.links[pid] = f"pid:[{ns}]"
        return self

    def alive(self, *identities: ProcessIdentity | ConnectorIdentity, ppid: int | None = None) -> FakeProc:
        """Show each identity as a running process (optionally reparented to ``ppid``)."""
        for identity in identities:
            found = identity.process if isinstance(identity, ConnectorIdentity) else identity
            self.add(
                found.pid,
                ns=found.pid_namespace_inode,
                comm="agent (x) y",
                ppid=found.ppid if ppid is None else ppid,
                pgrp=found.pgrp,
                session=found.session,
                start=found.start_time_ticks,
            )
        return self

    def reused(self, identity: ProcessIdentity | ConnectorIdentity) -> FakeProc:
        """Show another process (other start ticks) under the identity's pid."""
        found = identity.process if isinstance(identity, ConnectorIdentity) else identity
        return self.alive(attrs.evolve(found, start_time_ticks=found.start_time_ticks + "7"))

    def unreadable(self, pid: int, code: int = errno.EACCES) -> FakeProc:
        """Make ``/proc/<pid>/stat`` fail with ``code`` (EACCES by default: neither alive nor gone)."""
        self.stats[pid] = os_error(code)
        return self

    def read_file(self, path: str) -> str:
        self.reads.append(path)
        if path == BOOT_ID_PATH:
            return give(self.boot_id)
        match = re.fullmatch(r"/proc/([0-9]+)/stat", path)
        return give(self.stats.get(int(match[1]), os_error(errno.ENOENT, path)) if match else os_error(errno.ENOENT))

    def read_link(self, path: str) -> str:
        self.reads.append(path)
        match = re.fullmatch(r"/proc/([0-9]+)/ns/pid", path)
        return give(self.links.get(int(match[1]), os_error(errno.ENOENT, path)) if match else os_error(errno.ENOENT))

    def list_process_ids(self) -> object:
        if isinstance(self.pids, BaseException):
            raise self.pids
        return sorted(self.stats) if self.pids is None else self.pids


@attrs.define
class NoInventoryProc:
    """Readers that can read files and links but have no ``list_process_ids`` at all."""

    inner: FakeProc = attrs.Factory(FakeProc)

    def read_file(self, path: str) -> str:
        return self.inner.read_file(path)

    def read_link(self, path: str) -> str:
        return self.inner.read_link(path)
