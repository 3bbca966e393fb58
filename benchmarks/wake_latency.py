"""How long a waiting connector on PostgreSQL takes from a freed seat to its own admission.

``python -m benchmarks.wake_latency [--rounds 20]`` on a fresh database of the server named by
``ADMISSION_PLANE_TEST_POSTGRES_URL``: one seat; plane A holds it, plane B waits for the next
request (``initial_delay_ms=50``, ``max_delay_ms=200``); A frees the seat; the time until B's
``wait_for_admission`` returns is one sample. Prints the median and the largest, in ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from admission_plane import AdmissionPlane, Policy, wall_clock_ms
from admission_plane.migrate import upgrade

from ._support import CONTENT_KEY, ENCRYPTION_KEY, POSTGRES_URL_VARIABLE

POLICY = Policy(1, 1, 0, 1_800_000, 30_000)


def main(argv: list[str] | None = None) -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    server = make_url(os.environ.get(POSTGRES_URL_VARIABLE, "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as connection:
        connection.exec_driver_sql("DROP DATABASE IF EXISTS admission_wake_latency WITH (FORCE)")
        connection.exec_driver_sql("CREATE DATABASE admission_wake_latency")
    url = server.set(database="admission_wake_latency").render_as_string(hide_password=False)
    upgrade(url)
    keys: dict[str, Any] = {"encryption_key": ENCRYPTION_KEY, "content_fingerprint_key": CONTENT_KEY}
    holder, waiter = AdmissionPlane(url, policy=POLICY, **keys), AdmissionPlane(url, policy=POLICY, **keys)
    samples = []
    try:
        for index in range(args.rounds):
            now = wall_clock_ms()
            for name in ("held", "waiting"):
                holder.enqueue_with_payload(
                    request_id=f"{name}-{index}", session_id=name, agent_id=name, fingerprint="f", provider="p",
                    model="m", now=now, plaintext="x", expires_at=now + 600_000,
                )  # fmt: skip
            held = holder.admit_next(now, holder.owner_identity.owner_instance_id)
            assert held is not None
            result: dict[str, Any] = {}

            def wait(index: int = index, result: dict[str, Any] = result) -> None:
                result["lease"] = waiter.wait_for_admission(
                    f"waiting-{index}", waiter.owner_identity.owner_instance_id, timeout_ms=10_000,
                    initial_delay_ms=50, max_delay_ms=200,
                )  # fmt: skip
                result["at"] = time.perf_counter()

            thread = threading.Thread(target=wait)
            thread.start()
            time.sleep(0.3)
            freed = time.perf_counter()
            holder.abandon_before_prompt(held, wall_clock_ms(), "cancelled")
            thread.join()
            samples.append((result["at"] - freed) * 1000)
            waiter.abandon_before_prompt(result["lease"], wall_clock_ms(), "cancelled")
    finally:
        holder.close()
        waiter.close()
        with admin.connect() as connection:
            connection.exec_driver_sql("DROP DATABASE IF EXISTS admission_wake_latency WITH (FORCE)")
    print(f"freed seat -> admission: median {statistics.median(samples):.1f} ms, max {max(samples):.1f} ms")


if __name__ == "__main__":
    main()
