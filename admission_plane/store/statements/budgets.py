"""Budgets: token estimates, charges, and what counts in a window (see ``service._budgets``)."""

from __future__ import annotations

from sqlalchemy import SQLColumnExpression, case, cast, delete, func, insert, select, update
from sqlalchemy.sql.elements import ColumnElement

from ...states import ChargeState
from ..model import BudgetCharge, Int64, TurnEstimate
from ..rows import BudgetUsageRow, ChargeRow
from ..tx import AnySelect, Query, Scalar, Statement
from ._build import P, lit

BC, TE = BudgetCharge, TurnEstimate

INSERT_ESTIMATE = Statement(insert(TE).values(request_id=P("request_id"), tokens=P("tokens")))
SELECT_ESTIMATE: Scalar[int] = Scalar(select(TE.tokens).where(TE.request_id == P("request_id")))

INSERT_CHARGE = Statement(
    insert(BC).values(
        charge_id=P("charge_id"),
        provider=P("provider"),
        model=P("model"),
        charged_at=P("now"),
        requests=P("requests"),
        reserved_tokens=P("reserved_tokens"),
        used_tokens=P("used_tokens"),
        state=P("state"),
        window_ms=P("window_ms"),
    )
)
#: A charge counts in a window unless it is a correction of a window of another length.
_in_window = BC.window_ms.is_(None) | (BC.window_ms == P("window_ms"))
_reserved = BC.state == lit(ChargeState.RESERVED)
#: Settle a turn's reservation to what it used (``used_tokens``), or to its estimate when it reported nothing.
SETTLE_CHARGE = Statement(
    update(BC)
    .where(BC.charge_id == P("request_id"), _reserved)
    .values(used_tokens=func.coalesce(P("used_tokens"), BC.reserved_tokens), state=P("state"))
)
#: ``recovery_required``: the reservation stands (``used_tokens`` stays NULL), only its state changes.
RETAIN_CHARGE = Statement(
    update(BC).where(BC.charge_id == P("request_id"), _reserved).values(state=lit(ChargeState.RETAINED))
)
#: A refund: no prompt was written, so nothing counts (row count 0: there was no reservation).
REFUND_CHARGE = Statement(delete(BC).where(BC.charge_id == P("request_id"), _reserved))
#: Forget settled charges that left every window (a live turn's reservation stays until it settles).
PRUNE_CHARGES = Statement(delete(BC).where(BC.charged_at <= P("cutoff"), ~_reserved))

_tokens = func.coalesce(BC.used_tokens, BC.reserved_tokens)


def _window(model_level: bool) -> list[ColumnElement[bool]]:
    """The charges counting in one window: of the provider (and model), since the window's start."""
    scope = [BC.provider == P("provider"), BC.charged_at > P("since"), _in_window]
    if model_level:
        scope.append(BC.model == P("model"))
    return scope


def _usage(model_level: bool) -> AnySelect:
    return select(
        _total(BC.requests).label("requests"),
        _total(case((BC.used_tokens.is_(None), BC.reserved_tokens), else_=0)).label("reserved_tokens"),
        _total(func.coalesce(BC.used_tokens, 0)).label("used_tokens"),
        func.min(BC.charged_at).label("oldest"),
    ).where(*_window(model_level))


def _total(column: SQLColumnExpression[int]) -> ColumnElement[int]:
    """``SUM`` as an integer (PostgreSQL sums bigints as numeric), 0 over no rows."""
    return cast(func.coalesce(func.sum(column), 0), Int64)


#: What counts in one window of a provider/model key, or of a whole provider.
KEY_USAGE = Query(_usage(model_level=True), BudgetUsageRow)
PROVIDER_USAGE = Query(_usage(model_level=False), BudgetUsageRow)


def _charges(model_level: bool) -> AnySelect:
    return (
        select(BC.charged_at, BC.requests, _tokens.label("tokens"))
        .where(*_window(model_level))
        .order_by(BC.charged_at, BC.charge_id)
    )


#: The charges of a window, oldest first (when a blocked key's window frees enough).
KEY_CHARGES = Query(_charges(model_level=True), ChargeRow)
PROVIDER_CHARGES = Query(_charges(model_level=False), ChargeRow)

__all__ = [
    "INSERT_CHARGE",
    "INSERT_ESTIMATE",
    "KEY_CHARGES",
    "KEY_USAGE",
    "PROVIDER_CHARGES",
    "PROVIDER_USAGE",
    "PRUNE_CHARGES",
    "REFUND_CHARGE",
    "RETAIN_CHARGE",
    "SELECT_ESTIMATE",
    "SETTLE_CHARGE",
]
