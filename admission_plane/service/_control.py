"""Pause and resume admission: everything, one lane, or one provider/model key.

A pause holds back admission only: running turns go on, queue time-outs still apply. A
resume rings the doorbell for everyone, so waiters look again at once. Each change is
journalled with the kind of its scope only (never a lane, provider or model name).
"""

from __future__ import annotations

from .. import _validate as v
from ..errors import InvalidInputError
from ..states import ADMITTING, PAUSE_STATES, POLICY_EVENT_ID, EventKind
from ..store.doorbell import Bell
from ..store.statements.policy import DELETE_PAUSE, INSERT_PAUSE, PAUSE_EXISTS, SELECT_ALL_PAUSES
from ..store.tx import Tx
from ..values import Pause
from . import _journal
from ._context import PlaneContext


def scope(lane: str | None, provider: str | None, model: str | None) -> tuple[str, dict[str, str]]:
    """The scope's kind and its stored key (``''`` for the parts it does not name)."""
    if lane is not None:
        v.identifier(lane, "pause lane")
        if provider is not None or model is not None:
            raise InvalidInputError("a pause names a lane or a provider/model key, not both")
        return "lane", {"lane": lane, "provider": "", "model": ""}
    if (provider is None) != (model is None):
        raise InvalidInputError("a key pause names both its provider and its model")
    if provider is None:
        return "all", {"lane": "", "provider": "", "model": ""}
    v.identifier(provider, "pause provider")
    v.identifier(model, "pause model")
    assert model is not None
    return "key", {"lane": "", "provider": provider, "model": model}


def pause(ctx: PlaneContext, lane: str | None, provider: str | None, model: str | None, now: int) -> bool:
    """Pause admission in the scope; ``False`` if it was paused already."""
    kind, key = scope(lane, provider, model)
    v.timestamp(now, "pause timestamp")

    def work(tx: Tx) -> bool:
        if tx.exists(PAUSE_EXISTS, key):
            return False
        tx.execute(INSERT_PAUSE, {**key, "now": now})
        _journal.record(ctx, tx, EventKind.ADMISSION_PAUSED, POLICY_EVENT_ID, ADMITTING, PAUSE_STATES[kind], now)
        return True

    return ctx.run(work)


def resume(ctx: PlaneContext, lane: str | None, provider: str | None, model: str | None, now: int) -> bool:
    """Resume admission in the scope; ``False`` if it was not paused."""
    kind, key = scope(lane, provider, model)
    v.timestamp(now, "resume timestamp")

    def work(tx: Tx) -> bool:
        if tx.execute(DELETE_PAUSE, key) != 1:
            return False
        _journal.record(ctx, tx, EventKind.ADMISSION_RESUMED, POLICY_EVENT_ID, PAUSE_STATES[kind], ADMITTING, now)
        tx.ring(Bell.EVERYONE)
        return True

    return ctx.run(work)


def pauses(ctx: PlaneContext) -> tuple[Pause, ...]:
    """Every paused scope."""
    rows = ctx.run(lambda tx: tx.all(SELECT_ALL_PAUSES), read_only=True)
    return tuple(Pause(row.lane or None, row.provider or None, row.model or None, row.since) for row in rows)
