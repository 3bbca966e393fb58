"""``admission-plane``: the operator's command line.

Commands: ``db upgrade|downgrade|current|check``, ``keys init``, ``status``, ``events``,
``reap``, ``release`` and ``demo``. Every command takes ``--db`` (a URL or an SQLite path; default
``$ADMISSION_PLANE_DATABASE_URL``, else ``admission.sqlite`` in the state directory).
Keys come from the environment or the key file (see :mod:`admission_plane.keys`), never
from the command line, and are never printed.

Errors are one line on standard error, ``admission-plane: error: <message>``, with exit
status 2 (1 when a check ran and found a problem); never a traceback. Set
``ADMISSION_PLANE_DEBUG=1`` to see the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from sqlalchemy.exc import SQLAlchemyError

from ..errors import AdmissionError, InvalidInputError
from ._common import EXIT_ERROR, EXIT_INTERRUPTED, PROG, CommandFailed, first_line
from ._parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    Arguments argparse refuses end it with ``SystemExit(2)`` after one error line; ``argv``
    that is not a sequence of strings is refused the same way, in one line, with status 2.
    """
    given: object = argv  # checked as given: callers without type checking may pass anything
    if given is not None and (
        isinstance(given, str | bytes) or not isinstance(given, Sequence) or not all(isinstance(a, str) for a in given)
    ):
        return _fail("arguments must be a sequence of strings", EXIT_ERROR)
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except CommandFailed as error:
        return _fail(str(error), error.status)
    except (AdmissionError, InvalidInputError) as error:
        return _fail(str(error), EXIT_ERROR)
    except Exception as error:  # the boundary: one line, never a traceback
        if os.environ.get("ADMISSION_PLANE_DEBUG"):
            raise
        return _fail(_describe(error), EXIT_ERROR)


def _describe(error: Exception) -> str:
    if isinstance(error, SQLAlchemyError):
        return f"database error: {first_line(error)}"
    if isinstance(error, OSError):
        return f"{error.strerror or error}" + (f": {error.filename}" if error.filename else "")
    module = type(error).__module__.split(".")[0]
    if module == "alembic":
        return first_line(error)
    return f"{type(error).__name__}: {first_line(error)}"


def _fail(message: str, status: int) -> int:
    line = " ".join(message.split()) or "unknown error"
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
