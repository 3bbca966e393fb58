"""The admission rule: which queued request takes the next seat.

In order:

1. **Lanes.** Each lane not paused offers its best request (below). When one lane
   offers, it goes. When several do, the *weighted share* decides: lanes are served in
   priority order, each taking up to its ``weight`` admissions per round; a lane with no
   credit left waits for the next round, which starts when every offering lane has used
   its credit. So a lane with eligible work waits at most the sum of the other lanes'
   weights in admissions, however busy the lanes before it stay (no starvation), and with
   weights like 9 and 1 the first lane still takes nine seats in ten.
2. **Fair share inside a lane.** Requests of agents holding no seat first, then agents
   by the seats they hold (fewest first); among equals, the oldest request
   (``enqueued_at``, then ``request_id``).
3. **Eligibility.** A request is offered only if it has its payload, its provider/model
   key is neither cooling down, paused nor at a keyed limit (per key, per provider,
   starts per provider) nor out of requests in a budget window, and its session is below
   the per-session limit.
4. **Budgets, head of line per key.** A key's best request (by 1 and 2) that does not fit
   a token or request budget of its key holds that key back, not the lane
   (:mod:`admission_plane.service._budgets`).

How the cost stays independent of queue depth: admission walks the heads of the groups
of the admission index (:mod:`admission_plane.store.statements.queue`), never requests.
A group that is not eligible (a key cooling down, paused or full; an agent holding a seat;
a session at its limit) is skipped by reading its one head row, and the walk stops as soon
as the next head cannot beat the best found. The groups it can skip are bounded by the
leases held (busy agents, full sessions and keys), by the cooldowns and by the pauses —
never by how many requests are queued behind them. What it does read per admission:
the seat-holding leases (as many as seats held), the active cooldowns and pauses, and
the lanes' provider/model keys (one row each).

Two shapes are not covered, both measured in ``BENCHMARKS.md`` (depth run H, probes): many
provider/model keys (the keys are read whole, so the cost follows their number, not the
requests'), and one full session shared by many agents (the walk skips full sessions agent
by agent, so it is bounded by seats only when a session belongs to one agent, as a
connector's session does).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable

import attrs

from ..policy import Policy
from ..states import START_WINDOW_PHASES
from ..store.rows import CooldownRow, EntryRow, KeyHeadRow, MemberHeadRow, PauseRow, SeatRow
from ..store.statements.admission import AGENT_PAGE_SIZE
from ..store.statements.leases import LATEST_START
from ..store.statements.queue import (
    AGENT_PAGE,
    DELETE_CREDITS,
    INSERT_CREDIT,
    SELECT_ACTIVE_COOLDOWNS,
    SELECT_CREDITS,
    SELECT_ENTRY,
    SELECT_KEYS,
    SELECT_PAUSES,
    SELECT_SEATS,
    SESSION_PAGE,
)
from ..store.tx import Query, Tx
from ._budgets import Book

#: Heads read per page while walking a group's members.
PAGE = AGENT_PAGE_SIZE
#: How many idle agents ahead a waiter counts (:func:`idle_agents_ahead`): the count is then a
#: lower bound, and the look's cost does not grow with the queue.
RANK_HORIZON = 64
#: Before every head: ``(enqueued_at, request_id)`` sorts after it.
_START = (-1, "")

Head = tuple[int, str]
Key = tuple[str, str]


@attrs.frozen
class Limits:
    """A policy's limits, indexed for the rule (built once per policy)."""

    lanes: tuple[str, ...]
    weights: dict[str, int]
    key_active: dict[Key, int]
    provider_active: dict[str, int]
    provider_starts: dict[str, int]
    session_limit: int | None
    #: Whether the policy sets any budget (one admission can then hold back a whole key).
    budgeted: bool = False

    @property
    def simple(self) -> bool:
        """No keyed limit, session limit or budget: one admission holds back at most its own agent."""
        return not (
            self.key_active
            or self.provider_active
            or self.provider_starts
            or self.session_limit is not None
            or self.budgeted
        )

    @classmethod
    def of(cls, policy: Policy) -> Limits:
        """The limits of ``policy``."""
        return cls(
            lanes=tuple(lane.name for lane in policy.lanes),
            weights={lane.name: lane.weight for lane in policy.lanes},
            key_active={
                (limit.provider, limit.model): limit.max_active_turns
                for limit in policy.key_limits
                if limit.model is not None and limit.max_active_turns is not None
            },
            provider_active={
                limit.provider: limit.max_active_turns
                for limit in policy.key_limits
                if limit.model is None and limit.max_active_turns is not None
            },
            provider_starts={
                limit.provider: limit.max_concurrent_starts
                for limit in policy.key_limits
                if limit.model is None and limit.max_concurrent_starts is not None
            },
            session_limit=policy.max_turns_per_session,
            budgeted=bool(policy.budgets),
        )


_LIMITS: dict[Policy, Limits] = {}


def limits_of(policy: Policy) -> Limits:
    """:meth:`Limits.of`, remembered for the few policies a process sees."""
    found = _LIMITS.get(policy)
    if found is None:
        if len(_LIMITS) > 64:
            _LIMITS.clear()
        found = _LIMITS[policy] = Limits.of(policy)
    return found


@attrs.define
class Facts:
    """What the rule counts, read once per transaction: seats held (by key, provider, agent,
    session), start-window leases, cooldowns and pauses; and the budgets' :class:`Book`
    (``None`` when the policy sets no budget), which reads a window when the walk reaches it."""

    seats: int = 0
    starts: int = 0
    latest_reservation: int | None = None
    key_seats: Counter[Key] = attrs.field(factory=Counter)
    provider_seats: Counter[str] = attrs.field(factory=Counter)
    provider_starts: Counter[str] = attrs.field(factory=Counter)
    agent_seats: Counter[str] = attrs.field(factory=Counter)
    session_seats: Counter[str] = attrs.field(factory=Counter)
    cooling: dict[Key, int] = attrs.field(factory=dict)
    paused_all: bool = False
    paused_lanes: set[str] = attrs.field(factory=set)
    paused_keys: set[Key] = attrs.field(factory=set)
    book: Book | None = None

    #: The latest start, once read (:meth:`latest_start_of`); PostgreSQL reads it with the rest.
    latest_start: int | None = None
    latest_start_read: bool = False
    #: PostgreSQL: the first page of agents (``AGENT_PAGE``, :data:`PAGE` heads) of the keys with the
    #: oldest heads, read with the rest, by (lane, provider, model).
    first_agents: dict[tuple[str, str, str], list[MemberHeadRow]] = attrs.field(factory=dict)
    #: What :func:`_idle_agents_before` found in this transaction, by lane, head and horizon: a waiter's look
    #: asks twice (may it go beside the rule's choices, and how many must leave first), for one answer.
    idle_before: dict[tuple[str, Head, int], frozenset[str]] = attrs.field(factory=dict)
    #: PostgreSQL: admission-index entries read with the rest (``None``: the request has none), by request.
    entries: dict[str, EntryRow | None] = attrs.field(factory=dict)

    def entry_of(self, tx: Tx, request_id: str) -> EntryRow | None:
        """The admission-index entry of ``request_id`` (``None``: it has none), read with the facts on PostgreSQL,
        else in ``tx`` now."""
        if request_id in self.entries:
            return self.entries[request_id]
        return tx.one(SELECT_ENTRY, {"request_id": request_id})

    def latest_start_of(self, tx: Tx) -> int | None:
        """The latest start (``None``: none recorded), read in ``tx`` the first time it is needed
        (SQLite: only when capacity depends on the start interval)."""
        if not self.latest_start_read:
            self.latest_start, self.latest_start_read = tx.scalar(LATEST_START), True
        return self.latest_start

    @classmethod
    def read(cls, tx: Tx, now: int, policy: Policy) -> Facts:
        """Three statements: the seat-holding leases, the active cooldowns, the pauses."""
        return cls.of(
            tx, now, policy, tx.all(SELECT_SEATS), tx.all(SELECT_ACTIVE_COOLDOWNS, {"now": now}), tx.all(SELECT_PAUSES)
        )

    @classmethod
    def of(
        cls,
        tx: Tx,
        now: int,
        policy: Policy,
        seats: Iterable[SeatRow],
        cooldowns: Iterable[CooldownRow],
        pauses: Iterable[PauseRow],
    ) -> Facts:
        """The facts of rows already read (the budgets' :class:`Book` reads in ``tx`` as the walk needs it)."""
        facts = cls(book=Book(tx, now, policy) if policy.budgets else None)
        for seat in seats:
            facts.seats += 1
            facts.key_seats[(seat.provider, seat.model)] += 1
            facts.provider_seats[seat.provider] += 1
            facts.agent_seats[seat.agent_id] += 1
            facts.session_seats[seat.session_id] += 1
            if seat.phase in START_WINDOW_PHASES:
                facts.starts += 1
                facts.provider_starts[seat.provider] += 1
                if facts.latest_reservation is None or seat.acquired_at > facts.latest_reservation:
                    facts.latest_reservation = seat.acquired_at
        facts.cooling = {(row.provider, row.model): row.not_before for row in cooldowns}
        for pause in pauses:
            if pause.lane:
                facts.paused_lanes.add(pause.lane)
            elif pause.provider:
                facts.paused_keys.add((pause.provider, pause.model))
            else:
                facts.paused_all = True
        return facts


class KeyBlock(enum.Enum):
    """Why a provider/model key offers nothing now."""

    COOLING = "cooling down"
    PAUSED = "paused"
    FULL = "at a keyed limit"
    BUDGET = "out of budget"


def key_block(limits: Limits, facts: Facts, provider: str, model: str) -> KeyBlock | None:
    """Why the key offers nothing now, or ``None``."""
    key = (provider, model)
    if key in facts.cooling:
        return KeyBlock.COOLING
    if key in facts.paused_keys:
        return KeyBlock.PAUSED
    limit = limits.key_active.get(key)
    if limit is not None and facts.key_seats[key] >= limit:
        return KeyBlock.FULL
    limit = limits.provider_active.get(provider)
    if limit is not None and facts.provider_seats[provider] >= limit:
        return KeyBlock.FULL
    limit = limits.provider_starts.get(provider)
    if limit is not None and facts.provider_starts[provider] >= limit:
        return KeyBlock.FULL
    if facts.book is not None and (key in facts.book.blocked or facts.book.out_of_requests(provider, model)):
        return KeyBlock.BUDGET
    return None


def session_full(limits: Limits, facts: Facts, session_id: str) -> bool:
    """Whether the session holds as many seats as the per-session limit allows."""
    return limits.session_limit is not None and facts.session_seats[session_id] >= limits.session_limit


@attrs.frozen
class Offer:
    """A lane's best request, and its provider/model key."""

    request_id: str
    head: Head
    key: Key


@attrs.frozen
class Choice:
    """The rule's choice (its request, lane and provider/model key), and the lane credits to
    write if the weighted share was used."""

    request_id: str
    lane: str
    key: Key
    credits: dict[str, int] | None = None


Keys = dict[str, list[KeyHeadRow]]


def read_keys(tx: Tx) -> Keys:
    """Every lane's provider/model groups with their heads, in head order (one statement)."""
    return keys_of(tx.all(SELECT_KEYS))


def keys_of(rows: Iterable[KeyHeadRow]) -> Keys:
    """``SELECT_KEYS`` rows (in its order) by lane."""
    keys_by_lane: Keys = {}
    for row in rows:
        keys_by_lane.setdefault(row.lane, []).append(row)
    return keys_by_lane


def choose(tx: Tx, limits: Limits, facts: Facts, keys_by_lane: Keys) -> Choice | None:
    """The request the rule admits next (capacity aside), or ``None``; ``keys_by_lane`` is :func:`read_keys`."""
    if facts.paused_all:
        return None
    # Lanes the policy no longer names still drain, after the named ones.
    lanes = (*limits.lanes, *sorted(set(keys_by_lane) - set(limits.lanes)))
    offers: dict[str, Offer] = {}
    for lane in lanes:
        keys = keys_by_lane.get(lane)
        if keys and lane not in facts.paused_lanes:
            offer = _best_in_lane(tx, lane, keys, limits, facts)
            if offer is not None:
                offers[lane] = offer
    if not offers:
        return None
    if len(offers) == 1:
        ((lane, offer),) = offers.items()
        return Choice(offer.request_id, lane, offer.key)
    credits = {row.lane: row.credits for row in tx.all(SELECT_CREDITS)}

    def credit(lane: str) -> int:
        return int(credits.get(lane, limits.weights.get(lane, 1)))

    ready = [lane for lane in offers if credit(lane) > 0]
    if not ready:  # every offering lane used its share: a new round
        credits = {}
        ready = list(offers)
    lane = ready[0]
    updated = {name: credit(name) for name in lanes}
    updated[lane] -= 1
    return Choice(offers[lane].request_id, lane, offers[lane].key, updated)


def spend_credits(tx: Tx, choice: Choice) -> None:
    """Record what the chosen lane spent of its share (only when lanes competed)."""
    if choice.credits is None:
        return
    tx.send(DELETE_CREDITS)  # nothing reads them back: on PostgreSQL they travel with the commit
    for lane, credits in choice.credits.items():
        tx.send(INSERT_CREDIT, {"lane": lane, "credits": credits})


def _best_in_lane(tx: Tx, lane: str, keys: list[KeyHeadRow], limits: Limits, facts: Facts) -> Offer | None:
    open_keys = [key for key in keys if key_block(limits, facts, key.provider, key.model) is None]
    best: Offer | None = None
    for key in open_keys:  # in head order: once a key's head cannot win, no later key can
        if best is not None and (key.head_enqueued_at, key.head_request_id) >= best.head:
            break
        offer = _best_idle_agent(tx, lane, key, limits, facts, best)
        if offer is not None and _fits(facts, offer):
            best = offer
    if best is not None or not facts.agent_seats:
        return best
    # Every eligible request belongs to an agent holding seats: fewest seats first.
    for seats in sorted(set(facts.agent_seats.values())):
        agents = sorted(agent for agent, held in facts.agent_seats.items() if held == seats)
        if facts.book is not None:
            # Budgets: each key's best among these agents first; one that does not fit blocks its key only.
            for offer in sorted(_key_bests(tx, lane, open_keys, agents, limits, facts), key=lambda o: o.head):
                if _fits(facts, offer):
                    return offer
            continue
        for agent in agents:
            for key in open_keys:
                group = {"lane": lane, "provider": key.provider, "model": key.model, "agent_id": agent}
                offer = _first_open_session(tx, group, limits, facts, best)
                if offer is not None:
                    best = offer
        if best is not None:
            return best
    return None


def _key_bests(
    tx: Tx, lane: str, keys: list[KeyHeadRow], agents: list[str], limits: Limits, facts: Facts
) -> list[Offer]:
    """The best request of each key (not blocked) among ``agents``' open sessions."""
    bests: dict[Key, Offer] = {}
    for agent in agents:
        for key in keys:
            found = (key.provider, key.model)
            if facts.book is not None and found in facts.book.blocked:
                continue
            group = {"lane": lane, "provider": key.provider, "model": key.model, "agent_id": agent}
            offer = _first_open_session(tx, group, limits, facts, bests.get(found))
            if offer is not None:
                bests[found] = offer
    return list(bests.values())


def _fits(facts: Facts, offer: Offer) -> bool:
    """Whether the key's best request fits its budgets (if not, the key is blocked for this transaction)."""
    return facts.book is None or facts.book.admits(*offer.key, offer.request_id)


def _best_idle_agent(
    tx: Tx, lane: str, key: KeyHeadRow, limits: Limits, facts: Facts, best: Offer | None
) -> Offer | None:
    """The best request of an agent holding no seat in this key, if it beats ``best``."""
    params = {"lane": lane, "provider": key.provider, "model": key.model}
    found: Offer | None = None
    first = facts.first_agents.get((lane, key.provider, key.model))
    for member in _pages(tx, AGENT_PAGE, params, first=first):
        head = (member.head_enqueued_at, member.head_request_id)
        bound = found or best
        if bound is not None and head >= bound.head:
            break
        if facts.agent_seats[member.member]:
            continue
        if limits.session_limit is None or not facts.session_seats:
            found = Offer(member.head_request_id, head, (key.provider, key.model))  # no full session: the head wins
            continue
        offer = _first_open_session(tx, {**params, "agent_id": member.member}, limits, facts, bound)
        if offer is not None:
            found = offer
    return found


def _first_open_session(
    tx: Tx, group: dict[str, str], limits: Limits, facts: Facts, best: Offer | None
) -> Offer | None:
    """The oldest head among the agent's sessions below their limit in this key, if it beats ``best``."""
    for member in _pages(tx, SESSION_PAGE, group):
        head = (member.head_enqueued_at, member.head_request_id)
        if best is not None and head >= best.head:
            return None
        if not session_full(limits, facts, member.member):
            return Offer(member.head_request_id, head, (group["provider"], group["model"]))
    return None


def idle_agents_ahead(
    tx: Tx, limits: Limits, facts: Facts, keys: list[KeyHeadRow], head: Head, horizon: int = RANK_HORIZON
) -> int | None:
    """How many agents holding no seat have a request ahead of ``head`` in the lane of ``keys`` (counted up to
    ``horizon``), or ``None`` when that count is no lower bound on what must leave the queue
    before ``head``'s request can be chosen.

    It is one when the policy has no keyed and no per-session limit: then one departure makes
    at most one agent busy (or leaves), so the idle agents ahead shrink by at most one per
    departure; a freed seat or a payload stored can only add to them. With keyed or session
    limits (or budgets) one admission can hold back a whole key or session at once, and the waiter must
    look at every departure. The walk reads one page of agent heads per open key of the lane.
    """
    if not limits.simple:
        return None
    return min(len(_idle_agents_before(tx, limits, facts, keys, head, horizon)), horizon)


def rank_among_idle(
    tx: Tx, limits: Limits, facts: Facts, keys_by_lane: Keys, lane: str, agent: str, head: Head
) -> int | None:
    """Exactly how many admissions the rule makes before the request at ``head`` (of ``agent``, in
    ``lane``), when that is known from the idle agents ahead of it alone; else ``None``.

    Known when the policy sets no keyed limit, session limit or budget, the queue holds one lane
    (so no weighted share between lanes), nothing is paused, the request's key is open and its
    agent holds no seat, and none of its agent's requests is older than it: then the rule admits
    the head of each idle agent ahead of it, each once (an admitted agent holds a seat and drops
    behind every idle one), and then it. A waiter may take its seat at once when there are seats
    and start slots for all of them and itself (:func:`admission_plane.service._admission.admit_in_transaction`):
    no request ahead of it loses the seat it needs.
    """
    if not limits.simple or facts.paused_all or lane in facts.paused_lanes or set(keys_by_lane) != {lane}:
        return None
    if facts.agent_seats[agent]:
        return None
    agents = _idle_agents_before(tx, limits, facts, keys_by_lane[lane], head, RANK_HORIZON)
    if len(agents) >= RANK_HORIZON or agent in agents:
        return None
    return len(agents)


def _idle_agents_before(
    tx: Tx, limits: Limits, facts: Facts, keys: list[KeyHeadRow], head: Head, horizon: int
) -> frozenset[str]:
    """The agents holding no seat whose head in an open key of ``keys`` (one lane's) is before ``head`` (up to
    ``horizon``); read once per transaction (``Facts.idle_before``)."""
    if not keys:
        return frozenset()
    memo = (keys[0].lane, head, horizon)
    found = facts.idle_before.get(memo)
    if found is None:
        found = facts.idle_before[memo] = frozenset(_read_idle_agents_before(tx, limits, facts, keys, head, horizon))
    return found


def _read_idle_agents_before(
    tx: Tx, limits: Limits, facts: Facts, keys: list[KeyHeadRow], head: Head, horizon: int
) -> set[str]:
    agents: set[str] = set()
    for key in keys:  # the lane's keys (from :func:`read_keys`)
        if key_block(limits, facts, key.provider, key.model) is not None:
            continue
        params = {"lane": key.lane, "provider": key.provider, "model": key.model}
        first = facts.first_agents.get((key.lane, key.provider, key.model))
        for member in _pages(tx, AGENT_PAGE, params, horizon + len(facts.agent_seats), first=first):
            if (member.head_enqueued_at, member.head_request_id) >= head or len(agents) >= horizon:
                break
            if not facts.agent_seats[member.member]:
                agents.add(member.member)
    return agents


def _pages(
    tx: Tx,
    query: Query[MemberHeadRow],
    params: dict[str, str],
    page_size: int = PAGE,
    first: list[MemberHeadRow] | None = None,
) -> Iterable[MemberHeadRow]:
    """A group's members in head order, read ``page_size`` at a time (most walks stop in the first page);
    ``first``: the first :data:`PAGE` of them, already read (PostgreSQL reads the busiest keys' with the facts)."""
    after: Head = _START
    if first is not None:
        yield from first
        if len(first) < PAGE:
            return
        after = (first[-1].head_enqueued_at, first[-1].head_request_id)
    while True:
        page = tx.all(query, {**params, "after_enqueued_at": after[0], "after_request_id": after[1], "page": page_size})
        yield from page
        if len(page) < page_size:
            return
        last = page[-1]
        after = (last.head_enqueued_at, last.head_request_id)
