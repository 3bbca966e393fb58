"""Admission: queue time-outs, capacity counts, the chosen request, and a queued request's place.

The admission rule itself walks the admission index (:mod:`.queue`,
:mod:`admission_plane.service._selection`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ScalarSelect, Select, and_, exists, func, literal_column, select, tuple_
from sqlalchemy.dialects.postgresql import aggregate_order_by

from ...states import SEAT_PHASES, RequestState
from ..model import Cooldown, Lease, StartHistory, TurnPayload, TurnRequest
from ..rows import Candidate, QueuedEntry
from ..tx import Query, Scalar, Statement
from ._build import P, lit, one, one_of
from .policy import SELECT_POLICY
from .queue import QA, QK, SEATS_LATERAL, SELECT_ACTIVE_COOLDOWNS, SELECT_ENTRY, SELECT_KEYS, SELECT_PAUSES

R, L, C, PL, SH = TurnRequest, Lease, Cooldown, TurnPayload, StartHistory
QUEUED = RequestState.QUEUED

#: The earliest deadline of a queued request that has passed (``NULL``: none has). Both dialects read it as one step
#: of ``turn_requests_state_deadline`` (``state``, ``deadline_at``): the min/max rewrite of PostgreSQL's planner, and
#: SQLite's, turn ``min`` under an equality on the leading column into the first index entry of the range.
_earliest_passed_deadline = (
    select(func.min(R.deadline_at)).where(R.state == lit(QUEUED), R.deadline_at <= P("now")).scalar_subquery()
)
#: A row when a queued request is past its deadline. Asked as "the earliest passed deadline", not "any row past it":
#: PostgreSQL prepares the statement once per connection with a generic plan (``GENERIC_PLANS``), which cannot know
#: ``now``; for "any row with ``deadline_at <= $1``" it guessed that a third of the queue matches and scanned the
#: table, every queued request, on every admission and every waiter's look, so both grew with the queue (2.1 ms of
#: a 2.3 ms look at 10 000 queued requests, benchmarks/test_depth_adversarial.py). The range stays in the question:
#: without it the index step starts at the first ``queued`` entry, and walks the entries that every request left
#: there while it was queued, dead since and kept until a vacuum (P = 8 × 0.89 in alternating windows).
ANY_EXPIRED: Scalar[int] = Scalar(select(one()).where(_earliest_passed_deadline.is_not(None)))
#: Every queued request past its deadline, in ``request_id`` order (the original's), for the sweep that times them
#: out. The range is bounded on both sides, from the earliest passed deadline to ``now``: under a generic plan,
#: PostgreSQL guesses that "``deadline_at <= $1``" matches a third of the queue and scans the table, but a range
#: bounded by two values it cannot know it guesses narrow, and reads the range from ``turn_requests_state_deadline``.
SELECT_EXPIRED: Scalar[str] = Scalar(
    select(R.request_id)
    .where(
        R.state == lit(QUEUED),
        R.deadline_at >= _earliest_passed_deadline.correlate(None),
        R.deadline_at <= P("now"),
    )
    .order_by(R.request_id)
)

COUNT_SEAT_LEASES: Scalar[int] = Scalar(select(func.count()).select_from(L).where(one_of(L.phase, SEAT_PHASES)))


def _select(statement: Statement) -> Select[Any]:
    construct = statement.construct
    assert isinstance(construct, Select), "a query's construct is a SELECT"
    return construct


def json_row(query: Query[Any]) -> ScalarSelect[Any]:
    """The query's first row as a JSON array of its columns, in order (``NULL``: no row)."""
    rows = _select(query).subquery()
    return select(func.json_build_array(*rows.c)).select_from(rows).limit(1).scalar_subquery()


def _json_rows(query: Query[Any], *order: str) -> ScalarSelect[Any]:
    """Every row of the query as a JSON array of JSON arrays (``[]``: none), sorted by ``order``."""
    return _json_select(_select(query), *order)


def _json_select(construct: Select[Any], *order: str) -> ScalarSelect[Any]:
    rows = construct.subquery()
    row = func.json_build_array(*rows.c)
    rows_json = func.json_agg(aggregate_order_by(row, *(rows.c[name] for name in order)) if order else row)
    return select(func.coalesce(rows_json, literal_column("'[]'::json"))).select_from(rows).scalar_subquery()


#: How many keys (the oldest heads first) :data:`ADMISSION_READS` reads the first page of agents of.
FIRST_PAGE_KEYS = 4
#: How many agents a page holds (``service._selection.PAGE``).
AGENT_PAGE_SIZE = 8
_first_keys = select(QK).order_by(QK.head_enqueued_at, QK.head_request_id).limit(FIRST_PAGE_KEYS).subquery("k")
_first_agents = (
    select(QA.lane, QA.provider, QA.model, QA.agent_id.label("member"), QA.head_enqueued_at, QA.head_request_id)
    .where(QA.lane == _first_keys.c.lane, QA.provider == _first_keys.c.provider, QA.model == _first_keys.c.model)
    .order_by(QA.head_enqueued_at, QA.head_request_id)
    .limit(AGENT_PAGE_SIZE)
    .lateral("a")
)
#: The first page of agents of each of those keys: ``(lane, provider, model, member, head_enqueued_at,
#: head_request_id)``, in head order within each key.
FIRST_AGENTS = select(*_first_agents.c).select_from(_first_keys.join(_first_agents, literal_column("TRUE")))

#: PostgreSQL: everything an admission or a waiter's look reads before the rule walks the index, in one
#: statement instead of seven: whether a queued request is past its deadline, the latest start, the policy
#: row (``SELECT_POLICY``), the rows of ``SELECT_SEATS`` (as ``SEATS_LATERAL``), ``SELECT_ACTIVE_COOLDOWNS``,
#: ``SELECT_PAUSES`` and ``SELECT_KEYS`` (in its order), :data:`FIRST_AGENTS`, and the admission-index entry of
#: ``request_id`` (``SELECT_ENTRY``: the request a waiter looks for or an admission is limited to; ``NULL`` for
#: none); each row a JSON array in its statement's column order. One statement is one snapshot too (READ COMMITTED takes
#: one per statement), and a waiter's look is then one round trip, where the rule's walk stays within the
#: prefetched pages.
ADMISSION_READS = Statement(
    select(
        _select(ANY_EXPIRED).exists().label("expired"),
        select(func.max(SH.started_at)).scalar_subquery().label("latest_start"),
        json_row(SELECT_POLICY).label("policy"),
        _json_select(SEATS_LATERAL).label("seats"),
        _json_rows(SELECT_ACTIVE_COOLDOWNS).label("cooldowns"),
        _json_rows(SELECT_PAUSES).label("pauses"),
        _json_rows(SELECT_KEYS, "lane", "head_enqueued_at", "head_request_id").label("keys"),
        _json_select(FIRST_AGENTS, "lane", "provider", "model", "head_enqueued_at", "head_request_id").label(
            "first_agents"
        ),
        json_row(SELECT_ENTRY).label("entry"),
    ),
    only="postgresql",
)

#: The request the rule chose, still queued, and its last lease generation.
SELECT_CANDIDATE = Query(
    select(R.request_id, R.lease_generation).where(R.request_id == P("request_id"), R.state == lit(QUEUED)),
    Candidate,
)

# --- a queued request's place (``get_queue_snapshot``: positions in enqueue order) ---------------

_queued_with_payload = and_(
    R.state == lit(QUEUED),
    exists().where(PL.request_id == R.request_id, PL.content_fingerprint.is_not(None)),
)
_not_cooling = ~exists().where(C.provider == R.provider, C.model == R.model, C.not_before > P("now"))
SELECT_QUEUED_ENTRY = Query(
    select(R.enqueued_at, R.provider, R.model).where(R.request_id == P("request_id"), _queued_with_payload),
    QueuedEntry,
)
_ahead = tuple_(R.enqueued_at, R.request_id) <= tuple_(P("enqueued_at"), P("request_id"))
COUNT_AHEAD: Scalar[int] = Scalar(select(func.count()).select_from(R).where(_queued_with_payload, _ahead))
COUNT_ELIGIBLE_AHEAD: Scalar[int] = Scalar(
    select(func.count()).select_from(R).where(_queued_with_payload, _not_cooling, _ahead)
)
COOLDOWN_UNTIL: Scalar[int] = Scalar(
    select(C.not_before).where(C.provider == P("provider"), C.model == P("model"), C.not_before > P("now"))
)
