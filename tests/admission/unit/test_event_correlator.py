"""The journal's event correlator: the correlation HMAC of ``event_correlation``, whatever order requests come
in, computed once for a run of events of one request, and nothing after it is forgotten."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission_plane.crypto import EventCorrelator, SecretKey, event_correlation

KEY = SecretKey(bytes(range(32)), "content fingerprint")


@settings(max_examples=200, deadline=None)
@given(request_ids=st.lists(st.sampled_from(["r-1", "r-2", "r-3", "é-4"]) | st.text(min_size=1), max_size=12))
def test_the_correlator_is_event_correlation_in_any_order(request_ids: list[str]) -> None:
    """Repeated and alternating requests each get exactly ``event_correlation`` of their own id."""
    correlate = EventCorrelator(KEY)
    for request_id in request_ids:
        assert correlate(request_id) == event_correlation(KEY, request_id)


def test_a_forgotten_correlator_answers_nothing_even_for_the_last_request() -> None:
    """After ``forget`` even the request it just answered for fails (nothing derived from the key is kept)."""
    correlate = EventCorrelator(KEY)
    correlate("r-1")
    correlate.forget()
    with pytest.raises(AttributeError):
        correlate("r-1")
