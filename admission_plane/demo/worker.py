"""One demo agent: a real connector process that submits its turns through the high-level API.

Started by :mod:`admission_plane.demo` as ``python -m admission_plane.demo.worker``
with the database URL, the policy and a JSON plan of turns on the command line and the
keys in the environment (``ADMISSION_PLANE_ENCRYPTION_KEY``/``ADMISSION_PLANE_CONTENT_KEY``).
It reports on standard output, one JSON object per line, never a key or a prompt:

* ``{"event": "kill_point", ...}`` when a turn marked ``kill_point`` committed its dispatch
  intent; the worker then waits to be killed (the demo sends SIGKILL);
* ``{"event": "result", ...}`` when a turn ended.

Each turn's provider call is a real child process (:data:`PROVIDER_SCRIPT`) in its own
process group: it reads the prompt on stdin, "thinks" for a while and answers, or exits
with :data:`CAPACITY_EXIT_STATUS` to simulate an overloaded model, or (``hang``) never
reads its prompt and just lives on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ..clock import wall_clock_ms
from ..keys import load_keys
from ..plane import AdmissionPlane
from ..policy import Policy
from ..states import RequestState
from ..turns import Turn, TurnNotAdmittedError

CAPACITY_EXIT_STATUS = 75
PROVIDER = "demo-provider"
PROVIDER_SCRIPT = """
import sys, time
ms, mode = int(sys.argv[1]), sys.argv[2]
if mode == "hang":
    time.sleep(300)
    sys.exit(1)
prompt = sys.stdin.read()
time.sleep(ms / 1000)
if mode == "capacity":
    sys.stdout.write("overloaded")
    sys.exit(75)
sys.stdout.write("answered a prompt of %d characters" % len(prompt))
"""


def provider_command(duration_ms: int, mode: str) -> list[str]:
    """The argv of one fake provider call (``mode``: ``ok``, ``capacity`` or ``hang``)."""
    return [sys.executable, "-I", "-S", "-c", PROVIDER_SCRIPT, str(duration_ms), mode]


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message, sort_keys=True) + "\n")
    sys.stdout.flush()


def run_worker(args: argparse.Namespace) -> int:
    """Submit every turn of the plan, one after the other, and report each result."""
    keys = load_keys(args.key_file)
    policy = Policy(*json.loads(args.policy))
    plan = json.loads(args.plan)
    with AdmissionPlane(
        args.db,
        policy=policy,
        encryption_key=keys.encryption_key,
        content_fingerprint_key=keys.content_fingerprint_key,
    ) as plane:
        for spec in plan:
            positions: list[int] = []

            def progress(turn: Turn, phase: str, spec: dict[str, Any] = spec, positions: list[int] = positions) -> None:
                if phase == RequestState.QUEUED and turn.snapshot is not None:
                    positions.append(turn.snapshot.position)
                if phase == RequestState.DISPATCH_INTENT and spec.get("kill_point"):
                    _emit(
                        {
                            "event": "kill_point",
                            "agent": args.agent,
                            "index": spec["index"],
                            "request_id": spec["request_id"],
                            "child_pid": turn.pid,
                            "worker_pid": _pid(),
                        }
                    )
                    time.sleep(600)  # the demo kills this process with SIGKILL here

            active = Turn(
                plane,
                request_id=spec["request_id"],
                session_id=f"session-{args.agent}",
                agent_id=args.agent,
                provider=PROVIDER,
                model=spec["model"],
                prompt=f"turn {spec['index']} of {args.agent}: please answer",
                command=provider_command(spec["provider_ms"], spec["mode"]),
                progress=progress,
                heartbeat_interval_ms=500,
            )
            error = None
            try:
                with active as live:
                    assert live.child is not None
                    assert live.child.stdout is not None
                    live.child.stdout.read()
                    status = live.child.wait()
                    if status == CAPACITY_EXIT_STATUS:
                        live.fail("provider_capacity", http_status=529, code="overloaded")
                    elif status != 0:
                        live.fail("unknown", code=f"exit-{status}")
            except TurnNotAdmittedError as exc:
                error = str(exc)
            _emit(
                {
                    "event": "result",
                    "agent": args.agent,
                    "index": spec["index"],
                    "request_id": spec["request_id"],
                    "model": spec["model"],
                    "outcome": str(active.state) if active.state is not None else "unknown",
                    "enqueued_at": active.enqueued_at,
                    "admitted_at": active.admitted_at,
                    "waited_ms": active.waited_ms,
                    "ended_at": wall_clock_ms(),
                    "max_position": max(positions, default=None),
                    "lease_lost": active.lease_lost,
                    "error": error,
                }
            )
    return 0


def _pid() -> int:
    return os.getpid()


def main(argv: list[str] | None = None) -> int:
    """Parse the worker's arguments and run its plan."""
    parser = argparse.ArgumentParser(prog="python -m admission_plane.demo.worker")
    parser.add_argument("--db", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--policy", required=True, help="JSON list of the five policy integers")
    parser.add_argument("--plan", required=True, help="JSON list of turn specifications")
    parser.add_argument("--key-file")
    return run_worker(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
