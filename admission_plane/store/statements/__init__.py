"""Every SQL statement of the service, built once from the entities, one module per job.

Parameters are named bind parameters (``bindparam("now")``); constants are rendered as
literals so a compiled statement needs nothing but its named arguments. The admission
rule lives in :mod:`.admission` (``SELECT_CANDIDATE_IDLE_AGENT`` / ``SELECT_CANDIDATE_ANY``);
the statements every state change is made of live in :mod:`.transitions`.
"""

from __future__ import annotations

from ..tx import Statement
from . import admission, dispatch, journal, leases, policy, requests, transitions

__all__ = ["admission", "dispatch", "every_statement", "journal", "leases", "policy", "requests", "transitions"]


def every_statement() -> tuple[Statement, ...]:
    """Every statement of every module (to compile them all ahead of time, or to check them)."""
    modules = (admission, dispatch, journal, leases, policy, requests, transitions)
    return tuple(value for module in modules for value in vars(module).values() if isinstance(value, Statement))
