"""SIGTERM intents: creation, the one-intent-per-generation rule, and which observation an intent authorizes."""

from __future__ import annotations

import json
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
from tmux_support import GENERATION, SESSION, intent_args, root_of

from tmux_owner._errors import InvalidRecordError, TmuxOwnerError
from tmux_owner._intents import OwnerIntent, create_owner_intent
from tmux_owner._timestamps import parse_timestamp_ms
from tmux_owner._verdict_records import ObserveTerminalRequest, is_valid_owner_intent


def observation(state_dir: Path, **overrides: Any) -> ObserveTerminalRequest:
    fields: dict[str, Any] = {
        "session_id": SESSION,
        "owner_generation": GENERATION,
        "state_dir": str(state_dir),
        "socket_key": "socket",
        "observer": "sidecar",
        "observed_at": "2026-01-01T00:00:01.000Z",
        "signal": "SIGTERM",
        "exit_code": None,
        "exit_kind": "exit",
        "reason": "owner_exit",
        "operator_dispatch_id": "dispatch",
    }
    return ObserveTerminalRequest(**(fields | overrides))


def test_an_intent_created_after_it_expires_is_invalid_and_nothing_is_written(tmp_path: Path) -> None:
    """An intent created after it expires raises owner_intent_invalid and writes nothing."""
    with pytest.raises(TmuxOwnerError) as raised:
        create_owner_intent(
            tmp_path, **intent_args(created_at="2026-01-01T00:01:00Z", expires_at="2026-01-01T00:00:00Z")
        )
    assert str(raised.value) == "owner_intent_invalid"
    assert not (root_of(tmp_path) / "intent-generation.json").exists()


def test_an_intent_may_expire_at_the_instant_it_is_created(tmp_path: Path) -> None:
    """An intent may expire at the very instant it is created."""
    intent = create_owner_intent(tmp_path, **intent_args(expires_at="2026-01-01T00:00:00.000Z"))
    assert intent.created_at == intent.expires_at


def test_creation_does_not_compare_the_intent_with_the_clock(tmp_path: Path) -> None:
    """Creating an intent does not compare it with the clock, so one wholly in the past is still created."""
    intent = create_owner_intent(
        tmp_path, **intent_args(created_at="2019-01-01T00:00:00Z", expires_at="2020-01-01T00:00:00Z")
    )
    assert (root_of(tmp_path) / "intent-generation.json").exists()
    assert intent.state == "pending"


@pytest.mark.parametrize("suffix", ["", ".consumed", ".cancelled", ".expired", ".invalidated"])
def test_any_earlier_intent_of_the_generation_blocks_a_new_one(tmp_path: Path, suffix: str) -> None:
    """An intent file of the generation in any state, pending or retired, makes a new intent owner_intent_replay."""
    root = root_of(tmp_path)
    root.mkdir(parents=True)
    (root / f"intent-generation.json{suffix}").write_text("{}\n")
    with pytest.raises(TmuxOwnerError) as raised:
        create_owner_intent(tmp_path, **intent_args())
    assert str(raised.value) == "owner_intent_replay"


def test_a_second_intent_for_the_same_generation_is_a_replay(tmp_path: Path) -> None:
    """A second intent for the same generation is owner_intent_replay even for another dispatch."""
    create_owner_intent(tmp_path, **intent_args())
    with pytest.raises(TmuxOwnerError, match=r"^owner_intent_replay$"):
        create_owner_intent(tmp_path, **intent_args(dispatch_id="other"))


def test_a_created_intent_is_a_private_compact_pending_record(tmp_path: Path) -> None:
    """A created intent is one compact JSON line in a new 0700 directory, mode 0600, pending, with a fresh UUID as its
    id.
    """
    intent = create_owner_intent(tmp_path, **intent_args())
    file = root_of(tmp_path) / "intent-generation.json"
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert stat.S_IMODE(root_of(tmp_path).stat().st_mode) == 0o700
    assert str(uuid.UUID(intent.intent_id)) == intent.intent_id
    expected = {
        "schema_version": 1,
        "intent_id": intent.intent_id,
        "state": "pending",
        "generation": GENERATION,
        "session_id": SESSION,
        "server_key": "socket",
        "expected_terminal": {"signal": "SIGTERM", "result": "owner_term_then_session_cleanup"},
        "dispatch_id": "dispatch",
        "created_at": "2026-01-01T00:00:00.000Z",
        "expires_at": "2026-01-01T00:01:00.000Z",
    }
    assert file.read_bytes() == (json.dumps(expected, separators=(",", ":")) + "\n").encode()
    assert OwnerIntent.from_json(json.loads(file.read_text())) == intent


@pytest.mark.parametrize("generation", ["", ".", "..", "a/b", "x\0y"])
def test_intents_refuse_generations_that_are_unsafe_path_components(tmp_path: Path, generation: str) -> None:
    """Beyond the seed, an intent for a generation that is an unsafe path component is invalid and writes nothing."""
    with pytest.raises(TmuxOwnerError, match=r"^owner_intent_invalid$"):
        create_owner_intent(tmp_path, **intent_args(generation=generation))
    assert not (tmp_path / SESSION).exists()


def test_an_intent_authorizes_only_the_matching_sigterm_observation(tmp_path: Path) -> None:
    """An intent authorizes only a SIGTERM observation of its owner and server that presents its dispatch id within
    created <= observed < expires.
    """
    intent = create_owner_intent(tmp_path, **intent_args()).to_json()
    assert is_valid_owner_intent(intent)
    assert is_valid_owner_intent(intent, observation(tmp_path))
    assert is_valid_owner_intent(intent, observation(tmp_path, observed_at="2026-01-01T00:00:00Z"))
    refused = [
        observation(tmp_path, signal="SIGHUP"),
        observation(tmp_path, signal="SIGINT"),
        observation(tmp_path, signal="EXIT"),
        observation(tmp_path, operator_dispatch_id="another"),
        observation(tmp_path, operator_dispatch_id=None),
        observation(tmp_path, observed_at="2026-01-01T00:01:00.000Z"),
        observation(tmp_path, observed_at="2025-12-31T23:59:59.999Z"),
        observation(tmp_path, socket_key="other-socket"),
        observation(tmp_path, owner_generation="other"),
        observation(tmp_path, session_id="other"),
    ]
    for request in refused:
        assert not is_valid_owner_intent(intent, request)


def test_intent_records_reject_every_shape_the_seed_rejects() -> None:
    """An intent record needs exactly its keys, schema 1 (never true), the pending state, the fixed expected terminal
    and ordered times.
    """
    good = OwnerIntent(intent_id="i", **intent_args()).to_json()
    assert is_valid_owner_intent(good)
    bad_values = [
        {**good, "extra": 1},
        {key: value for key, value in good.items() if key != "dispatch_id"},
        {**good, "schema_version": True},
        {**good, "schema_version": 2},
        {**good, "state": "consumed"},
        {**good, "intent_id": ""},
        {**good, "expected_terminal": {"signal": "SIGKILL", "result": "owner_term_then_session_cleanup"}},
        {**good, "expected_terminal": {"signal": "SIGTERM", "result": "owner_term_then_session_cleanup", "x": 1}},
        {**good, "created_at": "not-a-date"},
        {**good, "created_at": "2026-01-01T00:02:00Z"},
        "intent",
    ]
    for value in bad_values:
        assert not is_valid_owner_intent(value)
        with pytest.raises(InvalidRecordError):
            OwnerIntent.from_json(value)


def test_intent_timestamps_are_parsed_as_iso_instants() -> None:
    """Intent timestamps parse in every canonical, date-only and offset form, and anything else parses to None."""
    assert parse_timestamp_ms("1970-01-01T00:00:00Z") == 0
    assert parse_timestamp_ms("1970-01-01T00:00:00.5Z") == 500
    assert parse_timestamp_ms("2026-01-01") == parse_timestamp_ms("2026-01-01T00:00:00.000Z")
    assert parse_timestamp_ms("2026-01-01T01:00+01:00") == parse_timestamp_ms("2026-01-01T00:00:00Z")
    assert parse_timestamp_ms("0000-02-29T00:00:00Z") is not None
    for unparseable in ["", "not-a-timestamp", "2026-13-01", "2026-01-01T00:00:00", 1767225600000, None]:
        assert parse_timestamp_ms(unparseable) is None
