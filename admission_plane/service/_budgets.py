"""Budgets: requests and tokens per provider and per provider/model over sliding windows.

The rules, in one place:

* **What counts.** Every *charge* of a key: an admitted turn (one request and its tokens),
  usage recorded outside the plane (:func:`record_external_usage`) and corrections from the
  provider's remaining-budget headers (:func:`correct`). A turn's tokens are its estimate
  (``estimated_tokens`` at enqueue, 0 without one) until it settles, then what it used. A
  model-level budget counts the charges of its provider/model; a provider budget counts
  every charge of the provider.
* **The window slides.** A budget of ``window_ms`` counts, at time ``t``, the charges made
  in ``(t - window_ms, t]`` (and any stamped later, by a clock ahead of this one). A charge
  made at ``c`` leaves it at ``c + window_ms`` exactly; ``next_reset_at`` in the status is
  when the oldest one leaves.
* **Admission fits or waits.** A request is admitted only if, in every window of every
  budget covering its key, one more request stays within ``max_requests`` and its estimate
  within ``max_tokens`` (a window whose tokens are all spent admits nothing, not even a
  request without an estimate). At that moment one request and the estimate are reserved in
  every such window. So at every admission, each window's admitted requests and its
  reserved-plus-used tokens are within the budget; a turn that then reports more tokens than
  it estimated is counted at what it used (the provider charged it), which holds back later
  admissions until the window slides past it.
* **Head of line per key.** A key whose best request (by the admission rule) does not fit
  offers nothing: a smaller request behind it does not overtake it, so a large request is
  never starved by small ones. Other keys are not held back, and the admission walk skips
  the blocked key by its head (the cost does not grow with the requests queued behind it).
* **Settlement**, when the turn's seat is freed (:func:`settle`):

  - completed, failed or cancelled after its dispatch: ``reconciled`` to the usage the turn
    reported (``current.record_usage(...)``), else ``charged`` at its estimate;
  - ``recovery_required`` (the dispatch may have happened, the provider may have charged it):
    ``retained``, the reservation stands;
  - ended before any prompt was written (abandoned, its owner proved dead before the
    dispatch intent, released by the operator before it): ``refunded``, nothing counts.

* **Corrections only lower** what is left: a provider saying fewer remain than the plane
  thinks adds a correction charge of the difference; saying more changes nothing. A
  correction counts only in windows of the length it corrects (the provider's figure for
  five hours says nothing about the last minute), and leaves them as any charge does.

Budgets read per admission: one usage row per window of each key the walk reaches with a
budget (cached for the transaction), so the cost follows the charges in the window, which
``max_requests`` bounds, never the queue.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

import attrs

from .. import _validate as v
from ..errors import BudgetError, InvalidInputError, SchemaIntegrityError
from ..policy import Budget, Policy
from ..signals import Remaining, remaining_from_headers
from ..states import BUDGET_EVENT_ID, OUTSIDE_PLANE, ChargeState, EventKind, RequestState
from ..store.rows import BudgetUsageRow, LeaseRow
from ..store.statements.budgets import (
    INSERT_CHARGE,
    INSERT_ESTIMATE,
    KEY_CHARGES,
    KEY_USAGE,
    PROVIDER_CHARGES,
    PROVIDER_USAGE,
    PRUNE_CHARGES,
    REFUND_CHARGE,
    RETAIN_CHARGE,
    SELECT_ESTIMATE,
    SETTLE_CHARGE,
)
from ..store.tx import Tx
from ..values import MAX_TOKENS, BudgetWindow, Usage
from . import _journal, _policy
from ._context import PlaneContext

Key = tuple[str, str]
#: The window the providers' remaining-budget headers describe (OpenAI's and Anthropic's: a minute).
HEADER_WINDOW_MS = 60_000
#: Prune settled charges once every this many reservations of a process (they only cost space).
PRUNE_EVERY = 256


def check_estimate(policy: Policy, provider: str, model: str, tokens: int | None) -> None:
    """Refuse an estimate no window of the key's budgets could ever hold (it would wait for ever)."""
    if not tokens:
        return
    for budget in policy.budgets_for(provider, model):
        if budget.max_tokens is not None and tokens > budget.max_tokens:
            raise BudgetError(budget.window_ms, budget.max_tokens)


def store_estimate(tx: Tx, request_id: str, tokens: int | None) -> None:
    """Keep a new request's estimate (nothing without one)."""
    if tokens is not None:
        tx.send(INSERT_ESTIMATE, {"request_id": request_id, "tokens": tokens})


def stored_estimate(tx: Tx, request_id: str) -> int | None:
    """The estimate a request was enqueued with (``None``: none), checked."""
    tokens = tx.scalar(SELECT_ESTIMATE, {"request_id": request_id})
    if tokens is not None and (not v.is_safe_integer(tokens) or not 0 <= tokens <= MAX_TOKENS):
        raise SchemaIntegrityError("a stored token estimate is invalid")
    return tokens


@attrs.frozen
class Use:
    """What counts in one window: requests and tokens (reserved plus used), and the oldest charge."""

    requests: int
    reserved_tokens: int
    used_tokens: int
    oldest: int | None

    @property
    def tokens(self) -> int:
        """Reserved plus used tokens."""
        return self.reserved_tokens + self.used_tokens

    @classmethod
    def of(cls, row: BudgetUsageRow) -> Use:
        """From a usage row (every sum a non-negative integer)."""
        values = (row.requests, row.reserved_tokens, row.used_tokens)
        if not all(v.is_safe_integer(value) and value >= 0 for value in values):
            raise SchemaIntegrityError("a stored budget charge is invalid")
        return cls(*values, row.oldest)


def fits(budget: Budget, use: Use, tokens: int) -> bool:
    """Whether one more request of ``tokens`` fits ``budget`` with ``use`` already counted."""
    if budget.max_requests is not None and use.requests + 1 > budget.max_requests:
        return False
    return budget.max_tokens is None or (use.tokens < budget.max_tokens and use.tokens + tokens <= budget.max_tokens)


class Book:
    """The budgets of one transaction: usage read once per window, estimates, keys found blocked."""

    __slots__ = ("_estimates", "_usage", "blocked", "now", "policy", "tx")

    def __init__(self, tx: Tx, now: int, policy: Policy) -> None:
        self.tx = tx
        self.now = now
        self.policy = policy
        self._usage: dict[tuple[str, str | None, int], Use] = {}
        self._estimates: dict[str, int] = {}
        #: Keys whose best request did not fit, with that request's tokens (for when to look again).
        self.blocked: dict[Key, int] = {}

    def budgets(self, provider: str, model: str) -> tuple[Budget, ...]:
        """The budgets covering the key (:meth:`Policy.budgets_for`, remembered per policy)."""
        return _budgets_for(self.policy, provider, model)

    def use(self, budget: Budget) -> Use:
        """What counts now in ``budget``'s window."""
        cache_key = (budget.provider, budget.model, budget.window_ms)
        found = self._usage.get(cache_key)
        if found is None:
            row = self.tx.one(PROVIDER_USAGE if budget.model is None else KEY_USAGE, _window(budget, self.now))
            assert row is not None  # an aggregate always returns its row
            found = self._usage[cache_key] = Use.of(row)
        return found

    def estimate(self, request_id: str) -> int:
        """The request's estimated tokens (0 without an estimate)."""
        found = self._estimates.get(request_id)
        if found is None:
            found = self._estimates[request_id] = stored_estimate(self.tx, request_id) or 0
        return found

    def out_of_requests(self, provider: str, model: str) -> bool:
        """Whether a request budget of the key has no request left (the key offers nothing)."""
        return any(
            budget.max_requests is not None and self.use(budget).requests >= budget.max_requests
            for budget in self.budgets(provider, model)
        )

    def admits(self, provider: str, model: str, request_id: str) -> bool:
        """Whether ``request_id`` (the key's best request) fits every budget of its key; if not, the key is blocked."""
        budgets = self.budgets(provider, model)
        if not budgets:
            return True
        tokens = self.estimate(request_id) if any(budget.max_tokens is not None for budget in budgets) else 0
        if all(fits(budget, self.use(budget), tokens) for budget in budgets):
            return True
        self.blocked[(provider, model)] = tokens
        return False

    def free_at(self, provider: str, model: str, tokens: int) -> int | None:
        """When, by the windows' own clock, one more request of ``tokens`` fits every budget of the key
        (``None``: never by time alone)."""
        latest = self.now
        for budget in self.budgets(provider, model):
            use = self.use(budget)
            if fits(budget, use, tokens):
                continue
            moment = _window_frees(self.tx, budget, use, tokens, self.now)
            if moment is None:
                return None
            latest = max(latest, moment)
        return latest


def _window(budget: Budget, now: int) -> dict[str, object]:
    """The parameters that select the charges counting in ``budget``'s window at ``now``."""
    return {
        "provider": budget.provider,
        "model": budget.model,
        "since": now - budget.window_ms,
        "window_ms": budget.window_ms,
    }


def _window_frees(tx: Tx, budget: Budget, use: Use, tokens: int, now: int) -> int | None:
    """The first time the oldest charges leaving ``budget``'s window make room for one more request of ``tokens``."""
    requests, spent = use.requests, use.tokens
    for charge in tx.all(PROVIDER_CHARGES if budget.model is None else KEY_CHARGES, _window(budget, now)):
        requests -= charge.requests
        spent -= charge.tokens
        if fits(budget, Use(requests, spent, 0, None), tokens):
            moment: int = charge.charged_at + budget.window_ms
            return max(now + 1, moment)
    return None


_BUDGETS_FOR: dict[tuple[Policy, str, str], tuple[Budget, ...]] = {}


def _budgets_for(policy: Policy, provider: str, model: str) -> tuple[Budget, ...]:
    if not policy.budgets:
        return ()
    cache_key = (policy, provider, model)
    found = _BUDGETS_FOR.get(cache_key)
    if found is None:
        if len(_BUDGETS_FOR) > 4096:
            _BUDGETS_FOR.clear()
        found = _BUDGETS_FOR[cache_key] = policy.budgets_for(provider, model)
    return found


# --- reservation and settlement ---------------------------------------------------------------------


def reserve(ctx: PlaneContext, book: Book, request_id: str, provider: str, model: str, now: int) -> None:
    """Charge an admitted request to its key's budgets: one request and its estimate (nothing without a budget)."""
    budgets = book.budgets(provider, model)
    if not budgets:
        return
    tx = book.tx
    params = {
        "charge_id": request_id,
        "provider": provider,
        "model": model,
        "now": now,
        "requests": 1,
        "reserved_tokens": book.estimate(request_id),
        "used_tokens": None,
        "state": ChargeState.RESERVED,
        "window_ms": None,
    }
    tx.send(INSERT_CHARGE, params)
    _journal.record(ctx, tx, EventKind.BUDGET_RESERVED, request_id, ChargeState.UNCHARGED, ChargeState.RESERVED, now)
    ctx.reservations += 1
    if ctx.reservations % PRUNE_EVERY == 0:
        longest = max(budget.window_ms for budget in book.policy.budgets)
        tx.send(PRUNE_CHARGES, {"cutoff": now - longest})


def settlement(event: EventKind, target: str, usage: Usage | None) -> ChargeState:
    """How a turn's reservation settles when its seat is freed by ``event`` into ``target`` (the module's rules)."""
    if target == RequestState.RECOVERY_REQUIRED:
        return ChargeState.RETAINED
    if event is EventKind.REQUEST_RELEASED:
        return ChargeState.CHARGED if usage is None else ChargeState.RECONCILED
    return ChargeState.REFUNDED  # abandoned, owner dead or released before any prompt was written


def settle(
    ctx: PlaneContext, tx: Tx, lease: LeaseRow, event: EventKind, target: str, now: int, usage: Usage | None
) -> None:
    """Settle the reservation of ``lease``'s request as its seat is freed (nothing if it holds none)."""
    if not lease.charged:
        return
    state = settlement(event, target, usage)
    params = {"request_id": lease.request_id}
    if state is ChargeState.REFUNDED:
        changed = tx.execute(REFUND_CHARGE, params)
    elif state is ChargeState.RETAINED:
        changed = tx.execute(RETAIN_CHARGE, params)
    else:
        used = None if usage is None else usage.tokens
        changed = tx.execute(SETTLE_CHARGE, {**params, "used_tokens": used, "state": state})
    if changed == 1:
        _journal.record(ctx, tx, EventKind.BUDGET_SETTLED, lease.request_id, ChargeState.RESERVED, state, now)


# --- outside the plane: usage and the provider's corrections -------------------------------------------


def record_external_usage(
    ctx: PlaneContext, provider: str, model: str | None, requests: int, tokens: int, now: int
) -> None:
    """Charge usage spent outside the plane to ``provider`` (``model=None``: provider-wide) at ``now``."""
    v.request_field("provider", provider)
    if model is not None:
        v.request_field("model", model)
    if not v.is_safe_integer(requests) or not 0 <= requests <= MAX_TOKENS:
        raise InvalidInputError(f"external usage requests must be an integer from 0 to {MAX_TOKENS}")
    if not v.is_safe_integer(tokens) or not 0 <= tokens <= MAX_TOKENS:
        raise InvalidInputError(f"external usage tokens must be an integer from 0 to {MAX_TOKENS}")
    if requests == 0 and tokens == 0:
        raise InvalidInputError("external usage must count at least one request or token")
    v.timestamp(now, "external usage timestamp")
    ctx.run(lambda tx: _charge(ctx, tx, provider, model, requests, tokens, ChargeState.EXTERNAL, now, None))


def correct(
    ctx: PlaneContext,
    provider: str,
    model: str,
    remaining: Remaining | Mapping[str, str],
    now: int,
    window_ms: int,
) -> tuple[BudgetWindow, ...]:
    """Lower the key's budget windows to what the provider says remains (never raise them); the windows after.

    ``window_ms`` names the windows the provider's figures are for (the caller's default,
    :data:`HEADER_WINDOW_MS`, is the minute the providers' remaining-budget headers describe);
    a key without a window of that length is left as it is.
    """
    v.request_field("provider", provider)
    v.request_field("model", model)
    if not v.is_safe_integer(window_ms) or window_ms < 1:
        raise InvalidInputError("window_ms must be a positive integer")
    v.timestamp(now, "budget correction timestamp")
    if not isinstance(remaining, Remaining):
        if not isinstance(remaining, Mapping):
            raise InvalidInputError("remaining must be a Remaining or a mapping of response headers")
        found = remaining_from_headers(remaining)
        if found is None:
            return ()  # the headers say nothing about what remains
        remaining = found

    def work(tx: Tx) -> tuple[BudgetWindow, ...]:
        policy = _policy.effective(ctx, tx).policy
        corrected = []
        for budget in policy.budgets_for(provider, model):
            if budget.window_ms != window_ms:
                continue
            use = Book(tx, now, policy).use(budget)  # read afresh: an earlier correction counts
            extra_requests = _excess(budget.max_requests, use.requests, remaining.requests)
            extra_tokens = _excess(budget.max_tokens, use.tokens, remaining.tokens)
            if extra_requests or extra_tokens:
                scope = "" if budget.model is None else model
                state = ChargeState.CORRECTION
                _charge(ctx, tx, provider, scope, extra_requests, extra_tokens, state, now, budget.window_ms)
            corrected.append(budget)
        book = Book(tx, now, policy)
        return tuple(window_of(book, budget) for budget in corrected)

    return ctx.run(work)


def _excess(limit: int | None, used: int, remaining: int | None) -> int:
    """How much the plane must add so that ``limit - used`` is no more than the provider's ``remaining``."""
    if limit is None or remaining is None:
        return 0
    return max(0, (limit - used) - remaining)


def _charge(
    ctx: PlaneContext,
    tx: Tx,
    provider: str,
    model: str | None,
    requests: int,
    tokens: int,
    state: ChargeState,
    now: int,
    window_ms: int | None,
) -> None:
    """Insert a charge from outside the plane (``window_ms``: the only window length it counts in) and journal it."""
    params = {
        "charge_id": f"usage-{uuid.uuid4().hex}",
        "provider": provider,
        "model": model or "",
        "now": now,
        "requests": requests,
        "reserved_tokens": 0,
        "used_tokens": tokens,
        "state": state,
        "window_ms": window_ms,
    }
    tx.execute(INSERT_CHARGE, params)
    kind = EventKind.BUDGET_USAGE_RECORDED if state is ChargeState.EXTERNAL else EventKind.BUDGET_CORRECTED
    _journal.record(ctx, tx, kind, BUDGET_EVENT_ID, OUTSIDE_PLANE, state, now)


# --- visibility ---------------------------------------------------------------------------------------


def window_of(book: Book, budget: Budget) -> BudgetWindow:
    """One window of ``budget`` as it stands."""
    use = book.use(budget)

    def left(limit: int | None, used: int) -> int | None:
        return None if limit is None else max(0, limit - used)

    return BudgetWindow(
        provider=budget.provider,
        model=budget.model,
        window_ms=budget.window_ms,
        max_requests=budget.max_requests,
        max_tokens=budget.max_tokens,
        requests=use.requests,
        reserved_tokens=use.reserved_tokens,
        used_tokens=use.used_tokens,
        remaining_requests=left(budget.max_requests, use.requests),
        remaining_tokens=left(budget.max_tokens, use.tokens),
        next_reset_at=None if use.oldest is None else use.oldest + budget.window_ms,
    )


def windows(ctx: PlaneContext, tx: Tx, now: int) -> tuple[BudgetWindow, ...]:
    """Every window of every budget of the policy in force, in the policy's order."""
    policy = _policy.effective(ctx, tx).policy
    book = Book(tx, now, policy)
    return tuple(window_of(book, budget) for budget in policy.budgets)


def status(ctx: PlaneContext, now: int) -> tuple[BudgetWindow, ...]:
    """:func:`windows` in a read-only transaction."""
    v.timestamp(now, "budget status timestamp")
    return ctx.run(lambda tx: windows(ctx, tx, now), read_only=True)


__all__: Sequence[str] = [
    "Book",
    "check_estimate",
    "correct",
    "record_external_usage",
    "reserve",
    "settle",
    "settlement",
    "status",
    "store_estimate",
    "windows",
]
