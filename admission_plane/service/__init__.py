"""The service layer: every operation of the plane, one module per job.

:class:`AdmissionService` is the thin façade (construction, close, one line per
operation; the recovery operations beyond the seed are its base in :mod:`._facade_recovery`);
:class:`admission_plane.AdmissionPlane` adds the turn API and the reaper on top of it. The jobs:

* :mod:`._admission` — the admission rule: expiry, capacity, selection, reservation, and
  the waiter's look; :mod:`._waiting` — waiting on the doorbell;
* :mod:`._enqueue` / :mod:`._payloads` — entering the queue, sealed prompts;
* :mod:`._lifecycle` — a lease from ``starting`` to the end of its seat; :mod:`._dispatch` —
  the dispatch intent with its process evidence;
* :mod:`._transitions` — the one function that applies an edge of
  :data:`admission_plane.states.TRANSITIONS`; :mod:`._journal` — the audit journal;
* :mod:`._policy` — the durable policy and its soft drain; :mod:`._reads` /
  :mod:`._inventory` — reads and the recovery inventory (fail-closed listings, and the
  reaper's row-by-row reading);
* :mod:`._context` — what every job shares (engine, keys, policy, clock, identity).
"""

from __future__ import annotations

from ..clock import wall_clock_ms
from ._context import FaultInjection
from ._facade import AdmissionService
from ._journal import MAX_UNTRUSTED_ROWS
from ._waiting import DOORBELL_FALLBACK_MS

__all__ = ["DOORBELL_FALLBACK_MS", "MAX_UNTRUSTED_ROWS", "AdmissionService", "FaultInjection", "wall_clock_ms"]
