"""One waiting connector of the idle-waiters benchmark (``python -m benchmarks._waiter``).

It opens the plane, enqueues its own request, prints ``ready``, waits for ``go`` on
standard input, then waits for admission for ``--seconds`` (the seats stay held, so it
times out) and prints one JSON line: the CPU seconds the wait used and how many
admission looks it ran. ``--mode polling`` disables the plane's doorbell, so the wait
runs the look on every back-off step, as it does on a database without a doorbell.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from admission_plane import AdmissionPlane, Policy
from admission_plane.service import _admission

from ._support import CONTENT_KEY, ENCRYPTION_KEY, wall_ms


def main(argv: list[str] | None = None) -> int:
    """Open, enqueue, report ready, wait for ``go``, wait for admission, report."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--mode", choices=("doorbell", "polling"), required=True)
    parser.add_argument("--policy", required=True, help="JSON list: the five policy integers")
    args = parser.parse_args(argv)
    plane = AdmissionPlane(
        args.database,
        policy=Policy(*json.loads(args.policy)),
        encryption_key=ENCRYPTION_KEY,
        content_fingerprint_key=CONTENT_KEY,
    )
    if args.mode == "polling":
        plane._ctx.doorbell = None  # what a database without a doorbell (PostgreSQL) gets
    looks = 0
    look = _admission.look

    def counted(*look_args: Any, **look_options: Any) -> Any:
        nonlocal looks
        looks += 1
        return look(*look_args, **look_options)

    _admission.look = counted
    request_id = f"waiter-{args.index}"
    now = wall_ms()
    plane.enqueue_with_payload(
        request_id=request_id,
        session_id=f"session-{args.index}",
        agent_id=f"waiter-{args.index}",
        fingerprint="fp-1",
        provider="antigravity",
        model="model-bench",
        now=now,
        plaintext="prompt",
        expires_at=now + 1_800_001,
    )
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 2
    cpu = time.process_time()
    lease = plane.wait_for_admission(request_id, "waiter", timeout_ms=round(args.seconds * 1000))
    print(json.dumps({"cpu_s": time.process_time() - cpu, "looks": looks, "admitted": lease is not None}), flush=True)
    plane.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
