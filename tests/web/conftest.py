"""Fixtures of the web tests: a migrated plane with keys and a token, the server as a real process, Chromium."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from gates import require

from admission_plane.migrate import upgrade

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("ADMISSION_PLANE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ADMISSION_PLANE_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
TOKEN = "operator-" + "t" * 24
_ANNOUNCE = re.compile(r"on http://([^/\s]+)/")


@pytest.fixture
def keyed_env(tmp_path: Path) -> dict[str, str]:
    """The environment of every process of a test: fresh keys, the operator token, no proxy."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ADMISSION_PLANE_")}
    env["ADMISSION_PLANE_ENCRYPTION_KEY"] = secrets.token_hex(32)
    env["ADMISSION_PLANE_CONTENT_KEY"] = secrets.token_hex(32)
    env["ADMISSION_PLANE_OPERATOR_TOKEN"] = TOKEN
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["PYTHONPATH"] = str(ROOT)
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        env.pop(proxy, None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


@pytest.fixture
def plane_file(tmp_path: Path) -> str:
    """A migrated SQLite plane file."""
    path = str(tmp_path / "plane.sqlite")
    upgrade(path)
    return path


@contextmanager
def running_server(db: str, env: dict[str, str], *extra: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``admission-plane serve`` on ``db`` (any free port) as a real process; yields it and its base URL.

    On exit it sends SIGTERM and requires a graceful exit (status 0) within 15 s.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "admission_plane", "serve", "--db", db, "--port", "0", "--tick", "0.25", *extra],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 30
        url = None
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            found = _ANNOUNCE.search(line)
            if found:
                url = f"http://{found.group(1)}"
        assert url is not None, f"the server did not start: {process.stderr.read() if process.poll() else ''}"
        yield process, url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError("the server did not stop within 15 s of SIGTERM") from None
        assert status == 0, f"the server exited with {status}"


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[object]:
    """A headless Chromium driven through Debian's chromium-driver; skips (fails in CI) when either is missing."""
    require(
        os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER),
        f"Chromium is not installed ({CHROMIUM}, {CHROMEDRIVER}; apt-get install chromium chromium-driver)",
    )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        require(False, "selenium is not installed (pip install -e '.[test]')")
        raise
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager look for a browser on the network
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1500,1150",
        "--no-proxy-server",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
