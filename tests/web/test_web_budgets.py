"""Budget windows on the operator's web surface: ``/metrics`` gauges, the snapshot's view and the dashboard panel."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterator

import pytest

from admission_plane import AdmissionPlane, AdmittedLease, Budget, Policy
from admission_plane.clock import wall_clock_ms

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from admission_plane.web import create_app

#: The server's clock, fixed: every time below is relative to it.
NOW = wall_clock_ms()
ADMITTED_AT = NOW - 10_000
FIVE_HOURS = 5 * 3_600_000
BUDGETS = (
    Budget("prov", "mod", window_ms=60_000, max_requests=5, max_tokens=10_000),
    Budget("prov", window_ms=FIVE_HOURS, max_tokens=100_000),
)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _open(plane_file: str, budgets: tuple[Budget, ...]) -> AdmissionPlane:
    return AdmissionPlane(
        plane_file,
        policy=Policy(max_active_turns=2, max_concurrent_starts=2, min_start_interval_ms=0, budgets=budgets),
        encryption_key=os.urandom(32),
        content_fingerprint_key=os.urandom(32),
    )


@pytest.fixture
def budgeted(plane_file: str) -> Iterator[tuple[AdmissionPlane, AdmittedLease]]:
    """A plane whose policy has a per-minute budget of ``prov/mod`` and a five-hour token budget of ``prov``, with
    one admitted turn reserving its 2000-token estimate and 500 tokens (one request) recorded outside the plane
    against the provider as a whole."""
    with _open(plane_file, BUDGETS) as opened:
        opened.enqueue_with_payload(
            request_id="secret-request-1",
            session_id="secret-session",
            agent_id="secret-agent",
            fingerprint="v1",
            provider="prov",
            model="mod",
            now=ADMITTED_AT,
            plaintext="a secret prompt",
            expires_at=NOW + 600_000,
            estimated_tokens=2_000,
        )
        lease = opened.admit_next(ADMITTED_AT, opened.owner_identity.owner_instance_id)
        assert lease is not None
        opened.record_external_usage("prov", requests=1, tokens=500, now=NOW - 5_000)
        yield opened, lease


@pytest.fixture
def plane(budgeted: tuple[AdmissionPlane, AdmittedLease]) -> AdmissionPlane:
    """The budgeted plane (see ``budgeted``)."""
    return budgeted[0]


def _client(plane: AdmissionPlane) -> TestClient:
    app = create_app(plane, token=None, log=lambda line: None, clock=lambda: NOW)
    return TestClient(app, base_url="http://127.0.0.1:8321")


def _samples(text: str) -> tuple[Samples, dict[str, str]]:
    """The exposition's samples by name and labels, and each family's type."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, types


def _labels(model: str, window_ms: int, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"provider": "prov", "model": model, "window_ms": str(window_ms), **extra}.items()))


def test_metrics_export_every_budget_window(plane: AdmissionPlane) -> None:
    """``/metrics`` has, per budget window (labelled provider, model, ``""`` for the provider as a whole, and
    window_ms), the requests counted, tokens reserved and used, the limits and what is left (only where the budget
    sets that limit), and the seconds to the next reset; every budget family is a gauge named by the conventions."""
    with _client(plane) as client:
        samples, types = _samples(client.get("/metrics").text)
    model, provider = _labels("mod", 60_000), _labels("", FIVE_HOURS)
    expected = {
        ("admission_plane_budget_requests", model): 1,
        ("admission_plane_budget_requests_limit", model): 5,
        ("admission_plane_budget_requests_left", model): 4,
        ("admission_plane_budget_tokens", _labels("mod", 60_000, kind="reserved")): 2_000,
        ("admission_plane_budget_tokens", _labels("mod", 60_000, kind="used")): 0,
        ("admission_plane_budget_tokens_limit", model): 10_000,
        ("admission_plane_budget_tokens_left", model): 8_000,
        ("admission_plane_budget_next_reset_seconds", model): 50.0,
        ("admission_plane_budget_requests", provider): 2,
        ("admission_plane_budget_tokens", _labels("", FIVE_HOURS, kind="reserved")): 2_000,
        ("admission_plane_budget_tokens", _labels("", FIVE_HOURS, kind="used")): 500,
        ("admission_plane_budget_tokens_limit", provider): 100_000,
        ("admission_plane_budget_tokens_left", provider): 97_500,
        ("admission_plane_budget_next_reset_seconds", provider): (ADMITTED_AT + FIVE_HOURS - NOW) / 1000,
    }
    budget_samples = {key: value for key, value in samples.items() if key[0].startswith("admission_plane_budget_")}
    assert budget_samples == expected
    budget_families = {name: kind for name, kind in types.items() if name.startswith("admission_plane_budget_")}
    assert set(budget_families.values()) == {"gauge"}
    for name in budget_families:
        assert not re.search(r"_(ms|milliseconds|minutes)$", name)
        assert "remaining" not in name, "the word means a duration (in _seconds) among these metrics"


def test_the_snapshot_and_the_dashboard_show_the_budget_windows(plane: AdmissionPlane) -> None:
    """The snapshot lists each window with its use, limits, what is left and the milliseconds to its next reset;
    the dashboard has a budgets card and table instead of the old "not tracked" note; no identifier appears."""
    with _client(plane) as client:
        snapshot = client.get("/api/snapshot")
        page = client.get("/").text
        metrics = client.get("/metrics").text
    assert snapshot.json()["budgets"] == [
        {
            "provider": "prov",
            "model": "mod",
            "window_ms": 60_000,
            "requests": 1,
            "max_requests": 5,
            "remaining_requests": 4,
            "reserved_tokens": 2_000,
            "used_tokens": 0,
            "max_tokens": 10_000,
            "remaining_tokens": 8_000,
            "next_reset_ms": 50_000,
        },
        {
            "provider": "prov",
            "model": None,
            "window_ms": FIVE_HOURS,
            "requests": 2,
            "max_requests": None,
            "remaining_requests": None,
            "reserved_tokens": 2_000,
            "used_tokens": 500,
            "max_tokens": 100_000,
            "remaining_tokens": 97_500,
            "next_reset_ms": ADMITTED_AT + FIVE_HOURS - NOW,
        },
    ]
    assert 'id="budgets"' in page
    assert 'id="budget-windows"' in page
    assert "not tracked" not in page
    for body in (snapshot.text, page, metrics):
        for secret in ("secret-request", "secret-session", "secret-agent", "secret prompt"):
            assert secret not in body


def test_a_refund_and_usage_recorded_outside_move_the_gauges(budgeted: tuple[AdmissionPlane, AdmittedLease]) -> None:
    """The gauges follow the plane at each scrape: a turn abandoned before its prompt write is refunded (its
    request and estimate leave every window), and usage recorded outside the plane that spends a window's requests
    shows 0 left."""
    plane, lease = budgeted
    plane.abandon_before_prompt(lease, NOW - 2_000, "failed")
    with _client(plane) as client:
        refunded, _ = _samples(client.get("/metrics").text)
    model, provider = _labels("mod", 60_000), _labels("", FIVE_HOURS)
    assert refunded[("admission_plane_budget_requests", model)] == 0
    assert refunded[("admission_plane_budget_tokens", _labels("mod", 60_000, kind="reserved"))] == 0
    assert refunded[("admission_plane_budget_next_reset_seconds", model)] == 0.0
    assert refunded[("admission_plane_budget_requests", provider)] == 1
    assert refunded[("admission_plane_budget_tokens_left", provider)] == 99_500
    plane.record_external_usage("prov", "mod", requests=5, tokens=100, now=NOW - 1_000)
    with _client(plane) as client:
        spent, _ = _samples(client.get("/metrics").text)
    assert spent[("admission_plane_budget_requests_left", model)] == 0
    assert spent[("admission_plane_budget_tokens", _labels("mod", 60_000, kind="used"))] == 100
    assert spent[("admission_plane_budget_next_reset_seconds", model)] == 59.0


def test_without_budgets_the_families_are_empty(plane_file: str) -> None:
    """A policy without budgets exports the budget families without a sample, and the snapshot lists none."""
    with _open(plane_file, ()) as plain, _client(plain) as client:
        samples, types = _samples(client.get("/metrics").text)
        snapshot = client.get("/api/snapshot").json()
    assert "admission_plane_budget_requests" in types
    assert not [key for key in samples if key[0].startswith("admission_plane_budget_")]
    assert snapshot["budgets"] == []
