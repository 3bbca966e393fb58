"""The single durable policy row and its soft drain."""

from __future__ import annotations

from sqlalchemy import exists, insert, literal_column, select, update

from ...states import DrainState
from ..model import PolicyState
from ..rows import PolicyRow
from ..tx import Query, Statement
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
    ).where(PS.id == 1),
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
