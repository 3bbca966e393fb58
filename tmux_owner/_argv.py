"""The tmux argv grammar: which owner launch argv is accepted, and the argv this package builds.

An owner is launched by exactly one ``new-session`` with exactly one explicit session
name; everything before ``new-session`` (``tmux -L x``) is how to reach the same server.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence

from ._validators import field_validator, non_empty

CLI_FLAG = "--internal-tmux-owner-isolation"
_NATIVE_SESSION_ID = re.compile(r"\$[0-9]+")


def is_native_session_id(value: object) -> bool:
    """A tmux native session id ``$<digits>``."""
    return isinstance(value, str) and _NATIVE_SESSION_ID.fullmatch(value) is not None


def bootstrap_argv() -> list[str]:
    """The argv that enters this package's JSON-line protocol in a fresh interpreter (the flag is last)."""
    return [sys.executable, "-m", "tmux_owner", CLI_FLAG]


def owner_scope_unit(token: str) -> str:
    """The transient scope unit a scoped attempt's bootstrap must run in: ``gjc-owner-<token>.scope``."""
    return f"gjc-owner-{token}.scope"


def scoped_execution_argv(expected_scope: str) -> list[str]:
    """``systemd-run --user --scope`` around the bootstrap argv; no shell, no stdin in argv."""
    return ["systemd-run", "--user", "--scope", "--quiet", "--unit", expected_scope, *bootstrap_argv()]


def canonical_new_session(tmux_argv: Sequence[str]) -> tuple[int, str] | None:
    """Exactly one ``new-session`` (not at index 0) with exactly one explicit ``-s``/``--session-name``.

    Returns the index of ``new-session`` and the session name.
    """
    commands = [index for index, arg in enumerate(tmux_argv) if arg == "new-session"]
    if len(commands) != 1 or commands[0] < 1:
        return None
    session: str | None = None
    index = commands[0] + 1
    while index < len(tmux_argv):
        if tmux_argv[index] in ("-s", "--session-name"):
            value = tmux_argv[index + 1] if index + 1 < len(tmux_argv) else None
            if not non_empty(value) or session is not None:
                return None
            session = value
            index += 1
        index += 1
    return (commands[0], session) if session else None


def tmux_attempt_session(tmux_argv: Sequence[str]) -> str | None:
    """The session name the argv creates, if the argv is one canonical ``new-session``."""
    command = canonical_new_session(tmux_argv)
    return None if command is None else command[1]


def tmux_control_argv(tmux_argv: Sequence[str]) -> list[str]:
    """The argv before ``new-session`` (``["tmux", "-L", "x"]``): how to reach the same server."""
    command = canonical_new_session(tmux_argv)
    return list(tmux_argv[: command[0]]) if command else []


def is_valid_argv(argv: object) -> bool:
    """A non-empty list of strings without NUL whose first element is non-empty."""
    return (
        isinstance(argv, list)
        and len(argv) > 0
        and all(isinstance(arg, str) and "\0" not in arg for arg in argv)
        and len(argv[0]) > 0
    )


def argv_tuple(argv: Iterable[str]) -> tuple[str, ...]:
    """The converter of every argv field of a record: an immutable copy."""
    return tuple(argv)


validate_argv = field_validator(lambda argv: is_valid_argv(list(argv)))
