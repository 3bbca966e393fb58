"""The dashboard in a real headless Chromium, on a real server process, with real connector processes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TOKEN, running_server

CONNECTOR = str(Path(__file__).with_name("web_connector.py"))
SCREENSHOT = os.environ.get("ADMISSION_PLANE_SCREENSHOT")  # e.g. docs/dashboard.png, to refresh the README's


def _wait(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _count(db: str, sql: str, *args: object) -> int:
    with sqlite3.connect(db) as connection:
        return int(connection.execute(sql, args).fetchone()[0])


def _admissions(db: str) -> int:
    return _count(db, "SELECT count(*) FROM events WHERE kind = 'request_admitted'")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (a URL of our own test server)
        return str(response.read().decode())


def _post(url: str, data: dict[str, str]) -> int:
    body = urllib.parse.urlencode(data).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _connector(db: str, env: dict[str, str], name: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, CONNECTOR, db, name, *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow
def test_dashboard_live_in_chromium(chromium: Any, plane_file: str, keyed_env: dict[str, str], tmp_path: Path) -> None:
    """Chromium sees the dashboard update live as real connectors run turns, pauses admission from the page
    and sees it stop, resumes it, releases a dead host's seat with the token after being refused without it,
    and /metrics agrees with the database."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = chromium
    db = plane_file
    stop_file = str(tmp_path / "stop")
    workers: list[subprocess.Popen[str]] = []

    # The page re-renders its live parts on every refresh: an element found just before may be gone when it is
    # read or clicked (StaleElementReferenceException), so each is found again until one stays long enough.
    def text(element_id: str) -> str:
        deadline = time.monotonic() + 20.0
        while True:
            try:
                return str(driver.find_element(By.ID, element_id).text)
            except StaleElementReferenceException:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def clicked(selector: str) -> bool:
        try:
            driver.find_element(By.CSS_SELECTOR, selector).click()
        except StaleElementReferenceException:
            return False
        return True

    def confirm_action(button_id: str) -> str:
        driver.execute_script("document.getElementById('action-result').textContent = ''")
        _wait(lambda: clicked(button_id), f"a click on {button_id}")
        _wait(lambda: driver.find_element(By.ID, "confirm-dialog").is_displayed(), "the confirmation dialog")
        driver.find_element(By.ID, "confirm-yes").click()
        return str(_wait(lambda: text("action-result"), "the action's result"))

    with running_server(db, keyed_env) as (_server, url):
        try:
            # A connector of a host that is gone: it holds a seat, then dies with its provider child.
            holder = _connector(db, keyed_env, "holder", "--mode", "hold", "--host-id", "vanished-host")
            assert holder.stdout is not None
            child_pid = int(holder.stdout.readline().split()[1])
            for number in range(3):
                workers.append(
                    _connector(
                        db, keyed_env, f"agent-{number}", "--stop-file", stop_file, "--model", f"model-{number % 2}"
                    )
                )

            driver.get(url + "/")
            _wait(lambda: text("conn") == "live", "the event stream")
            driver.execute_script("window.__sameDocument = 'yes'")
            first = int(_wait(lambda: text("admissions-total") not in ("", "–") and text("admissions-total"), "data"))
            _wait(lambda: int(text("admissions-total")) >= first + 3, "admissions to appear live")
            assert driver.execute_script("return window.__sameDocument") == "yes"  # no reload: the stream did it
            _wait(lambda: driver.find_elements(By.CSS_SELECTOR, "#journal tr td"), "the journal tail")

            # Kill the holder and its child: the seat stays held, with another host's evidence.
            os.kill(holder.pid, signal.SIGKILL)
            os.killpg(child_pid, signal.SIGKILL)
            holder.wait()

            # Without the token: no session, and a release posted with the lease's handle is refused.
            snapshot = json.loads(_get(url + "/api/snapshot"))
            held = [row for row in snapshot["leases"]["rows"] if row["evidence"] == "another host"]
            assert len(held) == 1
            handle = held[0]["handle"]
            assert driver.find_elements(By.CSS_SELECTOR, "button.release") == []
            assert _post(url + "/actions/release", {"lease": handle, "confirm": "release", "csrf": "x"}) == 401
            assert _post(url + "/login", {"token": TOKEN + "-wrong"}) == 401
            held_lease = (
                "SELECT count(*) FROM leases l JOIN lease_process_identities p USING (lease_id) WHERE p.host_id = ?"
            )
            assert _count(db, held_lease, "vanished-host") == 1

            # Log in from the page.
            driver.find_element(By.ID, "login-token").send_keys(TOKEN)
            driver.find_element(By.ID, "login-submit").click()
            _wait(lambda: driver.find_elements(By.ID, "pause-button"), "the operator's controls")
            _wait(lambda: text("conn") == "live", "the event stream after logging in")

            # Pause everything: admission stops while the connectors keep asking.
            Select(driver.find_element(By.ID, "pause-scope")).select_by_value("all")
            assert "paused (all)" in confirm_action("#pause-button")
            _wait(lambda: text("admission-state") == "paused", "the page to show the pause")
            time.sleep(1.0)  # a turn admitted just before the pause finishes meanwhile
            before = _admissions(db)
            time.sleep(2.5)
            assert _admissions(db) == before, "a request was admitted while admission was paused"
            assert int(text("admissions-total")) == before
            _wait(lambda: int(text("queue-depth")) >= 1, "the queue to grow while paused")

            # Resume: admission flows again.
            assert "resumed (all)" in confirm_action("#resume-button")
            _wait(lambda: _admissions(db) > before, "admission to resume")
            _wait(lambda: int(text("admissions-total")) > before, "the page to show admissions again")

            # Release the dead host's seat from the page.
            button = f"button.release[data-lease='{handle}']"
            _wait(lambda: driver.find_elements(By.CSS_SELECTOR, button), "the release button")
            result = confirm_action(button)
            assert "released a seat held in active" in result, result
            assert _count(db, held_lease, "vanished-host") == 0
            assert (
                _count(
                    db,
                    "SELECT count(*) FROM turn_requests WHERE request_id = 'holder-held' AND state = ?",
                    "recovery_required",
                )
                == 1
            )
            _wait(lambda: int(text("recovery-required")) == 1, "the page to show the recovery_required turn")

            if SCREENSHOT:
                time.sleep(1.5)
                driver.save_screenshot(str(ROOT / SCREENSHOT))
            driver.save_screenshot(str(tmp_path / "dashboard.png"))

            # Stop the connectors, then /metrics must agree with the database exactly.
            Path(stop_file).touch()
            for worker in workers:
                assert worker.wait(timeout=30) == 0
            _check_metrics(url, db)
        finally:
            Path(stop_file).touch()
            for process in [*workers]:
                if process.poll() is None:
                    process.kill()
                    process.wait()


def _check_metrics(url: str, db: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(_get(url + "/metrics")):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    with sqlite3.connect(db) as connection:
        kinds = dict(connection.execute("SELECT kind, count(*) FROM events GROUP BY kind").fetchall())
        queued = connection.execute("SELECT count(*) FROM turn_requests WHERE state = 'queued'").fetchone()[0]
        seats = connection.execute("SELECT count(*) FROM leases").fetchone()[0]
        recovery = connection.execute(
            "SELECT count(*) FROM turn_requests WHERE state = 'recovery_required'"
        ).fetchone()[0]
        last = connection.execute("SELECT max(event_seq) FROM events").fetchone()[0]
    for kind, count in kinds.items():
        assert samples[("admission_plane_events_total", (("kind", kind),))] == count, kind
    assert samples[("admission_plane_queue_requests", ())] == queued
    assert samples[("admission_plane_seats_in_use", ())] == seats
    assert samples[("admission_plane_recovery_required_requests", ())] == recovery == 1
    assert samples[("admission_plane_journal_last_sequence", ())] == last
    admitted = kinds["request_admitted"]
    assert samples[("admission_plane_admission_wait_seconds_count", ())] == admitted
    assert samples[("admission_plane_admission_wait_seconds_bucket", (("le", "+Inf"),))] == admitted
