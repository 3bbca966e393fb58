"""The operator's actions: the token, the session, the CSRF token and the confirmation guard every one of them."""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Iterator

import pytest

from admission_plane import AdmissionPlane, Policy
from admission_plane.clock import wall_clock_ms

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from admission_plane.web import create_app

TOKEN = "operator-" + "x" * 24


@pytest.fixture
def plane(plane_file: str) -> Iterator[AdmissionPlane]:
    with AdmissionPlane(
        plane_file,
        policy=Policy(max_active_turns=2, max_concurrent_starts=2, min_start_interval_ms=0),
        encryption_key=os.urandom(32),
        content_fingerprint_key=os.urandom(32),
    ) as opened:
        yield opened


def _client(plane: AdmissionPlane, token: str | None = TOKEN) -> TestClient:
    return TestClient(create_app(plane, token=token, log=lambda line: None), base_url="http://127.0.0.1:8321")


def _hold_a_seat(plane: AdmissionPlane, request_id: str = "secret-request-1") -> str:
    now = wall_clock_ms()
    plane.enqueue_with_payload(
        request_id=request_id,
        session_id="secret-session",
        agent_id="secret-agent",
        fingerprint="v1",
        provider="prov",
        model="mod",
        now=now,
        plaintext="a secret prompt",
        expires_at=now + 600_000,
    )
    lease = plane.admit_next(now, plane.owner_identity.owner_instance_id)
    assert lease is not None
    return lease.lease_id


def _login(client: TestClient, token: str = TOKEN) -> str:
    response = client.post("/login", data={"token": token}, follow_redirects=False)
    assert response.status_code == 303
    page = client.get("/").text
    found = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page)
    assert found is not None
    return found.group(1)


def _handle(client: TestClient) -> str:
    rows = client.get("/api/snapshot").json()["leases"]["rows"]
    assert len(rows) == 1
    return str(rows[0]["handle"])


def _state(plane: AdmissionPlane) -> tuple[object, ...]:
    request = plane.get_request("secret-request-1")
    events = plane.read_sanitized_events(limit=1000)
    pauses = plane.pauses() if hasattr(plane, "pauses") else ()
    return (None if request is None else request.state, len(events), pauses)


def test_release_without_a_session_changes_nothing(plane: AdmissionPlane) -> None:
    """A release posted without logging in (no session cookie), even with a CSRF value, is refused (401)."""
    _hold_a_seat(plane)
    with _client(plane) as client:
        handle = _handle(client)
        before = _state(plane)
        response = client.post("/actions/release", data={"lease": handle, "csrf": "0" * 64, "confirm": "release"})
        assert response.status_code == 401
        assert _state(plane) == before


def test_login_with_a_wrong_token_is_refused_and_its_action_changes_nothing(plane: AdmissionPlane) -> None:
    """A wrong operator token gets no session, so the release that follows is refused and the seat stays held."""
    _hold_a_seat(plane)
    with _client(plane) as client:
        handle = _handle(client)
        before = _state(plane)
        refused = client.post("/login", data={"token": TOKEN + "-wrong"}, follow_redirects=False)
        assert refused.status_code == 401
        assert "admission_plane_operator" not in client.cookies
        response = client.post("/actions/release", data={"lease": handle, "csrf": "0" * 64, "confirm": "release"})
        assert response.status_code == 401
        assert _state(plane) == before


def test_action_without_the_csrf_token_changes_nothing(plane: AdmissionPlane) -> None:
    """A logged-in session's action without the CSRF token, or with a wrong one, is refused (403), changing nothing."""
    _hold_a_seat(plane)
    with _client(plane) as client:
        csrf = _login(client)
        handle = _handle(client)
        before = _state(plane)
        for data in (
            {"lease": handle, "confirm": "release"},
            {"lease": handle, "csrf": "f" * 64, "confirm": "release"},
        ):
            response = client.post("/actions/release", data=data)
            assert response.status_code == 403
            assert _state(plane) == before
        for name in ("pause", "resume", "policy"):
            response = client.post(f"/actions/{name}", data={"scope": "all", "confirm": name, "policy": "{}"})
            assert response.status_code == 403
        assert _state(plane) == before
        assert csrf  # the session did have one: it was simply not sent


def test_action_without_confirmation_changes_nothing(plane: AdmissionPlane) -> None:
    """An action with a valid session and CSRF token but without ``confirm=<action>`` is refused (400)."""
    _hold_a_seat(plane)
    with _client(plane) as client:
        csrf = _login(client)
        handle = _handle(client)
        before = _state(plane)
        response = client.post("/actions/release", data={"lease": handle, "csrf": csrf, "confirm": "pause"})
        assert response.status_code == 400
        assert _state(plane) == before


def test_cross_origin_action_changes_nothing(plane: AdmissionPlane) -> None:
    """A browser's cross-site POST (a foreign Origin) is refused even with the session cookie and CSRF token."""
    _hold_a_seat(plane)
    with _client(plane) as client:
        csrf = _login(client)
        handle = _handle(client)
        before = _state(plane)
        response = client.post(
            "/actions/release",
            data={"lease": handle, "csrf": csrf, "confirm": "release"},
            headers={"Origin": "http://evil.example"},
        )
        assert response.status_code == 403
        assert _state(plane) == before


def test_read_only_server_refuses_every_action(plane: AdmissionPlane) -> None:
    """Without an operator token the server is read-only: login and every action are refused (403)."""
    _hold_a_seat(plane)
    with _client(plane, token=None) as client:
        assert client.post("/login", data={"token": TOKEN}).status_code == 403
        before = _state(plane)
        for name in ("pause", "resume", "policy", "release"):
            assert client.post(f"/actions/{name}", data={"confirm": name}).status_code == 403
        assert _state(plane) == before
        assert 'id="login-token"' not in client.get("/").text


def test_release_with_the_token_frees_the_seat_and_journals_without_identifiers(plane: AdmissionPlane) -> None:
    """With session, CSRF token and confirmation the release frees the seat, ending the pre-dispatch request
    cancelled, journalled as an identifier-free ``operator_seat_released``."""
    lease_id = _hold_a_seat(plane)
    with _client(plane) as client:
        csrf = _login(client)
        handle = _handle(client)
        assert lease_id not in handle
        response = client.post("/actions/release", data={"lease": handle, "csrf": csrf, "confirm": "release"})
        assert response.status_code == 200, response.text
        request = plane.get_request("secret-request-1")
        assert request is not None
        assert request.state == "cancelled"
        last = plane.read_sanitized_events(limit=1000)[-1]
        assert last.kind == "operator_seat_released"
        again = client.post("/actions/release", data={"lease": handle, "csrf": csrf, "confirm": "release"})
        assert again.status_code == 404


@pytest.mark.skipif(
    not hasattr(AdmissionPlane, "pause") or not hasattr(AdmissionPlane, "set_policy"),
    reason="this plane has no pause or live policy yet",
)
def test_pause_resume_and_policy_with_the_token(plane: AdmissionPlane) -> None:
    """Pause and resume (global, lane, key) and a policy edit take effect through the plane and journal themselves."""
    with _client(plane) as client:
        csrf = _login(client)
        for data in (
            {"scope": "all"},
            {"scope": "lane", "lane": "default"},
            {"scope": "key", "provider": "prov", "model": "mod"},
        ):
            response = client.post("/actions/pause", data={**data, "csrf": csrf, "confirm": "pause"})
            assert response.status_code == 200, response.text
        assert {p.scope for p in plane.pauses()} == {"all", "lane", "key"}
        for data in (
            {"scope": "all"},
            {"scope": "lane", "lane": "default"},
            {"scope": "key", "provider": "prov", "model": "mod"},
        ):
            response = client.post("/actions/resume", data={**data, "csrf": csrf, "confirm": "resume"})
            assert response.status_code == 200, response.text
        assert plane.pauses() == ()
        policy = plane.current_policy().policy.to_json() | {"max_active_turns": 5, "min_start_interval_ms": 2000}
        import json

        response = client.post(
            "/actions/policy", data={"policy": json.dumps(policy), "csrf": csrf, "confirm": "policy"}
        )
        assert response.status_code == 200, response.text
        assert plane.current_policy().policy.max_active_turns == 5
        kinds = [event.kind for event in plane.read_sanitized_events(limit=1000)]
        assert kinds.count("admission_paused") == 3
        assert kinds.count("admission_resumed") == 3
        assert "policy_revised" in kinds
        bad = client.post(
            "/actions/policy", data={"policy": '{"max_active_turns": 0}', "csrf": csrf, "confirm": "policy"}
        )
        assert bad.status_code == 400
        assert plane.current_policy().policy.max_active_turns == 5


def test_no_page_or_endpoint_shows_an_identifier_or_a_prompt(plane: AdmissionPlane) -> None:
    """The dashboard, its snapshot, its stream's view and /metrics never show a request, session or agent id,
    a lease id or a prompt."""
    lease_id = _hold_a_seat(plane)
    now = wall_clock_ms()
    plane.enqueue_with_payload(
        request_id="secret-request-2",
        session_id="secret-session",
        agent_id="secret-agent-2",
        fingerprint="v1",
        provider="prov",
        model="mod",
        now=now,
        plaintext="another secret prompt",
        expires_at=now + 600_000,
    )
    with _client(plane) as client:
        _login(client)
        bodies = [client.get(path).text for path in ("/", "/api/snapshot", "/metrics")]
    for body in bodies:
        for secret in ("secret-request", "secret-session", "secret-agent", "secret prompt", lease_id):
            assert secret not in body


def test_metrics_names_follow_the_prometheus_conventions(plane: AdmissionPlane) -> None:
    """Every exported name has the admission_plane_ prefix, counters end in _total, durations in _seconds,
    and the exposition parses."""
    from prometheus_client.parser import text_string_to_metric_families

    _hold_a_seat(plane)
    with _client(plane) as client:
        response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(response.text))
    assert families
    for family in families:
        assert family.name.startswith("admission_plane_")
        assert not re.search(r"_(ms|milliseconds|minutes)$", family.name)
        for sample in family.samples:
            if family.type == "counter":
                assert sample.name.endswith(("_total", "_created"))
            if "age" in family.name or "wait" in family.name or "remaining" in family.name:
                assert family.name.endswith("_seconds")
    names = {family.name for family in families}
    assert {"admission_plane_queue_depth", "admission_plane_seats_in_use", "admission_plane_events"} <= names


def test_security_headers_forbid_framing_and_inline_script(plane: AdmissionPlane) -> None:
    """Every page forbids framing (clickjacking the actions) and inline scripts, and is never cached."""
    with _client(plane) as client:
        response = client.get("/")
    assert response.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert "script-src" not in response.headers["content-security-policy"]  # default-src 'self': no inline script
    assert response.headers["cache-control"] == "no-store"
    assert "<script>" not in response.text


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
