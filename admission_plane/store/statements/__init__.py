"""Every SQL statement of the service, built once from the entities, one module per job.

Parameters are named bind parameters (``bindparam("now")``); constants are rendered as
literals so a compiled statement needs nothing but its named arguments. The admission
rule reads the admission index of :mod:`.queue` (walked by
:mod:`admission_plane.service._selection`); the statements every state change is made of
live in :mod:`.transitions`.
"""

from __future__ import annotations

from ..tx import Statement
from . import admission, budgets, dispatch, journal, leases, policy, queue, requests, transitions

__all__ = [
    "admission",
    "budgets",
    "dispatch",
    "every_statement",
    "journal",
    "leases",
    "policy",
    "queue",
    "requests",
    "transitions",
]


def every_statement() -> tuple[Statement, ...]:
    """Every statement of every module (to compile them all ahead of time, or to check them)."""
    modules = (admission, budgets, dispatch, journal, leases, policy, queue, requests, transitions)
    return tuple(value for module in modules for value in vars(module).values() if isinstance(value, Statement))
