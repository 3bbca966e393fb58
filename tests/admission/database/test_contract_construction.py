"""Construction, policy bounds, purpose keys and connection setup."""

from __future__ import annotations

import os
import re

import pytest
from dbutil import count, exactly, is_postgres, request_state, table_dump
from planes import CONTENT_KEY, ENCRYPTION_KEY, PlaneFactory, admit, enqueue
from sqlalchemy import text

from admission_plane import AdmissionPlane, InvalidInputError, MissingKeyError, Policy
from admission_plane.evidence import capture

FIELDS = (
    "max_active_turns",
    "max_concurrent_starts",
    "min_start_interval_ms",
    "queue_timeout_ms",
    "capacity_cooldown_ms",
)
VALID = {
    "max_active_turns": 3,
    "max_concurrent_starts": 1,
    "min_start_interval_ms": 0,
    "queue_timeout_ms": 1_800_000,
    "capacity_cooldown_ms": 30_000,
}
NO_CONTENT_KEY = "admission event correlation requires a content fingerprint key"
NO_ENCRYPTION_KEY = "payload persistence requires an encryption key"


def policy_with(name: str, value: object) -> Policy:
    return Policy(**{**VALID, name: value})


# --- policy bounds -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["max_active_turns", "max_concurrent_starts"])
@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_seat_and_start_limits_below_one_or_fractional_are_refused(name: str, value: object) -> None:
    """A seat or start limit of 0, -1 or 1.5 is refused with `invalid admission policy <name>`."""
    with pytest.raises(InvalidInputError, match=exactly(f"invalid admission policy {name}")):
        policy_with(name, value)


@pytest.mark.parametrize(("seats", "starts"), [(9, 9), (8, 8), (2, 2), (4, 4), (5, 5), (1, 1), (2**53 - 1, 1)])
def test_any_safe_integer_of_at_least_one_is_a_valid_seat_and_start_limit(
    make_plane: PlaneFactory, seats: int, starts: int
) -> None:
    """Any safe integer of at least 1, up to 2**53 - 1, is a valid seat and start limit, and a plane opens with it."""
    policy = Policy(seats, starts, 0, 1_800_000, 30_000)
    assert make_plane(policy=policy).policy == policy


@pytest.mark.parametrize("name", ["min_start_interval_ms", "queue_timeout_ms", "capacity_cooldown_ms"])
@pytest.mark.parametrize("value", [-1, 1.5, -0.5])
def test_other_policy_fields_must_be_non_negative_integers(name: str, value: object) -> None:
    """A fractional or negative start interval, queue timeout or cooldown is refused with `invalid admission policy
    <name>`."""
    with pytest.raises(InvalidInputError, match=exactly(f"invalid admission policy {name}")):
        policy_with(name, value)


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize("value", [True, False])
def test_booleans_are_not_policy_integers(name: str, value: bool) -> None:
    """`True` and `False` are refused for every policy field although Python's bool is an int."""
    with pytest.raises(InvalidInputError, match=exactly(f"invalid admission policy {name}")):
        policy_with(name, value)


@pytest.mark.parametrize("name", FIELDS)
def test_integral_floats_are_not_policy_integers(name: str) -> None:
    """An integral float such as 3.0 is refused for every policy field, never silently truncated."""
    with pytest.raises(InvalidInputError, match=exactly(f"invalid admission policy {name}")):
        policy_with(name, float(VALID[name] or 1))


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize("value", [2**53, "3", None])
def test_unsafe_or_non_numeric_policy_values_are_refused(name: str, value: object) -> None:
    """Integers above 2**53 - 1, strings and None are refused for every policy field."""
    with pytest.raises(InvalidInputError, match=exactly(f"invalid admission policy {name}")):
        policy_with(name, value)


def test_zero_interval_and_tiny_queue_timeouts_are_legal_in_memory(make_plane: PlaneFactory) -> None:
    """A start interval of 0 and a queue timeout of 1 or 5 ms are legal for the in-memory policy."""
    for timeout in (1, 5):
        policy = Policy(3, 1, 0, timeout, 0)
        assert make_plane(policy=policy).policy.as_tuple() == (3, 1, 0, timeout, 0)


def test_plane_refuses_a_policy_that_is_not_a_policy_object(database_url: str) -> None:
    """The plane takes only a validated `Policy`, not a mapping of raw values."""
    with pytest.raises(InvalidInputError, match=exactly("policy must be an admission_plane.Policy")):
        AdmissionPlane(database_url, policy=VALID)  # type: ignore[arg-type]


# --- purpose keys ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", [b"", bytes(31), bytes(33), "x" * 32, 32])
def test_encryption_key_must_be_exactly_32_bytes(database_url: str, key: object) -> None:
    """An encryption key that is not exactly 32 bytes is refused with the original connector's message."""
    with pytest.raises(InvalidInputError, match=exactly("admission encryption key must be exactly 32 bytes")):
        AdmissionPlane(database_url, encryption_key=key)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", [b"", bytes(31), bytes(33), "x" * 32, 32])
def test_content_fingerprint_key_must_be_exactly_32_bytes(database_url: str, key: object) -> None:
    """A content fingerprint key that is not exactly 32 bytes is refused with the original connector's message."""
    with pytest.raises(InvalidInputError, match=exactly("admission content fingerprint key must be exactly 32 bytes")):
        AdmissionPlane(database_url, content_fingerprint_key=key)  # type: ignore[arg-type]


def test_caller_key_buffers_are_unchanged_after_close(make_plane: PlaneFactory) -> None:
    """The plane copies the keys, so closing it leaves the caller's key buffers intact."""
    encryption, content = bytearray(ENCRYPTION_KEY), bytearray(CONTENT_KEY)
    plane = make_plane(encryption_key=encryption, content_fingerprint_key=content)
    plane.close()
    assert encryption == ENCRYPTION_KEY
    assert content == CONTENT_KEY


def test_changing_the_caller_buffer_after_open_does_not_change_the_plane_keys(make_plane: PlaneFactory) -> None:
    """The plane keeps its own copy of the keys, so a caller zeroing its buffers after opening cannot break sealing or
    reading."""
    encryption, content = bytearray(ENCRYPTION_KEY), bytearray(CONTENT_KEY)
    plane = make_plane(encryption_key=encryption, content_fingerprint_key=content)
    encryption[:] = bytes(32)
    content[:] = bytes(32)
    enqueue(plane, "copied-keys", now=0)
    assert make_plane().read_payload("copied-keys", 1) == "prompt for copied-keys"


def test_close_zero_fills_the_internal_key_copies(make_plane: PlaneFactory) -> None:
    """Closing the plane zero-fills its own copies of the keys."""
    plane = make_plane()
    keys = (plane._ctx.keys.encryption, plane._ctx.keys.content)
    assert all(key is not None and key.material() != bytes(32) for key in keys)
    plane.close()
    assert all(key is not None and key.material() == bytes(32) for key in keys)


# --- keys are optional until needed -----------------------------------------------------------


def test_keyless_enqueue_fails_and_leaves_nothing_behind(make_plane: PlaneFactory, database_url: str) -> None:
    """Without a content key, an enqueue (which must be journalled) fails with the original connector's message and
    writes nothing."""
    plane = make_plane(encryption_key=None, content_fingerprint_key=None)
    before = table_dump(database_url)
    with pytest.raises(MissingKeyError, match=exactly(NO_CONTENT_KEY)):
        plane.enqueue(
            request_id="keyless", session_id="s", agent_id="a", fingerprint="f", provider="p", model="m", now=0
        )
    assert table_dump(database_url) == before
    assert plane.get_request("keyless") is None
    assert plane.read_sanitized_events(after_event_seq=0, limit=10) == ()


def test_keyless_payload_enqueue_names_the_missing_content_key_first(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """With no key at all, an enqueue with payload reports the missing content key, because the content is fingerprinted
    before it is sealed."""
    plane = make_plane(encryption_key=None, content_fingerprint_key=None)
    before = table_dump(database_url)
    with pytest.raises(MissingKeyError, match=exactly(NO_CONTENT_KEY)):
        enqueue(plane, "keyless", now=0)
    assert table_dump(database_url) == before


def test_keyless_admission_rolls_back_the_reservation(make_plane: PlaneFactory, database_url: str) -> None:
    """A plane without keys that would admit a request fails at the journal and leaves the request queued with no
    lease."""
    enqueue(make_plane(), "waiting", now=0)
    keyless = make_plane(encryption_key=None, content_fingerprint_key=None)
    before = table_dump(database_url)
    with pytest.raises(MissingKeyError, match=exactly(NO_CONTENT_KEY)):
        keyless.admit_next(10, "owner-keyless")
    assert table_dump(database_url) == before
    assert request_state(database_url, "waiting") == "queued"


def test_keyless_cancel_rolls_back(make_plane: PlaneFactory, database_url: str) -> None:
    """Cancelling must be journalled, so a cancel by a plane without keys fails and keeps the request and its
    payload."""
    enqueue(make_plane(), "waiting", now=0)
    keyless = make_plane(encryption_key=None, content_fingerprint_key=None)
    before = table_dump(database_url)
    with pytest.raises(MissingKeyError, match=exactly(NO_CONTENT_KEY)):
        keyless.cancel_queued("waiting", 10)
    assert table_dump(database_url) == before


def test_plane_without_encryption_key_refuses_payload_writes(make_plane: PlaneFactory, database_url: str) -> None:
    """Without an encryption key, enqueue_with_payload and persist_payload fail with the original connector's message
    and write nothing."""
    plane = make_plane(encryption_key=None)
    plane.enqueue(request_id="bare", session_id="s", agent_id="a", fingerprint="f", provider="p", model="m", now=0)
    before = table_dump(database_url)
    with pytest.raises(MissingKeyError, match=exactly(NO_ENCRYPTION_KEY)):
        enqueue(plane, "sealed", now=0)
    with pytest.raises(MissingKeyError, match=exactly(NO_ENCRYPTION_KEY)):
        plane.persist_payload("bare", "prompt", 0, 10)
    assert table_dump(database_url) == before


def test_keyless_plane_serves_the_read_only_paths(make_plane: PlaneFactory, database_url: str) -> None:
    """A plane without keys serves get_request, read_sanitized_events and an admit_next that finds no capacity, writing
    nothing."""
    keyed = make_plane()
    enqueue(keyed, "first", now=0)
    enqueue(keyed, "second", now=1)
    admit(keyed, 2)
    keyless = make_plane(encryption_key=None, content_fingerprint_key=None)
    before = table_dump(database_url)
    stored = keyless.get_request("second")
    assert stored is not None
    assert stored.state == "queued"
    assert len(keyless.read_sanitized_events(after_event_seq=0, limit=10)) == 3
    assert keyless.admit_next(3, "owner-keyless") is None  # one start in flight: no capacity
    assert table_dump(database_url) == before


# --- connection setup --------------------------------------------------------------------------


def test_connections_run_with_the_dialects_settings(plane: AdmissionPlane, database_url: str) -> None:
    """Every SQLite connection runs with foreign keys on, WAL, synchronous FULL and a 5000 ms busy timeout, and every
    PostgreSQL connection runs READ COMMITTED."""
    with plane.engine.connect() as connection:
        if is_postgres(database_url):
            assert connection.execute(text("SHOW transaction_isolation")).scalar() == "read committed"
            return
        pragmas = {
            name: connection.execute(text(f"PRAGMA {name}")).scalar()
            for name in ("foreign_keys", "journal_mode", "synchronous", "busy_timeout")
        }
    assert pragmas == {"foreign_keys": 1, "journal_mode": "wal", "synchronous": 2, "busy_timeout": 5000}


def test_plane_captures_its_own_process_identity_on_open(plane: AdmissionPlane) -> None:
    """Opening a plane captures this process's Linux identity with a random lowercase UUIDv4 owner id and a UTC creation
    time."""
    identity = plane.owner_identity
    assert re.fullmatch(
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", identity.owner_instance_id
    )
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z", identity.created_at)
    assert identity.process == capture(os.getpid())


def test_two_planes_get_different_owner_ids(make_plane: PlaneFactory, database_url: str) -> None:
    """Each plane draws a fresh random owner instance id, and opening a plane writes no row."""
    before = table_dump(database_url)
    first, second = make_plane(), make_plane()
    assert first.owner_identity.owner_instance_id != second.owner_identity.owner_instance_id
    assert table_dump(database_url) == before
    assert count(database_url, "queued_owner_instances") == 0
