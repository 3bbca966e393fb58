"""``python -m tmux_owner`` / ``tmux-owner``: one JSON request line on stdin, one response line on stdout."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ._argv import CLI_FLAG
from ._jscompat import MAX_LINE_BYTES
from ._protocol import cli_failure, run_protocol, serialize_response

USAGE = f"usage: tmux-owner [{CLI_FLAG}] < request.json\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Read one request line from stdin, write one response line, return the exit status.

    Accepts no arguments or exactly ``--internal-tmux-owner-isolation`` (the scoped
    bootstrap's argv); anything else is a usage error (status 2). Never prints a traceback.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments not in ([], [CLI_FLAG]):
        sys.stderr.write(USAGE)
        return 2
    # One byte past a maximal line plus its newline is enough to see any violation.
    data = sys.stdin.buffer.read(MAX_LINE_BYTES + 2)
    try:
        output, status = run_protocol(data)
    except Exception:  # noqa: BLE001 - the protocol promises one line, never a traceback
        output, status = serialize_response(cli_failure("internal_error")), 1
    sys.stdout.buffer.write(output.encode("utf-8", "surrogatepass") + b"\n")
    sys.stdout.buffer.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
