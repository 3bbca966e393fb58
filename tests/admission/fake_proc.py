"""An in-memory /proc for reaper tests: chosen identities, alive, gone (ENOENT) or unreadable (EACCES)."""

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


def stat_line(identity: ProcessIdentity, *, ppid: int | None = None, state: str = "S") -> str:
    """The ``/proc/<pid>/stat`` line of ``identity`` (52 fields, comm with spaces and parentheses)."""
    fields = [state, str(identity.ppid if ppid is None else ppid), str(identity.pgrp), str(identity.session), "0", "-1"]
    fields += ["0"] * (21 - 8)  # proc(5) fields 9..21
    fields.append(identity.start_time_ticks)
    fields += ["0"] * (52 - 22)
    return f"{identity.pid} (agent (x) y) {' '.join(fields)}\n"


def os_error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def _give(value: str | BaseException) -> str:
    if isinstance(value, BaseException):
        raise value
    return value


@attrs.define
class FakeProc:
    """``ProcReaders`` over a dict: unknown pids are ENOENT; ``pids`` overrides the inventory (value or exception)."""

    boot_id: str | BaseException = BOOT + "\n"
    stats: dict[int, str | BaseException] = attrs.Factory(dict)
    links: dict[int, str | BaseException] = attrs.Factory(dict)
    pids: object = None
    reads: list[str] = attrs.Factory(list)

    def alive(self, *identities: ProcessIdentity | ConnectorIdentity, ppid: int | None = None) -> FakeProc:
        """Show each identity as a running process (optionally reparented to ``ppid``)."""
        for identity in identities:
            found = identity.process if isinstance(identity, ConnectorIdentity) else identity
            self.stats[found.pid] = stat_line(found, ppid=ppid)
            self.links[found.pid] = f"pid:[{found.pid_namespace_inode}]"
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
            return _give(self.boot_id)
        match = re.fullmatch(r"/proc/([0-9]+)/stat", path)
        return _give(self.stats.get(int(match[1]), os_error(errno.ENOENT)) if match else os_error(errno.ENOENT))

    def read_link(self, path: str) -> str:
        self.reads.append(path)
        match = re.fullmatch(r"/proc/([0-9]+)/ns/pid", path)
        return _give(self.links.get(int(match[1]), os_error(errno.ENOENT)) if match else os_error(errno.ENOENT))

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
