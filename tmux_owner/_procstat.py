"""Linux process start time: field 22 of ``/proc/<pid>/stat``, parsed after the last ``)``.

The ``comm`` field may hold spaces and parentheses (tmux's server is ``tmux: server``),
so splitting the whole line on whitespace picks the wrong field.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path
from typing import Literal, cast

import attrs

from ._jscompat import is_safe_integer, js_trim

_PID = re.compile(r"[1-9][0-9]*")
_FIELD_SEPARATOR = re.compile(r"[ \t]+")
_STATE = re.compile(r"[A-Za-z]")
_TTY = re.compile(r"-?[0-9]+")
_DIGITS = re.compile(r"[0-9]+")
_START_TIME_INDEX = 19  # field 22 of proc(5), counted from the state field (field 3)


def parse_linux_proc_start_time(stat: str | None) -> str | None:
    """Field 22 of one ``/proc/<pid>/stat`` record as a decimal string, or ``None`` if malformed.

    Accepts one trailing newline; refuses NUL, CR, a second line, a non-numeric pid, a
    missing ``(`` or separator after ``)``, fewer than 20 fields after ``)``, a state
    that is not one letter, a non-integer tty and a non-numeric start time.
    """
    if not isinstance(stat, str) or not stat or "\0" in stat or "\r" in stat:
        return None
    record = stat[:-1] if stat.endswith("\n") else stat
    if not record or "\n" in record:
        return None
    open_at = record.find(" (")
    close_at = record.rfind(")")
    if open_at < 1 or close_at <= open_at + 1 or _PID.fullmatch(record[:open_at]) is None:
        return None
    suffix = record[close_at + 1 :]
    if not suffix.startswith((" ", "\t")):
        return None
    fields = _FIELD_SEPARATOR.split(js_trim(suffix))
    if len(fields) <= _START_TIME_INDEX or _STATE.fullmatch(fields[0]) is None:
        return None
    if _TTY.fullmatch(fields[4]) is None:
        return None
    start_time = fields[_START_TIME_INDEX]
    return start_time if _DIGITS.fullmatch(start_time) else None


def owner_process_start_time(platform: str, stat: str | None) -> str | None:
    """The seed's ``ownerProcessStartTime``: ``not_applicable`` off Linux, else field 22 or ``None``."""
    if platform != "linux":
        return "not_applicable"
    return parse_linux_proc_start_time(stat)


ProbeKind = Literal["live", "absent", "unverifiable"]


@attrs.frozen
class ProcPidProbe:
    """What reading ``/proc/<pid>/stat`` proved: a live start time, absence, or why it could not."""

    kind: ProbeKind
    start_time: str | None = None
    reason: str | None = None


def probe_linux_proc_pid(pid: object, platform: str = "linux", proc_root: Path = Path("/proc")) -> ProcPidProbe:
    """Read the live start time of ``pid``; fail closed on anything but a parsable record."""
    if not is_safe_integer(pid) or int(cast(float, pid)) <= 0:
        return ProcPidProbe("unverifiable", reason="invalid_pid")
    if platform != "linux":
        return ProcPidProbe("unverifiable", reason="unsupported_platform")
    try:
        stat = (proc_root / str(int(cast(float, pid))) / "stat").read_text(encoding="utf-8")
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ESRCH):
            return ProcPidProbe("absent")
        if error.errno in (errno.EACCES, errno.EPERM):
            return ProcPidProbe("unverifiable", reason="permission_denied")
        return ProcPidProbe("unverifiable", reason="read_error")
    except UnicodeDecodeError:
        return ProcPidProbe("unverifiable", reason="malformed_stat")
    start_time = parse_linux_proc_start_time(stat)
    if start_time is None:
        return ProcPidProbe("unverifiable", reason="malformed_stat")
    return ProcPidProbe("live", start_time=start_time)


def read_linux_proc_start_time(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The live start time of ``pid``, or ``None`` when it is absent or unverifiable."""
    probe = probe_linux_proc_pid(pid, proc_root=proc_root)
    return probe.start_time if probe.kind == "live" else None
