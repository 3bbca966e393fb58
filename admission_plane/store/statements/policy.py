"""The single durable policy row and its soft drain."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, exists, func, insert, literal, literal_column, select, update

from ...states import DrainState
from ..model import AdmissionPause, PolicyRevision, PolicyState
from ..rows import PauseRow, PolicyRow, RevisionRow
from ..tx import Query, Scalar, Statement
from ._build import P, lit

PS = PolicyState
STEADY, DRAINING = DrainState.STEADY, DrainState.SOFT_DRAINING_TO_1

SELECT_POLICY = Query(
    select(
        PS.max_active_turns,
        PS.max_concurrent_starts,
        PS.min_start_interval_ms,
        PS.queue_timeout_ms,
        PS.capacity_cooldown_ms,
        PS.drain_state,
        PS.policy_fingerprint,
        PS.revision,
        PolicyRevision.document,
    )
    .outerjoin(PolicyRevision, PolicyRevision.revision == PS.revision)
    .where(PS.id == 1),
    PolicyRow,
)
_CLAIMED = (
    "max_active_turns",
    "max_concurrent_starts",
    "min_start_interval_ms",
    "queue_timeout_ms",
    "capacity_cooldown_ms",
)
INSERT_POLICY_IF_ABSENT = Statement(
    insert(PS).from_select(
        ["id", *_CLAIMED, "drain_state", "policy_fingerprint", "updated_at", "updated_by_owner_instance_id"],
        select(
            literal_column("1"),
            *(P(name) for name in _CLAIMED),
            lit(STEADY),
            P("policy_fingerprint"),
            P("now"),
            P("owner_instance_id"),
        ).where(~exists().where(PS.id == 1)),
    )
)
#: Only a steady three-seat policy may start draining to one seat (the original's only drain).
START_DRAIN = Statement(
    update(PS)
    .where(PS.id == 1, PS.drain_state == lit(STEADY), PS.max_active_turns == 3)
    .values(drain_state=lit(DRAINING), updated_at=P("now"), updated_by_owner_instance_id=P("owner"))
)
COMPLETE_DRAIN = Statement(
    update(PS)
    .where(PS.id == 1, PS.drain_state == lit(DRAINING))
    .values(
        max_active_turns=1,
        max_concurrent_starts=P("max_concurrent_starts"),
        min_start_interval_ms=P("min_start_interval_ms"),
        queue_timeout_ms=P("queue_timeout_ms"),
        capacity_cooldown_ms=P("capacity_cooldown_ms"),
        drain_state=lit(STEADY),
        policy_fingerprint=P("policy_fingerprint"),
        updated_at=P("now"),
        updated_by_owner_instance_id=P("owner"),
    )
)

# --- live policy revisions (revision 0006) --------------------------------------------------------

LATEST_REVISION: Scalar[int] = Scalar(select(func.max(PolicyRevision.revision)))
INSERT_REVISION = Statement(
    insert(PolicyRevision).values(revision=P("revision"), created_at=P("now"), document=P("document"))
)
SELECT_REVISIONS = Query(
    select(PolicyRevision.revision, PolicyRevision.created_at, PolicyRevision.document)
    .order_by(PolicyRevision.revision.desc())
    .limit(P("limit")),
    RevisionRow,
)
#: Put a revision in force (the original's five columns too, so a seed-shaped reader agrees); ends a drain.
APPLY_REVISION = Statement(
    update(PS)
    .where(PS.id == 1)
    .values(
        **{name: P(name) for name in _CLAIMED},
        drain_state=lit(STEADY),
        policy_fingerprint=P("policy_fingerprint"),
        updated_at=P("now"),
        updated_by_owner_instance_id=P("owner_instance_id"),
        revision=P("revision"),
    )
)
INSERT_REVISED_POLICY = Statement(
    insert(PS).values(
        id=1,
        **{name: P(name) for name in _CLAIMED},
        drain_state=lit(STEADY),
        policy_fingerprint=P("policy_fingerprint"),
        updated_at=P("now"),
        updated_by_owner_instance_id=P("owner_instance_id"),
        revision=P("revision"),
    )
)

# --- pauses ------------------------------------------------------------------------------------------

AP = AdmissionPause
_scope = (AP.lane == P("lane"), AP.provider == P("provider"), AP.model == P("model"))
PAUSE_EXISTS: Scalar[int] = Scalar(select(literal_column("1")).where(*_scope))
INSERT_PAUSE = Statement(insert(AP).values(lane=P("lane"), provider=P("provider"), model=P("model"), since=P("now")))
DELETE_PAUSE = Statement(delete(AP).where(*_scope))
SELECT_ALL_PAUSES = Query(
    select(AP.lane, AP.provider, AP.model, AP.since).order_by(AP.lane, AP.provider, AP.model), PauseRow
)


def durable_revision() -> Any:
    """The durable policy's revision (0: none claimed, or none set), for a statement that checks the one its
    caller read (a unit sent whole with its commit)."""
    return func.coalesce(select(PolicyState.revision).limit(1).scalar_subquery(), 0)


def durable_drain_state() -> Any:
    """The durable policy's drain state (``''``: none claimed, so nothing is draining)."""
    return func.coalesce(select(PolicyState.drain_state).limit(1).scalar_subquery(), literal(""))
