"""Reading Linux ``/proc``: the injectable readers and the parsers of what they return.

Nothing here decides whether a process is alive; :mod:`admission_plane.evidence` does.
Parsers raise :class:`~admission_plane.errors.ProcessUnverifiableError` on anything
malformed, and a read raises :class:`~admission_plane.errors.ProcessGoneError` only when
the reader's error carries ``errno == ENOENT``.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable
from typing import Protocol

import attrs

from admission_plane._validate import proc_readers
from admission_plane.errors import ProcessGoneError, ProcessUnverifiableError

__all__ = [
    "BOOT_ID_PATH",
    "LIVE_READERS",
    "MAX_PID",
    "MAX_PID_NAMESPACE_INODE",
    "MAX_START_TIME_TICKS",
    "LiveProcReaders",
    "ProcReaders",
    "ProcStat",
    "is_pid",
    "is_valid_boot_id",
    "parse_pid_namespace_link",
    "parse_stat",
    "read_boot_id",
    "read_pid_namespace",
    "read_process_ids",
    "read_stat",
]

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
MAX_PID = 2_147_483_647
MAX_PID_NAMESPACE_INODE = 4_294_967_295
MAX_START_TIME_TICKS = 2**64 - 1

_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ZERO_BOOT_ID = "00000000-0000-0000-0000-000000000000"
_PROCESS_STATES = frozenset("RSDZTtWXxKPI")
# Canonical decimals only; the length caps keep int() far below its digit limit.
_STAT_PID = re.compile(r"[1-9][0-9]{0,9}")
_STAT_ID = re.compile(r"0|[1-9][0-9]{0,9}")
_STAT_TICKS = re.compile(r"0|[1-9][0-9]{0,19}")
_STAT_NUMBER = re.compile(r"-?[0-9]+")
_NAMESPACE_LINK = re.compile(r"pid:\[([1-9][0-9]{0,19})\]")
# proc(5) numbers stat fields from 1; after the comm (field 2) field 3 is the state.
_FIRST_FIELD_AFTER_COMM = 3
_START_TIME_FIELD = 22


class ProcReaders(Protocol):
    """The three reads process evidence needs, injectable so tests never touch a real process.

    A failed read must raise an :class:`OSError` whose ``errno`` says why: only
    ``ENOENT`` means "absent"; every other error (and any other exception) is
    treated as unverifiable.
    """

    def read_file(self, path: str) -> str:
        """Return the whole text of ``path``."""
        ...

    def read_link(self, path: str) -> str:
        """Return the target of the symbolic link ``path``."""
        ...

    def list_process_ids(self) -> Iterable[int]:
        """Return the ids of every process visible in ``/proc``."""
        ...


@attrs.frozen
class LiveProcReaders:
    """:class:`ProcReaders` over the real ``/proc`` of this host."""

    def read_file(self, path: str) -> str:
        """Read ``path``; the process name in a stat line is arbitrary bytes, so never fail on decoding."""
        with open(path, "rb") as stream:
            return stream.read().decode("utf-8", errors="surrogateescape")

    def read_link(self, path: str) -> str:
        """Return ``readlink(path)``."""
        return os.readlink(path)

    def list_process_ids(self) -> list[int]:
        """Return the numeric entries of ``/proc``."""
        return [int(name) for name in os.listdir("/proc") if _STAT_PID.fullmatch(name)]


LIVE_READERS: ProcReaders = LiveProcReaders()


@attrs.frozen(kw_only=True)
class ProcStat:
    """The evidence-bearing fields of one ``/proc/<pid>/stat`` line (ranges not yet checked)."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start_time_ticks: str


def is_valid_boot_id(value: object) -> bool:
    """Whether ``value`` is a lowercase 8-4-4-4-12 hex boot id that is not all zeros."""
    return isinstance(value, str) and _BOOT_ID.fullmatch(value) is not None and value != _ZERO_BOOT_ID


def read_boot_id(readers: ProcReaders) -> str:
    """Read this host's boot id: lower-cased, one trailing newline stripped, validated.

    Raises :class:`ProcessUnverifiableError` when it cannot be read (even ``ENOENT``: the
    boot id is host evidence, its absence says nothing about any process) or is malformed,
    and :class:`~admission_plane.errors.InvalidInputError` for ``readers`` that are not readers.
    """
    proc_readers(readers)
    try:
        text = _read(readers.read_file, BOOT_ID_PATH)
    except ProcessGoneError as exc:
        raise ProcessUnverifiableError("boot id is unavailable") from exc.__cause__
    boot_id = text.removesuffix("\n").lower()
    if not is_valid_boot_id(boot_id):
        raise ProcessUnverifiableError("boot id is malformed")
    return boot_id


def parse_stat(text: object) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line.

    The process name (comm) is not escaped and may hold spaces, parentheses and even
    newlines, so the only safe delimiter is the *last* ``)``. Raises
    :class:`ProcessUnverifiableError` on anything malformed. ``ppid``, ``pgrp``,
    ``session`` and the start time may be 0 here (init, kernel threads); whether they
    form a valid identity is :class:`~admission_plane.evidence.ProcessIdentity`'s call.
    """
    if not isinstance(text, str):
        raise ProcessUnverifiableError("stat record is not text")
    line = text.removesuffix("\n")
    head, separator, tail = line.rpartition(")")
    pid_text, opening, _comm = head.partition(" (")
    if not separator or not opening or _STAT_PID.fullmatch(pid_text) is None:
        raise ProcessUnverifiableError("stat record has no valid pid and comm")
    if not tail.startswith(" "):
        raise ProcessUnverifiableError("stat record has no field after the comm")
    fields = tail[1:].split(" ")
    start_index = _START_TIME_FIELD - _FIRST_FIELD_AFTER_COMM
    if len(fields) <= start_index or fields[0] not in _PROCESS_STATES:
        raise ProcessUnverifiableError("stat record is incomplete or has an invalid state")
    if any(_STAT_NUMBER.fullmatch(field) is None for field in fields[1:]):
        raise ProcessUnverifiableError("stat record has a malformed numeric field")
    ppid, pgrp, session, ticks = fields[1], fields[2], fields[3], fields[start_index]
    if not all(_STAT_ID.fullmatch(value) for value in (ppid, pgrp, session)) or not _STAT_TICKS.fullmatch(ticks):
        raise ProcessUnverifiableError("stat record has an out-of-range identity field")
    return ProcStat(
        pid=int(pid_text),
        state=fields[0],
        ppid=int(ppid),
        pgrp=int(pgrp),
        session=int(session),
        start_time_ticks=ticks,
    )


def parse_pid_namespace_link(text: object) -> int:
    """Return ``N`` from a ``/proc/<pid>/ns/pid`` link target ``pid:[N]``, N in 1..2^32-1."""
    match = _NAMESPACE_LINK.fullmatch(text) if isinstance(text, str) else None
    if match is None or int(match[1]) > MAX_PID_NAMESPACE_INODE:
        raise ProcessUnverifiableError("pid namespace link is malformed")
    return int(match[1])


def read_stat(pid: int, readers: ProcReaders) -> ProcStat:
    """Read and parse ``/proc/<pid>/stat``; gone on ENOENT, unverifiable on anything else."""
    stat = parse_stat(_read(readers.read_file, f"/proc/{pid}/stat"))
    if stat.pid != pid:
        raise ProcessUnverifiableError(f"/proc/{pid}/stat describes another pid")
    return stat


def read_pid_namespace(pid: int, readers: ProcReaders) -> int:
    """Read ``/proc/<pid>/ns/pid``; gone on ENOENT, unverifiable on anything else."""
    return parse_pid_namespace_link(_read(readers.read_link, f"/proc/{pid}/ns/pid"))


def read_process_ids(readers: object) -> tuple[int, ...] | None:
    """The process inventory: sorted unique pids, or ``None`` when it cannot be trusted.

    ``None`` when ``readers`` has no callable ``list_process_ids``, when it raises or
    returns something that is not iterable, or when any entry is not an ``int`` in
    1..2^31-1 (``bool`` and integral ``float`` values are rejected).
    """
    list_process_ids = getattr(readers, "list_process_ids", None)
    if not callable(list_process_ids):
        return None
    try:
        ids = list(list_process_ids())
    except Exception:  # noqa: BLE001 -- any failure of an injected inventory means "no inventory"
        return None
    if not all(is_pid(pid) for pid in ids):
        return None
    return tuple(sorted(set(ids)))


def is_pid(value: object) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) in 1..2^31-1."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PID


def _read(read: Callable[[str], object], path: str) -> str:
    try:
        value = read(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise ProcessGoneError(f"{path} is absent") from exc
        raise ProcessUnverifiableError(f"{path} is unreadable ({_errno_name(exc)})") from exc
    except Exception as exc:  # an injected reader may fail in any way; that is never proof
        raise ProcessUnverifiableError(f"{path} is unreadable") from exc
    if not isinstance(value, str):
        raise ProcessUnverifiableError(f"{path} did not read as text")
    return value


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno, "no errno") if isinstance(exc.errno, int) else "no errno"
