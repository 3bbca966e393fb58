"""A real connector process for the web tests: it runs turns through ``plane.turn`` (a real child process each).

``python tests/web/web_connector.py DB NAME --mode loop|hold [--stop-file PATH] [--turn-ms N] [--host-id ID]``;
keys from the environment. ``loop`` runs turns one after the other until the stop file exists;
``hold`` starts one turn whose provider child never ends, prints ``holding`` once the turn is
active, and waits to be killed (its lease then belongs to a connector that is gone).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

from admission_plane import AdmissionPlane, Policy
from admission_plane.keys import load_keys

POLICY = Policy(max_active_turns=2, max_concurrent_starts=2, min_start_interval_ms=0)
PROVIDER = "test-provider"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("name")
    parser.add_argument("--mode", choices=("loop", "hold"), default="loop")
    parser.add_argument("--stop-file")
    parser.add_argument("--turn-ms", type=int, default=250)
    parser.add_argument("--model", default="model-a")
    parser.add_argument("--host-id")
    args = parser.parse_args()
    keys = load_keys()
    with AdmissionPlane(
        args.db,
        policy=POLICY,
        encryption_key=keys.encryption_key,
        content_fingerprint_key=keys.content_fingerprint_key,
        host_id=args.host_id,
    ) as plane:
        if args.mode == "hold":
            return _hold(plane, args)
        for number in itertools.count():
            if args.stop_file and os.path.exists(args.stop_file):
                return 0
            script = f"import sys, time; sys.stdin.read(); time.sleep({args.turn_ms / 1000})"
            with plane.turn(
                request_id=f"{args.name}-{number}",
                session_id=f"{args.name}-session",
                agent_id=args.name,
                provider=PROVIDER,
                model=args.model,
                prompt=f"prompt {number} of {args.name}",
                command=[sys.executable, "-c", script],
            ) as turn:
                turn.child.wait()
    return 0


def _hold(plane: AdmissionPlane, args: argparse.Namespace) -> int:
    with plane.turn(
        request_id=f"{args.name}-held",
        session_id=f"{args.name}-session",
        agent_id=args.name,
        provider=PROVIDER,
        model=args.model,
        prompt="a turn that never ends",
        command=[sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(600)"],
    ) as turn:
        print(f"holding {turn.child.pid}", flush=True)  # the turn is active: its seat is held
        turn.child.wait()
    time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
