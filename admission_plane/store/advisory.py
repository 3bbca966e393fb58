"""The plane's PostgreSQL advisory lock keys, in one place (:mod:`.unit_of_work` says who takes which).

Each key is seven ASCII letters read as a big-endian integer ("admiss" and one letter), so a
database administrator reading ``pg_locks`` (``classid`` and ``objid`` are its high and low 32
bits) can tell the plane's locks from anyone else's.
"""

from __future__ import annotations

__all__ = ["ADVISORY_LOCK_KEY", "DRAIN_LOCK_KEY", "LEASE_LOCK_KEY", "LISTENING_KEY", "START_LOCK_KEY"]

#: ``pg_advisory_xact_lock`` key of the admission gate ("admissn"): every writer of one plane
#: takes it, shared or exclusively, before its journal events (:class:`~.unit_of_work.Gate`).
ADVISORY_LOCK_KEY = 0x61646D697373_6E
#: Key of the lease gate ("admissl"): lease units take it shared, ``Gate.EXCLUSIVE`` units exclusively.
LEASE_LOCK_KEY = 0x61646D697373_6C
#: Taken by ``mark_starting`` in a lease unit: shared when the start window already proves the
#: start limit, exclusive when it must count starts or space them out ("admisss").
START_LOCK_KEY = 0x61646D697373_73
#: Taken exclusively by a lease unit that frees a seat while a soft drain is pending, before it
#: counts the seats left ("admissd").
DRAIN_LOCK_KEY = 0x61646D697373_64
#: Held shared, at session level, by every connection listening on the doorbell's channel ("admissw"):
#: a writer sends its ``NOTIFY`` only while someone holds it (:mod:`.doorbell`, "Who is told").
LISTENING_KEY = 0x61646D697373_77
