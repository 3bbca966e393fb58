"""Leases outside their phase changes: reads, heartbeats, suspicion, starts and cooldowns."""

from __future__ import annotations

from sqlalchemy import delete, exists, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import aliased

from ...states import START_WINDOW_PHASES, STARTING_PHASES
from ..model import BudgetCharge, Cooldown, Lease, StartHistory
from ..rows import LeaseRow
from ..tx import Query, Scalar, Statement
from ._build import P, fenced, one_of
from .admission import json_row
from .policy import SELECT_POLICY

L, C, SH = Lease, Cooldown, StartHistory

#: ``charged``: the request holds a budget reservation (so freeing the seat settles it; see ``service._budgets``).
_charged = exists().where(BudgetCharge.charge_id == L.request_id).label("charged")
#: A lease's columns as :class:`LeaseRow` holds them.
LEASE_COLUMNS = (L.lease_id, L.request_id, L.generation, L.owner_instance_id, L.phase, _charged)
_lease = select(*LEASE_COLUMNS).where(L.lease_id == P("lease_id"))
SELECT_LEASE = Query(_lease, LeaseRow)
#: The lease, row-locked until the transaction ends (a lease unit's first read; SQLite: plain,
#: its write lock already covers the whole database).
SELECT_LEASE_FOR_UPDATE = Query(_lease.with_for_update(of=L), LeaseRow)
_window = aliased(L, name="window_lease")
#: How many leases are in the start window (counted on an alias, so it can sit beside a statement on ``leases``).
START_WINDOW_COUNT = select(func.count()).select_from(_window).where(one_of(_window.phase, START_WINDOW_PHASES))
#: PostgreSQL: ``SELECT_LEASE_FOR_UPDATE``, the policy row (``SELECT_POLICY`` as a JSON array, ``NULL`` when
#: none was claimed) and the number of leases in the start window, in one statement: what ``mark_starting``
#: reads first. Why the policy read here is as current as one read after the lease's lock: if the statement
#: waits for that lock, only the locked lease row is read again when it is granted; the rest keeps the
#: statement's snapshot, taken after the unit's lease gate. Policy writes take both gates exclusively
#: (``Gate.EXCLUSIVE``), so none commits between the two. Why the window count may be that old: see
#: ``service._lifecycle.mark_starting`` (only admission grows the window, never past the limit).
#: (Rows other lease units write, such as a dispatch intent's identity, must not be read this way:
#: a unit that waited for the lease would miss the one written by the unit it waited for.)
SELECT_START_READS = Statement(
    select(
        *LEASE_COLUMNS,
        json_row(SELECT_POLICY).label("policy"),
        START_WINDOW_COUNT.scalar_subquery().label("start_window"),
    )
    .where(L.lease_id == P("lease_id"))
    .with_for_update(of=L),
    only="postgresql",
)
HEARTBEAT = Statement(fenced(update(L)).values(heartbeat_at=P("now"), suspect_since=None, suspect_reason=None))
MARK_SUSPECT = Statement(
    fenced(update(L)).values(suspect_since=func.coalesce(L.suspect_since, P("now")), suspect_reason=P("reason"))
)

COUNT_STARTING_LEASES: Scalar[int] = Scalar(select(func.count()).select_from(L).where(one_of(L.phase, STARTING_PHASES)))
_old_starts = SH.started_at < P("cutoff")
#: Forget starts older than the interval. PostgreSQL skips rows another starter is deleting
#: (they are gone when it commits; no two starters wait for each other over them).
DELETE_OLD_STARTS = Statement(
    delete(SH).where(_old_starts),
    postgresql=delete(SH).where(
        SH.lease_id.in_(select(SH.lease_id).where(_old_starts).with_for_update(skip_locked=True))
    ),
)
LATEST_START: Scalar[int] = Scalar(select(SH.started_at).order_by(SH.started_at.desc()).limit(1))
INSERT_START = Statement(insert(SH).values(lease_id=P("lease_id"), started_at=P("now")))

_cooldown_values = {
    "provider": P("provider"),
    "model": P("model"),
    "not_before": P("not_before"),
    "updated_at": P("now"),
}
_sqlite_upsert = sqlite.insert(C).values(**_cooldown_values)
_postgres_upsert = postgresql.insert(C).values(**_cooldown_values)
#: A cooldown only ever extends: the later ``not_before`` wins.
UPSERT_COOLDOWN = Statement(
    _sqlite_upsert.on_conflict_do_update(
        index_elements=[C.provider, C.model],
        set_={
            "not_before": func.max(C.not_before, _sqlite_upsert.excluded.not_before),
            "updated_at": func.max(C.updated_at, _sqlite_upsert.excluded.updated_at),
        },
    ),
    postgresql=_postgres_upsert.on_conflict_do_update(
        index_elements=[C.provider, C.model],
        set_={
            "not_before": func.greatest(C.not_before, _postgres_upsert.excluded.not_before),
            "updated_at": func.greatest(C.updated_at, _postgres_upsert.excluded.updated_at),
        },
    ),
)
