"""Which host recorded a piece of process evidence.

Process evidence is host-local: on a plane shared by several machines (PostgreSQL) a
reaper may judge only the evidence its own host recorded. A host id must therefore be
stable across reboots (a changed boot id on the *same* host still proves its old
processes gone) and distinct between hosts. The default is this machine's
``/etc/machine-id`` qualified by its hostname, so containers that share a machine id but
not a hostname are told apart; set ``AdmissionPlane(host_id=...)`` when neither is
reliable in your deployment.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

from ._validate import is_identifier

_MACHINE_ID = re.compile(r"[0-9a-f]{32}")
MACHINE_ID_PATHS = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))


def read_machine_id(paths: tuple[Path, ...] = MACHINE_ID_PATHS) -> str | None:
    """The systemd/dbus machine id (32 lowercase hex digits), or ``None`` if there is none."""
    for path in paths:
        try:
            text = path.read_text(encoding="ascii").strip().lower()
        except (OSError, UnicodeDecodeError):
            continue
        if _MACHINE_ID.fullmatch(text) and text != "0" * 32:
            return text
    return None


def default_host_id() -> str:
    """``<machine-id>@<hostname>`` (or just the hostname when there is no machine id)."""
    hostname = socket.gethostname().strip() or "localhost"
    machine_id = read_machine_id()
    host_id = hostname if machine_id is None else f"{machine_id}@{hostname}"
    return host_id[:256] if is_identifier(host_id[:256]) else "localhost"
