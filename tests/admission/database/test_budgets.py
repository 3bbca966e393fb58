"""Budgets (issue 14): requests and tokens per provider and per provider/model over sliding windows.

The contract of :mod:`admission_plane.service._budgets`, on an SQLite file and on PostgreSQL (the
``make_plane`` fixture): windows that slide (a charge made at ``c`` leaves at ``c + window_ms``
exactly), what counts, admission that fits or waits, the head of line per key, settlement
(reconciled, charged, retained, refunded) with its journal events, usage recorded outside the plane,
corrections that only lower, the enqueue's estimate, ``budget_status`` and a revision removing a
budget. Waiting for a window (``wait_for_admission``) is in ``test_budget_waiting.py``.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from dbutil import query, request_state, table_dump
from planes import PlaneFactory, activate, enqueue

from admission_plane import (
    AdmissionConflictError,
    AdmissionPlane,
    AdmittedLease,
    Budget,
    BudgetError,
    BudgetWindow,
    EnqueueResult,
    InvalidInputError,
    LiveTurnCompletion,
    Policy,
    Remaining,
    Usage,
)

OWNER = "owner-a"
MINUTE = 60_000
FIVE_HOURS = 5 * 3_600_000
#: Eight seats and starts, no start interval, a day of queue time: only budgets hold a request back.
ROOMY = Policy(8, 8, 0, 86_400_000, 30_000)
#: A live revision must pass the durable row's bounds, which require a start interval of at least 2 s.
LIVE = Policy(8, 8, 2_000, 1_800_000, 30_000)
RESERVED = ("budget_reserved", "uncharged", "reserved")


def budgeted(*budgets: Budget, base: Policy = ROOMY) -> Policy:
    """``base`` with ``budgets``."""
    return attrs.evolve(base, budgets=budgets)


def put(plane: AdmissionPlane, request_id: str, now: int, estimate: int | None = None, **fields: Any) -> EnqueueResult:
    """Enqueue with a payload and ``estimate`` tokens: agent ``agent-<request_id>``, session ``s-<request_id>``,
    provider ``p1``, model ``m1`` unless ``fields`` say otherwise."""
    fields.setdefault("agent_id", f"agent-{request_id}")
    fields.setdefault("session_id", f"s-{request_id}")
    fields.setdefault("provider", "p1")
    fields.setdefault("model", "m1")
    result: EnqueueResult = enqueue(plane, request_id, now=now, estimated_tokens=estimate, **fields)
    return result


def admitted(plane: AdmissionPlane, now: int) -> str | None:
    """Admit the rule's choice at ``now``; its request id, or ``None``."""
    lease = plane.admit_next(now, OWNER)
    return None if lease is None else lease.request_id


def take(plane: AdmissionPlane, now: int) -> AdmittedLease:
    """Admit the rule's choice as the plane's own connector (so it can record a dispatch); fails if none."""
    lease = plane.admit_next(now, plane.owner_identity.owner_instance_id)
    assert lease is not None, "expected an admission"
    return lease


def window(plane: AdmissionPlane, now: int, model: str | None = "m1", window_ms: int = MINUTE) -> BudgetWindow:
    """The status of ``p1``/``model``'s window of ``window_ms`` at ``now``."""
    (found,) = (
        w for w in plane.budget_status(now=now) if w.provider == "p1" and w.model == model and w.window_ms == window_ms
    )
    return found


def budget_events(plane: AdmissionPlane) -> list[tuple[str, str, str]]:
    """``(kind, from_state, to_state)`` of the journal's budget events, in order (read through the plane)."""
    events = plane.read_sanitized_events(limit=1_000)
    return [(e.kind, e.from_state, e.to_state) for e in events if e.kind.startswith("budget_")]


def charges(database: str) -> list[tuple[Any, ...]]:
    """Every budget charge row: ``(charge_id, provider, model, charged_at, requests, reserved, used, state)``."""
    return query(
        database,
        "SELECT charge_id, provider, model, charged_at, requests, reserved_tokens, used_tokens, state "
        "FROM budget_charges ORDER BY charged_at, charge_id",
    )


def charge_of(database: str, request_id: str) -> tuple[Any, ...] | None:
    """``(requests, reserved_tokens, used_tokens, state)`` of a turn's charge (``None``: no row)."""
    rows = query(
        database,
        "SELECT requests, reserved_tokens, used_tokens, state FROM budget_charges WHERE charge_id = ?",
        (request_id,),
    )
    return rows[0] if rows else None


# --- request budgets -------------------------------------------------------------------------------------------------


def test_a_request_budget_admits_exactly_n_per_window_and_the_next_when_the_first_charge_leaves(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """With max_requests=3 per minute exactly three are admitted; the fourth waits until 1 ms before the first
    charge's c + window_ms and is admitted at c + window_ms exactly (the window counts (t - window, t])."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", window_ms=MINUTE, max_requests=3)))
    for n in range(4):
        put(plane, f"r{n}", 10 + n)
    assert [admitted(plane, 1_000 + n) for n in range(3)] == ["r0", "r1", "r2"]
    assert admitted(plane, 1_003) is None
    assert admitted(plane, 1_000 + MINUTE - 1) is None, "the first charge still counts 1 ms before it leaves"
    assert request_state(database_url, "r3") == "queued"
    assert admitted(plane, 1_000 + MINUTE) == "r3"
    status = window(plane, 1_000 + MINUTE)
    assert (status.requests, status.remaining_requests) == (3, 0), "r1, r2 and r3 count; r0 left"
    assert admitted(plane, 1_000 + MINUTE) is None


def test_a_request_budget_of_one_key_does_not_hold_back_requests_of_another_provider(
    make_plane: PlaneFactory,
) -> None:
    """A key out of requests offers nothing, but a request of a provider without a budget is still admitted."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_requests=1)))
    put(plane, "first", 10)
    put(plane, "second", 11)
    put(plane, "elsewhere", 12, provider="p2")
    assert [admitted(plane, 1_000 + n) for n in range(3)] == ["first", "elsewhere", None]


# --- token budgets ---------------------------------------------------------------------------------------------------


def test_estimates_are_reserved_at_admission_and_one_that_does_not_fit_waits_for_the_window(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """An admitted request reserves its estimate in the window; a request whose estimate would pass max_tokens
    waits until the charges in the way leave the window; an estimate landing exactly on max_tokens fits."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_tokens=1_000)))
    put(plane, "r1", 10, estimate=600)
    put(plane, "r2", 11, estimate=500)
    assert admitted(plane, 1_000) == "r1"
    assert charge_of(database_url, "r1") == (1, 600, None, "reserved")
    status = window(plane, 1_000)
    assert (status.reserved_tokens, status.used_tokens, status.remaining_tokens) == (600, 0, 400)
    assert admitted(plane, 1_001) is None, "600 + 500 > 1000"
    assert admitted(plane, 1_000 + MINUTE - 1) is None
    assert admitted(plane, 1_000 + MINUTE) == "r2"
    put(plane, "r3", 12, estimate=500)
    assert admitted(plane, 1_000 + MINUTE) == "r3", "500 + 500 lands exactly on max_tokens"
    assert window(plane, 1_000 + MINUTE).remaining_tokens == 0


def test_a_request_without_an_estimate_reserves_no_tokens_and_is_refused_once_the_tokens_are_spent(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Without an estimate a request counts as 0 tokens: it fits while a token is left, and a window whose tokens
    are all spent admits nothing, not even it."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_tokens=1_000)))
    put(plane, "big", 10, estimate=999)
    put(plane, "bare", 11)
    put(plane, "last", 12, estimate=1)
    put(plane, "bare-too", 13)
    assert [admitted(plane, 1_000 + n) for n in range(3)] == ["big", "bare", "last"]
    assert charge_of(database_url, "bare") == (1, 0, None, "reserved")
    assert window(plane, 1_003).remaining_tokens == 0
    assert admitted(plane, 1_003) is None, "a spent window admits nothing"
    assert request_state(database_url, "bare-too") == "queued"
    assert admitted(plane, 1_000 + MINUTE) == "bare-too"


def test_every_window_of_a_key_must_fit_the_estimate(make_plane: PlaneFactory, database_url: str) -> None:
    """With a one-minute and a five-hour window on one key, a request fits only when both windows hold its
    estimate: after the minute it may still wait for the five hours."""
    plane = make_plane(
        policy=budgeted(
            Budget("p1", "m1", window_ms=MINUTE, max_tokens=1_000),
            Budget("p1", "m1", window_ms=FIVE_HOURS, max_tokens=1_500),
        )
    )
    put(plane, "r1", 10, estimate=1_000)
    put(plane, "r2", 11, estimate=500)
    put(plane, "r3", 12, estimate=1)
    assert admitted(plane, 1_000) == "r1"
    assert admitted(plane, 1_001) is None, "the minute is spent"
    assert admitted(plane, 1_000 + MINUTE) == "r2", "1000 + 500 fits the five hours"
    later = 1_000 + 2 * MINUTE  # both charges left the minute window
    assert window(plane, later).requests == 0
    assert window(plane, later, window_ms=FIVE_HOURS).remaining_tokens == 0
    assert admitted(plane, later) is None, "the minute is empty but the five hours are spent"
    assert admitted(plane, 1_000 + FIVE_HOURS - 1) is None
    assert request_state(database_url, "r3") == "queued"
    assert admitted(plane, 1_000 + FIVE_HOURS) == "r3", "r1 left the five-hour window"


# --- provider and model budgets --------------------------------------------------------------------------------------


def test_a_provider_budget_counts_every_model_and_a_model_budget_only_its_own(
    make_plane: PlaneFactory,
) -> None:
    """A provider budget (model=None) counts the requests of every model of the provider; a model budget counts
    only its model's; another provider counts in neither."""
    plane = make_plane(
        policy=budgeted(Budget("p1", None, max_requests=3), Budget("p1", "m1", max_requests=1)),
    )
    put(plane, "m1-a", 10)
    put(plane, "m1-b", 11)
    put(plane, "m2-a", 12, model="m2")
    put(plane, "m3-a", 13, model="m3")
    put(plane, "m2-b", 14, model="m2")
    put(plane, "p2-a", 15, provider="p2")
    order = [admitted(plane, 1_000 + n) for n in range(6)]
    assert order == ["m1-a", "m2-a", "m3-a", "p2-a", None, None], "m1-b: its model is full; m2-b: the provider is"
    provider, model = window(plane, 1_010, model=None), window(plane, 1_010)
    assert (provider.requests, provider.remaining_requests) == (3, 0)
    assert (model.requests, model.remaining_requests) == (1, 0)


def test_a_provider_token_budget_holds_back_a_model_that_its_other_models_spent(make_plane: PlaneFactory) -> None:
    """Tokens reserved by one model count in the provider's token budget, so another model's estimate that no
    longer fits it waits, though that model has no budget of its own."""
    plane = make_plane(policy=budgeted(Budget("p1", None, max_tokens=1_000)))
    put(plane, "m1", 10, estimate=700)
    put(plane, "m2", 11, estimate=400, model="m2")
    put(plane, "m3", 12, estimate=300, model="m3")
    assert [admitted(plane, 1_000 + n) for n in range(3)] == ["m1", "m3", None]
    assert window(plane, 1_003, model=None).remaining_tokens == 0


# --- head of line per key --------------------------------------------------------------------------------------------


def test_a_key_whose_oldest_request_does_not_fit_holds_back_its_younger_requests_but_not_other_keys(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """The key's best (oldest) request does not fit: a smaller, younger request of the same key that would fit is
    not admitted, while a request of another model of the same provider is; when the window frees the big one
    goes first."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_tokens=1_000)))
    put(plane, "holder", 5, estimate=800)
    assert admitted(plane, 1_000) == "holder"
    put(plane, "big", 10, estimate=500)
    put(plane, "small", 20, estimate=100)  # fits the 200 left, but is behind big in its key
    put(plane, "other-key", 30, model="m2", estimate=900)
    assert admitted(plane, 1_001) == "other-key"
    assert admitted(plane, 1_002) is None
    assert plane.admit_request("small", 1_003, OWNER) is None, "small never overtakes big"
    assert (request_state(database_url, "big"), request_state(database_url, "small")) == ("queued", "queued")
    assert admitted(plane, 1_000 + MINUTE) == "big"
    assert admitted(plane, 1_000 + MINUTE) == "small", "500 + 100 fits once holder left"


@pytest.mark.parametrize(
    ("big_agent", "small_agent"),
    [("agent-a", "agent-b"), ("agent-b", "agent-a")],
    ids=["big-agent-sorts-first", "small-agent-sorts-first"],
)
def test_the_head_of_line_holds_among_agents_that_hold_seats(
    make_plane: PlaneFactory, database_url: str, big_agent: str, small_agent: str
) -> None:
    """When every eligible request belongs to an agent holding a seat (equal seats each), the key's best request is
    still its oldest: a younger, smaller request of the same key does not overtake the big one that does not fit,
    whichever agent's name sorts first, while a request of another key is admitted."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_tokens=1_000)))
    put(plane, "seat-a", 1, agent_id="agent-a", model="m2")
    put(plane, "seat-b", 2, agent_id="agent-b", model="m2")
    assert [admitted(plane, 100), admitted(plane, 101)] == ["seat-a", "seat-b"]
    plane.record_external_usage("p1", "m1", tokens=800, now=100)
    put(plane, "big", 10, agent_id=big_agent, estimate=500)
    put(plane, "small", 20, agent_id=small_agent, estimate=100)
    put(plane, "other-key", 30, agent_id=small_agent, model="m3")
    assert admitted(plane, 200) == "other-key"
    assert admitted(plane, 201) is None, "small must not overtake big in its key"
    assert (request_state(database_url, "big"), request_state(database_url, "small")) == ("queued", "queued")
    assert admitted(plane, 100 + MINUTE) == "big"


def test_a_key_out_of_requests_offers_nothing_whatever_its_requests_estimate(make_plane: PlaneFactory) -> None:
    """A key with no request left holds back even a request without an estimate; the same provider's other model
    (without a budget) is admitted."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_requests=1, max_tokens=10_000)))
    put(plane, "first", 10, estimate=1)
    put(plane, "bare", 11)
    put(plane, "m2", 12, model="m2")
    assert [admitted(plane, 1_000 + n) for n in range(3)] == ["first", "m2", None]


# --- settlement ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("used", "remaining"), [(200, 800), (1_400, 0)], ids=["less", "more"])
def test_a_completion_with_usage_reconciles_the_reservation_to_what_the_turn_used(
    make_plane: PlaneFactory, database_url: str, used: int, remaining: int
) -> None:
    """A completed turn that reports its usage settles ``reconciled``: the window counts what it used (less or more
    than its estimate) instead of the estimate, and later admissions see exactly that."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_tokens=1_000)))
    put(plane, "r1", 10, estimate=600)
    put(plane, "r2", 11, estimate=700)
    lease = take(plane, 1_000)
    assert admitted(plane, 1_001) is None, "600 + 700 > 1000 while reserved"
    activate(plane, lease, 1_000)
    usage = Usage(input_tokens=used // 2, output_tokens=used - used // 2)
    plane.complete_live_turn(lease, 1_010, LiveTurnCompletion("completed", usage=usage))
    assert charge_of(database_url, "r1") == (1, 600, used, "reconciled")
    status = window(plane, 1_011)
    assert (status.requests, status.reserved_tokens, status.used_tokens) == (1, 0, used)
    assert status.remaining_tokens == remaining
    assert admitted(plane, 1_011) == ("r2" if used + 700 <= 1_000 else None)
    if remaining == 0:
        assert admitted(plane, 1_000 + MINUTE - 1) is None, "the overspent turn holds the window until it leaves"
        assert admitted(plane, 1_000 + MINUTE) == "r2"
    assert budget_events(plane)[:2] == [RESERVED, ("budget_settled", "reserved", "reconciled")]


@pytest.mark.parametrize("outcome", ["completed", "failed", "cancelled"])
def test_a_live_turn_ending_without_usage_is_charged_at_its_estimate(
    make_plane: PlaneFactory, database_url: str, outcome: str
) -> None:
    """A live turn that ends (completed, failed or cancelled after its dispatch) without reporting usage settles
    ``charged``: its estimate stands as used."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_tokens=1_000)))
    put(plane, "r1", 10, estimate=600)
    lease = take(plane, 1_000)
    activate(plane, lease, 1_000)
    plane.complete_live_turn(lease, 1_010, LiveTurnCompletion(outcome))
    assert charge_of(database_url, "r1") == (1, 600, 600, "charged")
    status = window(plane, 1_011)
    assert (status.requests, status.reserved_tokens, status.used_tokens, status.remaining_tokens) == (1, 0, 600, 400)
    assert budget_events(plane) == [RESERVED, ("budget_settled", "reserved", "charged")]


def _abandon(plane: AdmissionPlane, lease: AdmittedLease, now: int) -> None:
    plane.abandon_before_prompt(lease, now, "cancelled")


def _owner_dead(plane: AdmissionPlane, lease: AdmittedLease, now: int) -> None:
    plane.settle_lease_owner_death(lease, now)


def _operator(plane: AdmissionPlane, lease: AdmittedLease, now: int) -> None:
    plane.release_lease(lease.lease_id, now)


REFUNDS = {
    "abandoned-admitted": (_abandon, False),
    "abandoned-starting": (_abandon, True),
    "owner-dead-admitted": (_owner_dead, False),
    "owner-dead-starting": (_owner_dead, True),
    "operator-admitted": (_operator, False),
    "operator-starting": (_operator, True),
}


@pytest.mark.parametrize("case", sorted(REFUNDS))
def test_a_turn_ended_before_any_prompt_was_written_is_refunded(
    make_plane: PlaneFactory, database_url: str, case: str
) -> None:
    """Abandoned before its prompt, its owner proved dead before the dispatch intent, or released by the operator
    before it: the reservation is refunded (its row deleted), nothing of it counts, and its request budget is free
    again at once."""
    end, starting = REFUNDS[case]
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_requests=1, max_tokens=1_000)))
    put(plane, "r1", 10, estimate=900)
    put(plane, "r2", 11, estimate=900)
    lease = take(plane, 1_000)
    if starting:
        plane.mark_starting(lease, 1_001)
    assert admitted(plane, 1_002) is None
    end(plane, lease, 1_003)
    assert charge_of(database_url, "r1") is None, "a refund deletes the charge"
    status = window(plane, 1_004)
    assert (status.requests, status.reserved_tokens, status.used_tokens, status.next_reset_at) == (0, 0, 0, None)
    assert admitted(plane, 1_004) == "r2", "the refunded request and tokens are free again"
    assert budget_events(plane) == [RESERVED, ("budget_settled", "reserved", "refunded"), RESERVED]


@pytest.mark.parametrize("phase", ["dispatch_intent", "active"])
def test_the_operators_release_after_the_dispatch_intent_retains_the_reservation(
    make_plane: PlaneFactory, database_url: str, phase: str
) -> None:
    """Released by the operator once the dispatch may have happened, the request ends ``recovery_required`` and its
    reservation is retained: it keeps counting until it leaves the window."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_requests=1, max_tokens=1_000)))
    put(plane, "r1", 10, estimate=900)
    put(plane, "r2", 11, estimate=50)
    lease = take(plane, 1_000)
    if phase == "active":
        activate(plane, lease, 1_000)
    else:
        plane.mark_starting(lease, 1_001)
        plane.mark_dispatch_intent(lease, 1_002)
    released = plane.release_lease(lease.lease_id, 1_010)
    assert str(released.outcome) == "recovery_required"
    assert charge_of(database_url, "r1") == (1, 900, None, "retained")
    status = window(plane, 1_011)
    assert (status.requests, status.reserved_tokens, status.used_tokens) == (1, 900, 0)
    assert admitted(plane, 1_011) is None, "the retained reservation still fills the request budget"
    assert admitted(plane, 1_000 + MINUTE) == "r2"
    assert budget_events(plane) == [RESERVED, ("budget_settled", "reserved", "retained"), RESERVED]


def test_recovery_required_keeps_the_reservation_and_releasing_its_seat_retains_it(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Entering ``recovery_required`` settles nothing (the reservation stays ``reserved``); releasing the exited
    recovery seat settles it ``retained``: the estimate still counts and holds back the next request until it
    leaves the window."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_tokens=1_000)))
    put(plane, "r1", 10, estimate=800)
    put(plane, "r2", 11, estimate=300)
    lease = take(plane, 1_000)
    activate(plane, lease, 1_000)
    plane.mark_execution_recovery_required(lease, 1_010)
    assert charge_of(database_url, "r1") == (1, 800, None, "reserved")
    assert budget_events(plane) == [RESERVED]
    plane.release_exited_recovery_seat(lease, 1_020)
    assert charge_of(database_url, "r1") == (1, 800, None, "retained")
    status = window(plane, 1_021)
    assert (status.requests, status.reserved_tokens, status.used_tokens, status.remaining_tokens) == (1, 800, 0, 200)
    assert admitted(plane, 1_021) is None
    assert admitted(plane, 1_000 + MINUTE) == "r2"
    assert budget_events(plane) == [RESERVED, ("budget_settled", "reserved", "retained"), RESERVED]


def test_a_turn_admitted_without_a_budget_has_no_charge_and_settles_nothing(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """A key no budget covers is charged nothing at admission and journals no budget event when it ends."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_requests=1)))
    put(plane, "free", 10, model="m2", estimate=500)
    lease = take(plane, 1_000)
    activate(plane, lease, 1_000)
    plane.complete_live_turn(lease, 1_010, LiveTurnCompletion("completed", usage=Usage(1, 2)))
    assert charges(database_url) == []
    assert budget_events(plane) == []


# --- usage recorded outside the plane --------------------------------------------------------------------------------


def test_external_usage_counts_in_its_windows_and_provider_wide_usage_only_in_provider_budgets(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Usage recorded for a model counts in that model's budgets and the provider's; usage recorded provider-wide
    (model=None) counts in the provider's budgets only; both leave the window like any charge, and each is
    journalled ``budget_usage_recorded`` (outside_plane -> external)."""
    plane = make_plane(
        policy=budgeted(
            Budget("p1", None, max_requests=5, max_tokens=1_000),
            Budget("p1", "m1", max_requests=2, max_tokens=500),
        )
    )
    plane.record_external_usage("p1", "m1", requests=1, tokens=400, now=1_000)
    plane.record_external_usage("p1", requests=2, tokens=300, now=2_000)
    provider, model = window(plane, 2_000, model=None), window(plane, 2_000)
    assert (provider.requests, provider.used_tokens, provider.remaining_tokens) == (3, 700, 300)
    assert (model.requests, model.used_tokens, model.remaining_tokens) == (1, 400, 100)
    assert [row[1:] for row in charges(database_url)] == [
        ("p1", "m1", 1_000, 1, 0, 400, "external"),
        ("p1", "", 2_000, 2, 0, 300, "external"),
    ]
    put(plane, "too-big", 10, estimate=101)
    assert admitted(plane, 2_000) is None, "400 + 101 > 500 in the model's window"
    assert admitted(plane, 1_000 + MINUTE) == "too-big", "the model's external usage left its window"
    assert window(plane, 2_000 + MINUTE, model=None).used_tokens == 0
    assert budget_events(plane) == [("budget_usage_recorded", "outside_plane", "external")] * 2 + [RESERVED]


BAD_USAGE: dict[str, dict[str, Any]] = {
    "nothing": {},
    "negative requests": {"requests": -1},
    "negative tokens": {"tokens": -1},
    "fractional tokens": {"tokens": 1.5},
    "boolean requests": {"requests": True},
    "too many tokens": {"tokens": 2**40 + 1},
    "text tokens": {"tokens": "5"},
    "empty provider": {"provider": "", "tokens": 1},
    "multi-line model": {"model": "m\n1", "tokens": 1},
    "empty model": {"model": "", "tokens": 1},
    "negative time": {"tokens": 1, "now": -1},
}


def test_invalid_external_usage_is_refused_and_writes_nothing(make_plane: PlaneFactory, database_url: str) -> None:
    """Bad external usage (no request or token at all, a negative, fractional, boolean, textual or oversized count,
    a bad provider or model, a negative time) raises InvalidInputError and leaves the database exactly as it was."""
    plane = make_plane(policy=budgeted(Budget("p1", None, max_tokens=1_000)))
    before = table_dump(database_url)
    for bad in BAD_USAGE.values():
        arguments: dict[str, Any] = {"provider": "p1", "model": "m1", "now": 1_000, **bad}
        with pytest.raises(InvalidInputError):
            plane.record_external_usage(**arguments)
    assert table_dump(database_url) == before


# --- corrections from the provider's headers -------------------------------------------------------------------------


def test_a_correction_lowers_what_remains_to_the_providers_figures(make_plane: PlaneFactory, database_url: str) -> None:
    """``x-ratelimit-remaining-requests``/``-tokens`` below the plane's view add one correction charge of the
    difference (journalled ``budget_corrected``): afterwards the window has exactly what the provider said left,
    and admission obeys it."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_requests=10, max_tokens=1_000)))
    put(plane, "r1", 10, estimate=100)
    assert admitted(plane, 1_000) == "r1"
    headers = {"X-RateLimit-Remaining-Requests": "5", "x-ratelimit-remaining-tokens": "300", "other": "x"}
    (after,) = plane.correct_budget("p1", "m1", headers, now=1_001)
    assert (after.window_ms, after.remaining_requests, after.remaining_tokens) == (MINUTE, 5, 300)
    assert after == window(plane, 1_001)
    assert [row[1:] for row in charges(database_url) if row[7] == "correction"] == [
        ("p1", "m1", 1_001, 4, 0, 600, "correction")
    ]
    assert budget_events(plane) == [RESERVED, ("budget_corrected", "outside_plane", "correction")]
    put(plane, "r2", 11, estimate=301)
    assert admitted(plane, 1_002) is None, "301 > the 300 the provider said were left"
    assert admitted(plane, 1_001 + MINUTE) == "r2", "the correction leaves the window like any charge"


def test_a_figure_above_the_planes_view_changes_nothing(make_plane: PlaneFactory, database_url: str) -> None:
    """A provider saying more remains than the plane thinks raises nothing: no charge, no event, and the windows
    returned are as they were; a lower token figure beside a higher request figure corrects only the tokens."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_requests=10, max_tokens=1_000)))
    put(plane, "r1", 10, estimate=100)
    assert admitted(plane, 1_000) == "r1"
    before = table_dump(database_url)
    (same,) = plane.correct_budget("p1", "m1", Remaining(requests=50, tokens=900), now=1_001)
    assert (same.remaining_requests, same.remaining_tokens) == (9, 900)
    assert table_dump(database_url) == before
    (after,) = plane.correct_budget("p1", "m1", Remaining(requests=50, tokens=700), now=1_002)
    assert (after.requests, after.remaining_requests, after.remaining_tokens) == (1, 9, 700)
    assert [row[4:7] for row in charges(database_url) if row[7] == "correction"] == [(0, 0, 200)]


def test_a_correction_applies_to_the_named_window_and_by_default_to_the_minute(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """``window_ms`` selects the windows the figures are for (the charge is the difference in that window, and only
    it is returned); without it the minute window is corrected (the providers' headers describe a minute), and a
    key with only a five-hour budget is left as it is; a correction counts only in windows of
    the length it corrects (the provider's five-hour figure says nothing about the last minute); a window_ms no
    budget of the key has, or a key without budgets, corrects nothing and returns ()."""
    plane = make_plane(
        policy=budgeted(
            Budget("p1", "m1", window_ms=FIVE_HOURS, max_tokens=10_000),
            Budget("p1", "m1", window_ms=MINUTE, max_tokens=1_000),
            Budget("p1", "m9", window_ms=FIVE_HOURS, max_tokens=10_000),
        )
    )
    (minute,) = plane.correct_budget("p1", "m1", {"x-ratelimit-remaining-tokens": "400"}, now=1_000)
    assert (minute.window_ms, minute.remaining_tokens) == (MINUTE, 400)
    assert window(plane, 1_000, window_ms=FIVE_HOURS).remaining_tokens == 10_000, "the minute's correction is its own"
    (hours,) = plane.correct_budget(
        "p1", "m1", {"x-ratelimit-remaining-tokens": "5000"}, window_ms=FIVE_HOURS, now=1_001
    )
    assert (hours.window_ms, hours.remaining_tokens) == (FIVE_HOURS, 5_000)
    assert [row[6] for row in charges(database_url)] == [600, 5_000], "each charge is its own window's difference"
    # The five hours' correction does not fill the minute; the minute's leaves the minute after a minute.
    assert window(plane, 1_001).remaining_tokens == 400
    assert window(plane, 1_000 + MINUTE).remaining_tokens == 1_000
    assert window(plane, 1_000 + MINUTE, window_ms=FIVE_HOURS).remaining_tokens == 5_000
    before = table_dump(database_url)
    assert plane.correct_budget("p1", "m1", Remaining(tokens=0), window_ms=1_234, now=1_002) == ()
    assert plane.correct_budget("p1", "m2", Remaining(tokens=0), now=1_002) == (), "a key without budgets"
    assert plane.correct_budget("p1", "m9", Remaining(tokens=0), now=1_002) == (), "only a five-hour window"
    assert table_dump(database_url) == before


def test_a_correction_of_a_provider_and_a_model_window_leaves_both_at_the_providers_figure(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """The figure applies to every budget of the key's window, the model's and the provider's; the provider's
    share is charged provider-wide (it does not count in another model's own budget) and both windows end with
    exactly the remaining the provider said."""
    plane = make_plane(
        policy=budgeted(
            Budget("p1", None, max_tokens=1_000),
            Budget("p1", "m1", max_tokens=500),
            Budget("p1", "m2", max_tokens=500),
        )
    )
    windows = plane.correct_budget("p1", "m1", Remaining(tokens=100), now=1_000)
    assert sorted((w.model or "", w.remaining_tokens) for w in windows) == [("", 100), ("m1", 100)]
    assert window(plane, 1_000, model="m2").remaining_tokens == 500
    assert sorted(row[2] for row in charges(database_url)) == ["", "m1"]


def test_headers_without_remaining_figures_return_nothing_and_write_nothing(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Response headers that carry no remaining figure (none, unrelated ones, a retry-after) return () and leave
    the database as it was."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_tokens=1_000)))
    before = table_dump(database_url)
    for headers in [{}, {"content-type": "application/json"}, {"retry-after": "5"}]:
        assert plane.correct_budget("p1", "m1", headers, now=1_000) == (), headers
    assert table_dump(database_url) == before


MALFORMED_CORRECTIONS: dict[str, dict[str, Any]] = {
    "negative": {"remaining": {"x-ratelimit-remaining-tokens": "-1"}},
    "text": {"remaining": {"x-ratelimit-remaining-tokens": "many"}},
    "not a mapping": {"remaining": "x-ratelimit-remaining-tokens: 5"},
    "zero window": {"remaining": Remaining(tokens=1), "window_ms": 0},
    "negative time": {"remaining": Remaining(tokens=1), "now": -1},
    "empty provider": {"remaining": Remaining(tokens=1), "provider": ""},
    "empty model": {"remaining": Remaining(tokens=1), "model": ""},
}


def test_a_malformed_correction_is_refused_and_writes_nothing(make_plane: PlaneFactory, database_url: str) -> None:
    """A malformed remaining figure, headers that are not a mapping, a window that is not positive, a negative time
    or a bad provider or model raise InvalidInputError and write nothing."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_tokens=1_000)))
    before = table_dump(database_url)
    for arguments in MALFORMED_CORRECTIONS.values():
        given: dict[str, Any] = {"provider": "p1", "model": "m1", "now": 1_000, **arguments}
        with pytest.raises(InvalidInputError):
            plane.correct_budget(**given)
    assert table_dump(database_url) == before


# --- the enqueue's estimate ------------------------------------------------------------------------------------------


def test_an_estimate_above_a_budgets_max_tokens_is_refused_at_enqueue_and_nothing_is_written(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """An estimate no window of the key could ever hold raises BudgetError (naming the window and its limit),
    with or without a payload, and writes nothing; exactly max_tokens, or the same estimate for another key,
    is accepted."""
    plane = make_plane(
        policy=budgeted(
            Budget("p1", None, window_ms=FIVE_HOURS, max_tokens=5_000),
            Budget("p1", "m1", window_ms=MINUTE, max_tokens=1_000),
        )
    )
    before = table_dump(database_url)
    with pytest.raises(BudgetError) as raised:
        put(plane, "huge", 10, estimate=1_001)
    assert (raised.value.window_ms, raised.value.max_tokens) == (MINUTE, 1_000)
    assert isinstance(raised.value, InvalidInputError)
    with pytest.raises(BudgetError) as raised:
        plane.enqueue(
            request_id="huge-bare",
            session_id="s",
            agent_id="a",
            fingerprint="f",
            provider="p1",
            model="m2",
            now=10,
            estimated_tokens=5_001,
        )
    assert (raised.value.window_ms, raised.value.max_tokens) == (FIVE_HOURS, 5_000)
    assert table_dump(database_url) == before
    assert not put(plane, "exact", 11, estimate=1_000).existed
    assert not put(plane, "elsewhere", 12, estimate=10**9, provider="p2").existed
    assert sorted(query(database_url, "SELECT request_id, tokens FROM turn_estimates")) == [
        ("elsewhere", 10**9),
        ("exact", 1_000),
    ]


def test_replaying_an_enqueue_with_the_same_estimate_is_idempotent_and_another_estimate_conflicts(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """The estimate is part of a request's metadata: the same estimate replays (existed=True); another estimate,
    or none where one was given (and the reverse), raises AdmissionConflictError and changes nothing."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_tokens=1_000)))
    assert not put(plane, "r", 10, estimate=300).existed
    assert not put(plane, "bare", 10).existed
    before = table_dump(database_url)
    assert put(plane, "r", 10, estimate=300).existed
    assert put(plane, "bare", 10).existed
    for request_id, estimate in [("r", 301), ("r", None), ("r", 0), ("bare", 0), ("bare", 5)]:
        with pytest.raises(AdmissionConflictError):
            put(plane, request_id, 10, estimate=estimate)
    assert table_dump(database_url) == before


def test_an_invalid_estimate_is_refused_at_enqueue(make_plane: PlaneFactory, database_url: str) -> None:
    """A negative, fractional, boolean, textual or oversized estimate raises InvalidInputError and writes nothing
    (even where no budget covers the key)."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_tokens=1_000)))
    before = table_dump(database_url)
    estimates: list[Any] = [-1, 1.5, True, "10", 2**40 + 1]
    for estimate in estimates:
        with pytest.raises(InvalidInputError):
            put(plane, "r", 10, estimate=estimate, provider="p9")
    assert table_dump(database_url) == before


# --- status ----------------------------------------------------------------------------------------------------------


def test_budget_status_reports_each_windows_use_remaining_and_next_reset(make_plane: PlaneFactory) -> None:
    """Every window of the policy, in its order: requests, reserved tokens of unsettled turns, used tokens of settled
    turns and usage outside the plane, what remains (None without such a limit), and when the oldest charge
    leaves; an empty window has no next reset."""
    plane = make_plane(
        policy=budgeted(
            Budget("p1", "m1", window_ms=MINUTE, max_requests=5, max_tokens=1_000),
            Budget("p1", None, window_ms=FIVE_HOURS, max_tokens=5_000),
        )
    )
    empty = plane.budget_status(now=500)
    assert [(w.model, w.requests, w.remaining_requests, w.remaining_tokens, w.next_reset_at) for w in empty] == [
        ("m1", 0, 5, 1_000, None),
        (None, 0, None, 5_000, None),
    ]
    put(plane, "r1", 10, estimate=300)
    put(plane, "r2", 11, estimate=100)
    lease = take(plane, 1_000)
    activate(plane, lease, 1_000)
    plane.complete_live_turn(lease, 1_500, LiveTurnCompletion("completed", usage=Usage(150, 50)))
    assert admitted(plane, 2_000) == "r2"
    plane.record_external_usage("p1", "m2", tokens=50, now=3_000)
    minute, hours = plane.budget_status(now=4_000)
    assert minute == BudgetWindow(
        provider="p1",
        model="m1",
        window_ms=MINUTE,
        max_requests=5,
        max_tokens=1_000,
        requests=2,
        reserved_tokens=100,
        used_tokens=200,
        remaining_requests=3,
        remaining_tokens=700,
        next_reset_at=1_000 + MINUTE,
    )
    assert hours == BudgetWindow(
        provider="p1",
        model=None,
        window_ms=FIVE_HOURS,
        max_requests=None,
        max_tokens=5_000,
        requests=2,
        reserved_tokens=100,
        used_tokens=250,
        remaining_requests=None,
        remaining_tokens=4_650,
        next_reset_at=1_000 + FIVE_HOURS,
    )
    minute = plane.budget_status(now=1_000 + MINUTE)[0]
    assert (minute.requests, minute.reserved_tokens, minute.used_tokens, minute.next_reset_at) == (
        1,
        100,
        0,
        2_000 + MINUTE,
    ), "r1 left the minute: r2 is the oldest charge"
    assert minute.to_json()["remaining_tokens"] == 900


def test_budget_status_is_empty_without_budgets_and_refuses_a_bad_time(make_plane: PlaneFactory) -> None:
    """A policy without budgets has no window to report; a negative time raises InvalidInputError."""
    plane = make_plane(policy=ROOMY)
    assert plane.budget_status(now=1_000) == ()
    with pytest.raises(InvalidInputError):
        plane.budget_status(now=-1)


# --- policy revisions ------------------------------------------------------------------------------------------------


def test_a_revision_removing_the_budget_lets_the_waiting_request_in(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """A request held back only by a budget is admitted as soon as a live revision without that budget is in force,
    long before the window would have freed it; the charges made meanwhile stay recorded."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_requests=1), base=LIVE))
    put(plane, "r1", 10)
    put(plane, "r2", 11)
    assert admitted(plane, 1_000) == "r1"
    assert admitted(plane, 3_001) is None, "past the start interval, held back only by the budget"
    plane.set_policy(LIVE, now=3_002)
    assert plane.budget_status(now=3_003) == ()
    assert admitted(plane, 3_003) == "r2"
    assert request_state(database_url, "r2") == "admitted"
    assert [row[0] for row in charges(database_url)] == ["r1"], "no budget covers r2 any more: no charge"


def test_a_revision_adding_a_budget_counts_the_turns_charged_before_it(make_plane: PlaneFactory) -> None:
    """Charges are kept per key whatever the policy: a revision that puts a budget back in force counts the
    requests admitted under the earlier budget in its window."""
    plane = make_plane(policy=budgeted(Budget("p1", "m1", max_requests=2), base=LIVE))
    put(plane, "r1", 10)
    put(plane, "r2", 11)
    assert admitted(plane, 1_000) == "r1"
    plane.set_policy(budgeted(Budget("p1", "m1", max_requests=1), base=LIVE), now=1_001)
    assert window(plane, 3_001).remaining_requests == 0
    assert admitted(plane, 3_001) is None
    assert admitted(plane, 1_000 + MINUTE) == "r2"
