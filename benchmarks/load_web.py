"""A bounded load test of ``admission-plane serve`` on 127.0.0.1 (issue 15); a script, not a test.

``.venv/bin/python -m benchmarks.load_web [--clients 50] [--seconds 60] [--connectors 4]``

It migrates a fresh SQLite plane, starts real connector processes running turns
(``tests/web/web_connector.py``: each turn a real child process), starts the server as its
own process, then for ``--seconds``: ``--clients`` dashboard clients each hold the event
stream open (and load the page once), one Prometheus-style scrape of ``/metrics`` per
second, and one ``/api/snapshot`` per second. It reports the scrape and snapshot latency
(p50, p95, max), the stream messages each client received and the longest gap between
two of them, every error, the server's CPU seconds and peak RSS, and the turns the
connectors completed in the window; the figures go to stdout as a table and to
``bench-results/load_web.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONNECTOR = ROOT / "tests" / "web" / "web_connector.py"


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _proc_figures(pid: int) -> tuple[float, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            rss = int(line.split()[1]) * 1024
    return cpu, rss


class _StreamClient(threading.Thread):
    def __init__(self, host: str, port: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.host, self.port, self.stop = host, port, stop
        self.messages = 0
        self.max_gap = 0.0
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            page = http.client.HTTPConnection(self.host, self.port, timeout=30)
            page.request("GET", "/")
            if page.getresponse().read().find(b"admission-plane") < 0:
                self.errors.append("page without title")
            page.close()
            connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
            connection.request("GET", "/api/stream")
            response = connection.getresponse()
            last = time.monotonic()
            while not self.stop.is_set():
                line = response.fp.readline()
                if not line:
                    self.errors.append("stream ended early")
                    return
                if line.startswith(b"data: "):
                    data = json.loads(line[6:])
                    if "error" in data:
                        self.errors.append(str(data["error"]))
                    now = time.monotonic()
                    if self.messages:
                        self.max_gap = max(self.max_gap, now - last)
                    last, self.messages = now, self.messages + 1
            connection.close()
        except Exception as error:  # noqa: BLE001 (every failure is a figure of the report)
            self.errors.append(f"{type(error).__name__}: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--connectors", type=int, default=4)
    parser.add_argument("--turn-ms", type=int, default=200)
    args = parser.parse_args()

    from admission_plane.migrate import upgrade

    workdir = Path(tempfile.mkdtemp(prefix="load-web-"))
    db = str(workdir / "plane.sqlite")
    upgrade(db)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADMISSION_PLANE_")}
    env |= {
        "ADMISSION_PLANE_ENCRYPTION_KEY": secrets.token_hex(32),
        "ADMISSION_PLANE_CONTENT_KEY": secrets.token_hex(32),
        "ADMISSION_PLANE_OPERATOR_TOKEN": secrets.token_urlsafe(24),
        "XDG_STATE_HOME": str(workdir / "state"),
        "PYTHONPATH": str(ROOT),
    }
    stop_file = workdir / "stop"
    connectors = [
        subprocess.Popen(
            [
                sys.executable,
                str(CONNECTOR),
                db,
                f"agent-{n}",
                "--stop-file",
                str(stop_file),
                "--turn-ms",
                str(args.turn_ms),
                "--model",
                f"model-{n % 2}",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        for n in range(args.connectors)
    ]
    server = subprocess.Popen(
        [sys.executable, "-m", "admission_plane", "serve", "--db", db, "--port", "0"],
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stderr is not None
    line = server.stderr.readline()
    address = line.split("http://", 1)[1].split("/", 1)[0]
    host, port = address.rsplit(":", 1)
    base = f"http://{address}"
    stop = threading.Event()
    clients = [_StreamClient(host, int(port), stop) for _ in range(args.clients)]
    for client in clients:
        client.start()
    scrapes: list[float] = []
    snapshots: list[float] = []
    errors: list[str] = []
    turns_before = _completed(db)
    cpu_before, _ = _proc_figures(server.pid)
    began = time.monotonic()
    while time.monotonic() - began < args.seconds:
        tick = time.monotonic()
        for path, sink in (("/metrics", scrapes), ("/api/snapshot", snapshots)):
            try:
                started = time.perf_counter()
                with urllib.request.urlopen(base + path, timeout=10) as response:  # noqa: S310 (our own server)
                    body = response.read()
                sink.append(time.perf_counter() - started)
                if path == "/metrics" and b"admission_plane_seats_in_use" not in body:
                    errors.append("scrape without seats")
            except Exception as error:  # noqa: BLE001 (a figure of the report)
                errors.append(f"{path}: {type(error).__name__}: {error}")
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    elapsed = time.monotonic() - began
    cpu_after, peak_rss = _proc_figures(server.pid)
    turns = _completed(db) - turns_before
    stop.set()
    stop_file.touch()
    for connector in connectors:
        connector.wait(timeout=60)
    server.send_signal(signal.SIGTERM)
    shutdown_began = time.monotonic()
    status = server.wait(timeout=30)
    shutdown_s = time.monotonic() - shutdown_began
    for client in clients:
        client.join(timeout=5)
    report: dict[str, Any] = {
        "clients": args.clients,
        "seconds": round(elapsed, 1),
        "connectors": args.connectors,
        "turns_completed": turns,
        "scrapes": len(scrapes),
        "scrape_ms": {
            k: round(_percentile(scrapes, q) * 1000, 1) for k, q in (("p50", 0.5), ("p95", 0.95), ("max", 1.0))
        },
        "snapshots": len(snapshots),
        "snapshot_ms": {
            k: round(_percentile(snapshots, q) * 1000, 1) for k, q in (("p50", 0.5), ("p95", 0.95), ("max", 1.0))
        },
        "stream_messages_per_client": {
            "min": min(c.messages for c in clients),
            "max": max(c.messages for c in clients),
        },
        "stream_longest_gap_s": round(max(c.max_gap for c in clients), 2),
        "errors": errors + [e for c in clients for e in c.errors],
        "server_cpu_s": round(cpu_after - cpu_before, 1),
        "server_cpu_share": round((cpu_after - cpu_before) / elapsed, 3),
        "server_peak_rss_mb": round(peak_rss / 2**20, 1),
        "shutdown_s": round(shutdown_s, 2),
        "shutdown_status": status,
    }
    results = Path(os.environ.get("BENCH_RESULTS_DIR", ROOT / "bench-results"))
    results.mkdir(parents=True, exist_ok=True)
    (results / "load_web.json").write_text(json.dumps(report, indent=2) + "\n")
    for key, value in report.items():
        print(f"{key:28} {value}")
    return 0 if not report["errors"] and status == 0 else 1


def _completed(db: str) -> int:
    import sqlite3

    with sqlite3.connect(db) as connection:
        return int(connection.execute("SELECT count(*) FROM turn_requests WHERE state = 'completed'").fetchone()[0])


if __name__ == "__main__":
    sys.exit(main())
