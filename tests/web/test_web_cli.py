"""The command line's additions: ``serve`` (default address, graceful shutdown), ``--version``, ``reap --dry-run``."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import running_server

from admission_plane.cli._serve import package_version

CONNECTOR = str(Path(__file__).with_name("web_connector.py"))


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "admission_plane", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_version_prints_the_installed_version() -> None:
    """``admission-plane --version`` prints the distribution's version and exits 0."""
    result = _cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"admission-plane {package_version()}"
    assert package_version() != "unknown"


def test_serve_binds_loopback_by_default_and_stops_gracefully_with_a_stream_open(
    plane_file: str, keyed_env: dict[str, str]
) -> None:
    """``serve`` listens on 127.0.0.1 unless told otherwise, and SIGTERM ends it with status 0 within seconds
    even while a dashboard stream is open."""
    with running_server(plane_file, keyed_env) as (process, url):
        assert url.startswith("http://127.0.0.1:")
        stream = urllib.request.urlopen(url + "/api/stream", timeout=10)  # noqa: S310 (our own test server)
        assert stream.readline().startswith(b"retry:")
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - started < 8
        stream.close()


def test_serve_without_keys_is_read_only(plane_file: str, keyed_env: dict[str, str]) -> None:
    """Without an operator token, ``serve`` needs no keys and says it is read-only."""
    env = {k: v for k, v in keyed_env.items() if not k.startswith("ADMISSION_PLANE_")}
    with (
        running_server(plane_file, env) as (_process, url),
        urllib.request.urlopen(  # noqa: S310
            url + "/metrics", timeout=10
        ) as response,
    ):
        assert b"admission_plane_queue_requests 0.0" in response.read()


def _holder(db: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, CONNECTOR, db, "holder", "--mode", "hold"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    return process, int(process.stdout.readline().split()[1])


def _table_counts(db: str) -> tuple[int, int, int]:
    with sqlite3.connect(db) as connection:
        return (
            connection.execute("SELECT count(*) FROM leases").fetchone()[0],
            connection.execute("SELECT count(*) FROM events").fetchone()[0],
            connection.execute("SELECT count(*) FROM leases WHERE suspect_since IS NOT NULL").fetchone()[0],
        )


@pytest.mark.slow
def test_reap_dry_run_reports_the_pass_and_changes_nothing(plane_file: str, keyed_env: dict[str, str]) -> None:
    """``reap --dry-run`` on a dead connector's seat changes no row and writes no event, and reports exactly
    what the real pass that follows then does."""
    holder, child = _holder(plane_file, keyed_env)
    os.kill(holder.pid, signal.SIGKILL)
    os.killpg(child, signal.SIGKILL)
    holder.wait()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:  # until init has reaped the child
        time.sleep(0.05)
    before = _table_counts(plane_file)
    assert before[0] == 1
    dry = _cli("reap", "--db", plane_file, "--dry-run", "--json", env=keyed_env)
    assert dry.returncode == 0, dry.stderr
    predicted = json.loads(dry.stdout)
    assert predicted.pop("dry_run") is True
    assert _table_counts(plane_file) == before
    real = _cli("reap", "--db", plane_file, "--json", env=keyed_env)
    assert real.returncode == 0, real.stderr
    done = json.loads(real.stdout)
    # Whether the lease is marked suspect depends on the clock (its heartbeat goes stale 4 s after the kill).
    assert {k: v for k, v in done.items() if k != "suspected"} == {
        k: v for k, v in predicted.items() if k != "suspected"
    }
    assert predicted["released"] + predicted["marked_recovery_required"] == 1  # it did act on the seat
    assert _table_counts(plane_file) != before
