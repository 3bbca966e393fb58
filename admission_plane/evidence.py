"""Linux process identity: capture, observe, and process-group inspection.

A process is identified by evidence that survives pid reuse: the host's boot id, the
pid, the start time in clock ticks and the pid-namespace inode (plus ppid, pgrp and
session, recorded for group inspection). Every read goes through injectable
:class:`ProcReaders`; :data:`LIVE_READERS` reads this host's ``/proc``.

Evidence is host-local. A different boot id is read as "rebooted, so gone", which is
only true for evidence recorded on *this* host: on a plane shared by several hosts the
reaper must not observe another host's evidence at all (it knows which host recorded
what; this module does not).
"""

from __future__ import annotations

import calendar
import enum
import os
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from admission_plane._proc import (
    BOOT_ID_PATH,
    LIVE_READERS,
    MAX_PID,
    MAX_PID_NAMESPACE_INODE,
    MAX_START_TIME_TICKS,
    LiveProcReaders,
    ProcReaders,
    ProcStat,
    is_pid,
    is_valid_boot_id,
    parse_stat,
    read_boot_id,
    read_pid_namespace,
    read_process_ids,
    read_stat,
)
from admission_plane._validate import is_owner_instance_id, proc_readers
from admission_plane.clock import wall_clock_ms
from admission_plane.errors import InvalidInputError, ProcessGoneError, ProcessUnverifiableError

__all__ = [
    "BOOT_ID_PATH",
    "LIVE_READERS",
    "MAX_PID",
    "MAX_PID_NAMESPACE_INODE",
    "MAX_START_TIME_TICKS",
    "ConnectorIdentity",
    "GroupResidue",
    "LiveProcReaders",
    "Observation",
    "ProcReaders",
    "ProcStat",
    "ProcessIdentity",
    "capture",
    "format_created_at",
    "inspect_process_group",
    "observe",
    "parse_stat",
    "read_boot_id",
    "read_process_ids",
]


class Observation(enum.StrEnum):
    """What ``/proc`` says now about a recorded process."""

    SAME = "same"
    GONE = "gone"
    PID_REUSED = "pid_reused"
    UNVERIFIABLE = "unverifiable"


class GroupResidue(enum.StrEnum):
    """Whether any process is left in a recorded child's process group and session."""

    EMPTY = "empty"
    PRESENT = "present"
    UNVERIFIABLE = "unverifiable"


_CREATED_AT = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})\.[0-9]{3}Z")
_START_TIME_TICKS = re.compile(r"[1-9][0-9]{0,19}")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PROCESS_KEYS = ("bootId", "pid", "startTimeTicks", "pidNamespaceInode", "ppid", "pgrp", "session")
_CONNECTOR_KEYS = ("ownerInstanceId", "createdAt", *_PROCESS_KEYS)

#: An attrs validator of an ``int`` field (it checks whatever it is given, not only ints).
_IntValidator = Callable[[object, "attrs.Attribute[int]", object], None]


def _int_in_range(label: str, minimum: int, maximum: int) -> _IntValidator:
    kind = "positive" if minimum == 1 else "non-negative"

    def check(_instance: object, _attribute: attrs.Attribute[int], value: object) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
            raise InvalidInputError(f"{label} must be a {kind} safe integer")

    return check


def _positive_int(label: str, maximum: int) -> _IntValidator:
    return _int_in_range(label, 1, maximum)


def _process_id_or_zero(label: str) -> _IntValidator:
    # The kernel reports 0 for a parent, group or session that lives outside the
    # process's pid namespace (a container's pid 1, or any process whose session leader
    # is on the host side). That is real evidence, not a malformed record.
    return _int_in_range(label, 0, MAX_PID)


def _check_boot_id(_instance: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if not is_valid_boot_id(value):
        raise InvalidInputError("process boot ID is invalid")


def _check_start_time_ticks(_instance: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not _START_TIME_TICKS.fullmatch(value) or int(value) > MAX_START_TIME_TICKS:
        raise InvalidInputError("process start time is invalid")


def _check_owner_instance_id(_instance: object, _attribute: attrs.Attribute[str] | None, value: object) -> None:
    if not is_owner_instance_id(value):
        raise InvalidInputError("process record owner instance ID must be a canonical UUID v4")


def _check_created_at(_instance: object, _attribute: attrs.Attribute[str] | None, value: object) -> None:
    match = _CREATED_AT.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidInputError("connector creation timestamp must be canonical UTC")
    year, month, day, hour, minute, second = (int(part) for part in match.groups())
    # Must survive JavaScript's Date round trip: no rollover (Feb 30, 24:00, leap seconds).
    if not 1 <= month <= 12 or not 1 <= day <= _days_in_month(year, month) or hour > 23 or minute > 59 or second > 59:
        raise InvalidInputError("connector creation timestamp is invalid")


def _check_process(_instance: object, _attribute: attrs.Attribute[ProcessIdentity], value: object) -> None:
    if not isinstance(value, ProcessIdentity):
        raise InvalidInputError("connector identity is invalid")


_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # indexed by month, as calendar.mdays


def _days_in_month(year: int, month: int) -> int:
    return 29 if month == 2 and calendar.isleap(year) else _DAYS_IN_MONTH[month]


def _exact_record(value: object, keys: tuple[str, ...], message: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or set(value) != set(keys) or len(value) != len(keys):
        raise InvalidInputError(message)
    return value


@attrs.frozen(kw_only=True)
class ProcessIdentity:
    """The recorded identity of one Linux process (seed: ``LinuxProcessIdentity``).

    Every field is validated on construction and raises :class:`InvalidInputError`:
    ``boot_id`` lowercase 8-4-4-4-12 hex and not all zeros; ``start_time_ticks`` a
    canonical decimal string in 1..2^64-1; ``pid_namespace_inode`` in 1..2^32-1; ``pid``
    an ``int`` (never ``bool`` or ``float``) in 1..2^31-1; ``ppid``, ``pgrp`` and
    ``session`` ints in 0..2^31-1.

    Beyond the seed, which demands 1..2^31-1 for all four ids: the kernel shows 0 for a
    parent, group or session outside the process's pid namespace, which is what every
    process in a typical container sees for its session. Rejecting it would make the
    plane unusable there; accepting it costs nothing in safety, because ``observe``
    compares only the immutable fields and :func:`inspect_process_group` answers
    ``unverifiable`` for a group it cannot see (pgrp 0).
    """

    boot_id: str = attrs.field(validator=_check_boot_id)
    pid: int = attrs.field(validator=_positive_int("process PID", MAX_PID))
    start_time_ticks: str = attrs.field(validator=_check_start_time_ticks)
    pid_namespace_inode: int = attrs.field(validator=_positive_int("PID namespace inode", MAX_PID_NAMESPACE_INODE))
    ppid: int = attrs.field(validator=_process_id_or_zero("process parent PID"))
    pgrp: int = attrs.field(validator=_process_id_or_zero("process group"))
    session: int = attrs.field(validator=_process_id_or_zero("process session"))

    @classmethod
    def from_mapping(cls, value: object) -> ProcessIdentity:
        """Build from the seed's camelCase shape, which must have exactly its seven keys."""
        record = _exact_record(value, _PROCESS_KEYS, "process identity is invalid")
        return cls(
            boot_id=record["bootId"],
            pid=record["pid"],
            start_time_ticks=record["startTimeTicks"],
            pid_namespace_inode=record["pidNamespaceInode"],
            ppid=record["ppid"],
            pgrp=record["pgrp"],
            session=record["session"],
        )

    def to_mapping(self) -> dict[str, str | int]:
        """Return the seed's camelCase shape, keys in the seed's order."""
        return {
            "bootId": self.boot_id,
            "pid": self.pid,
            "startTimeTicks": self.start_time_ticks,
            "pidNamespaceInode": self.pid_namespace_inode,
            "ppid": self.ppid,
            "pgrp": self.pgrp,
            "session": self.session,
        }


@attrs.frozen(kw_only=True)
class ConnectorIdentity:
    """A connector (or queued owner) process: an owner instance id, its creation time, its process.

    ``owner_instance_id`` is a canonical lowercase UUID v4; ``created_at`` is exactly
    ``YYYY-MM-DDTHH:MM:SS.mmmZ`` and a real instant. Invalid values raise
    :class:`InvalidInputError`.
    """

    owner_instance_id: str = attrs.field(validator=_check_owner_instance_id)
    created_at: str = attrs.field(validator=_check_created_at)
    process: ProcessIdentity = attrs.field(validator=_check_process)

    @classmethod
    def from_mapping(cls, value: object) -> ConnectorIdentity:
        """Build from the seed's flat nine-key camelCase shape (exact key set)."""
        record = _exact_record(value, _CONNECTOR_KEYS, "connector identity is invalid")
        # The seed reports the owner and timestamp before any process field.
        _check_owner_instance_id(None, None, record["ownerInstanceId"])
        _check_created_at(None, None, record["createdAt"])
        return cls(
            owner_instance_id=record["ownerInstanceId"],
            created_at=record["createdAt"],
            process=ProcessIdentity.from_mapping({key: record[key] for key in _PROCESS_KEYS}),
        )

    def to_mapping(self) -> dict[str, str | int]:
        """Return the seed's flat nine-key camelCase shape."""
        return {"ownerInstanceId": self.owner_instance_id, "createdAt": self.created_at, **self.process.to_mapping()}

    @classmethod
    def capture(
        cls,
        pid: int | None = None,
        readers: ProcReaders | None = None,
        owner_instance_id: str | None = None,
        now: int | None = None,
    ) -> ConnectorIdentity:
        """Capture a fresh connector identity.

        Defaults: this process, :data:`LIVE_READERS`, a new random UUID v4, and the wall
        clock; ``now`` is integer milliseconds since the epoch. Raises what
        :func:`capture` raises.
        """
        process = capture(os.getpid() if pid is None else pid, LIVE_READERS if readers is None else readers)
        return cls(
            owner_instance_id=str(uuid.uuid4()) if owner_instance_id is None else owner_instance_id,
            created_at=format_created_at(wall_clock_ms() if now is None else now),
            process=process,
        )


def format_created_at(epoch_ms: int) -> str:
    """Format epoch milliseconds as JavaScript's ``toISOString()`` does: ``YYYY-MM-DDTHH:MM:SS.mmmZ``."""
    given: object = epoch_ms  # checked as given: callers without type checking may pass anything
    if not isinstance(given, int) or isinstance(given, bool) or given < 0:
        raise InvalidInputError("connector creation time must be a non-negative safe integer")
    try:
        moment = _EPOCH + timedelta(milliseconds=epoch_ms)
    except OverflowError as exc:
        raise InvalidInputError("connector creation time is out of range") from exc
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
        f"T{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}.{moment.microsecond // 1000:03d}Z"
    )


def capture(pid: int, readers: ProcReaders = LIVE_READERS) -> ProcessIdentity:
    """Capture the identity of the live process ``pid``.

    Raises :class:`ProcessGoneError` when ``/proc/<pid>/stat`` or ``/proc/<pid>/ns/pid``
    is absent (``ENOENT``), :class:`ProcessUnverifiableError` for any other read error,
    malformed text, or values outside the identity ranges, and
    :class:`InvalidInputError` when ``pid`` itself is not a pid or ``readers`` are not
    readers (no callable ``read_file`` and ``read_link``).
    """
    if not is_pid(pid):
        raise InvalidInputError("process PID must be a positive safe integer")
    proc_readers(readers)
    boot_id = read_boot_id(readers)
    stat = read_stat(pid, readers)
    namespace = read_pid_namespace(pid, readers)
    try:
        return ProcessIdentity(
            boot_id=boot_id,
            pid=pid,
            start_time_ticks=stat.start_time_ticks,
            pid_namespace_inode=namespace,
            ppid=stat.ppid,
            pgrp=stat.pgrp,
            session=stat.session,
        )
    except InvalidInputError as exc:
        raise ProcessUnverifiableError(f"process {pid} has no valid identity: {exc}") from exc


def observe(identity: ProcessIdentity | ConnectorIdentity, readers: ProcReaders = LIVE_READERS) -> Observation:
    """Compare a recorded identity with what ``/proc`` shows now (seed: ``observeLinuxProcessIdentity``).

    - ``gone``: ``ENOENT`` on ``/proc/<pid>/stat`` or ``/proc/<pid>/ns/pid``, or another
      boot id (the host rebooted; see the module docstring about other hosts).
    - ``unverifiable``: any other read error, or malformed boot id, stat or link.
    - ``pid_reused``: the pid exists with other start ticks or another pid namespace.
    - ``same``: otherwise. Beyond the seed, only the immutable fields are compared, so a
      reparented process (ppid changed) or one that called ``setsid`` is still ``same``;
      a zombie keeps its start time and is ``same`` too (the conservative answer).

    An ``identity`` that is not one, or ``readers`` without callable ``read_file`` and
    ``read_link``, raise :class:`InvalidInputError`.
    """
    process = identity.process if isinstance(identity, ConnectorIdentity) else identity
    if not isinstance(process, ProcessIdentity):
        raise InvalidInputError("process identity is invalid")
    proc_readers(readers)
    try:
        if read_boot_id(readers) != process.boot_id:
            return Observation.GONE
        stat = read_stat(process.pid, readers)
        namespace = read_pid_namespace(process.pid, readers)
    except ProcessGoneError:
        return Observation.GONE
    except ProcessUnverifiableError:
        return Observation.UNVERIFIABLE
    if stat.start_time_ticks != process.start_time_ticks or namespace != process.pid_namespace_inode:
        return Observation.PID_REUSED
    return Observation.SAME


def inspect_process_group(
    child: ProcessIdentity, pids: Iterable[int], readers: ProcReaders = LIVE_READERS
) -> GroupResidue:
    """Look for residue of ``child``'s process group among ``pids`` (seed: ``inspectLinuxProcessGroup``).

    ``present`` when a listed pid has the child's boot id, pid namespace, pgrp and
    session; ``unverifiable`` when none matched but some listed pid could not be read
    (other than ``ENOENT``: that pid exited) or is not a valid pid; else ``empty``.
    An empty list is ``empty`` without reading anything, and so is another boot id:
    a process group cannot outlive a reboot. The namespace link is read only for a pid
    whose pgrp and session match, so other users' processes (whose links are
    ``EACCES`` to us) cannot make the answer unverifiable.

    A child whose pgrp is 0 belongs to a group led from outside this pid namespace:
    members there are invisible, so the group can never be proved empty and the answer
    is ``unverifiable``. A ``child`` that is not a :class:`ProcessIdentity`, or ``readers``
    that are not readers, raise :class:`InvalidInputError`.
    """
    if not isinstance(child, ProcessIdentity):
        raise InvalidInputError("process identity is invalid")
    proc_readers(readers)
    if child.pgrp == 0:
        return GroupResidue.UNVERIFIABLE
    try:
        candidates = list(pids)
    except TypeError:
        return GroupResidue.UNVERIFIABLE
    if not candidates:
        return GroupResidue.EMPTY
    try:
        if read_boot_id(readers) != child.boot_id:
            return GroupResidue.EMPTY
    except ProcessUnverifiableError:
        return GroupResidue.UNVERIFIABLE
    unverifiable = False
    for pid in candidates:
        if not is_pid(pid):
            unverifiable = True
            continue
        try:
            stat = read_stat(pid, readers)
            if (stat.pgrp, stat.session) == (child.pgrp, child.session) and (
                read_pid_namespace(pid, readers) == child.pid_namespace_inode
            ):
                return GroupResidue.PRESENT
        except ProcessGoneError:
            continue
        except ProcessUnverifiableError:
            unverifiable = True
    return GroupResidue.UNVERIFIABLE if unverifiable else GroupResidue.EMPTY
