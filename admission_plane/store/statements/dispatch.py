"""Process evidence recorded with a dispatch intent, and the recovery inventory that reads it back."""

from __future__ import annotations

from sqlalchemy import exists, insert, select

from ..model import Lease, LeaseProcessIdentity, TurnRequest
from ..rows import DispatchRow, IdentityRow, LeaseWithRequestRow
from ..tx import Query, Statement
from ._build import P
from .leases import LEASE_COLUMNS

R, L, LPI = TurnRequest, Lease, LeaseProcessIdentity

_IDENTITY_COLUMNS = (
    LPI.request_id,
    LPI.lease_generation,
    LPI.owner_instance_id,
    LPI.prompt_channel,
    LPI.connector_owner_instance_id,
    LPI.connector_created_at,
    LPI.connector_boot_id,
    LPI.connector_pid,
    LPI.connector_start_time_ticks,
    LPI.connector_pid_namespace_inode,
    LPI.connector_ppid,
    LPI.connector_pgrp,
    LPI.connector_session,
    LPI.child_boot_id,
    LPI.child_pid,
    LPI.child_start_time_ticks,
    LPI.child_pid_namespace_inode,
    LPI.child_ppid,
    LPI.child_pgrp,
    LPI.child_session,
)
SELECT_IDENTITY = Query(select(*_IDENTITY_COLUMNS).where(LPI.lease_id == P("lease_id")), IdentityRow)
INSERT_IDENTITY = Statement(
    insert(LPI).values(
        lease_id=P("lease_id"),
        recorded_at=P("now"),
        host_id=P("host_id"),
        **{column.key: P(column.key) for column in _IDENTITY_COLUMNS},
    )
)
#: A dispatch intent's first read: the lease, row-locked (``SELECT_LEASE_FOR_UPDATE``), and whether process
#: evidence is recorded for it, in one statement. The flag comes from the statement's snapshot: when the
#: statement waited for the lease's lock, a dispatch intent committed by the unit it waited for is not in it.
#: So it is relied on only for a lease read in ``starting`` (no identity can have been recorded for a lease
#: still starting: the one statement that records it moves the lease on in the same transaction, and the
#: identity's primary key refuses a second one in any case); a lease already in ``dispatch_intent`` has its
#: identity read again (``SELECT_IDENTITY``).
SELECT_LEASE_FOR_DISPATCH = Statement(
    select(*LEASE_COLUMNS, exists().where(LPI.lease_id == L.lease_id).label("identified"))
    .where(L.lease_id == P("lease_id"))
    .with_for_update(of=L)
)
SELECT_LEASE_WITH_REQUEST = Query(
    select(
        L.lease_id,
        L.request_id,
        L.generation,
        L.owner_instance_id,
        L.phase,
        R.state.label("request_state"),
        R.lease_generation.label("request_generation"),
    )
    .join(R, R.request_id == L.request_id)
    .where(L.lease_id == P("lease_id")),
    LeaseWithRequestRow,
)

_RENAMED = {"request_id": "identity_request_id", "lease_generation": "identity_generation",
            "owner_instance_id": "identity_owner_instance_id"}  # fmt: skip
LIST_DISPATCHES = Query(
    select(
        L.lease_id,
        L.request_id.label("lease_request_id"),
        L.generation,
        L.owner_instance_id,
        L.phase,
        L.heartbeat_at,
        R.request_id,
        R.session_id,
        R.provider,
        R.model,
        R.state.label("request_state"),
        R.lease_generation.label("request_generation"),
        R.enqueued_at,
        LPI.lease_id.label("identity_lease_id"),
        *(column.label(_RENAMED.get(column.key, column.key)) for column in _IDENTITY_COLUMNS),
        LPI.host_id,
    )
    .select_from(L)
    .outerjoin(R, R.request_id == L.request_id)
    .outerjoin(LPI, LPI.lease_id == L.lease_id)
    .order_by(R.enqueued_at, R.request_id, L.lease_id),
    DispatchRow,
)
