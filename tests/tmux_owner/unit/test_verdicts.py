"""Terminal verdicts: classification, immutability, journal recovery and reconciliation after a crash."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from tmux_support import GENERATION, SESSION, intent_args, root_of
from tmux_support import observe_request_json as request_json

from tmux_owner import _verdicts
from tmux_owner._errors import InvalidRecordError, TmuxOwnerError
from tmux_owner._generations import replace_owner_generation
from tmux_owner._intents import create_owner_intent
from tmux_owner._verdict_records import ObserveTerminalRequest, OwnerIncident, OwnerVerdict, is_valid_owner_verdict
from tmux_owner._verdicts import observe_owner_terminal


def compact(value: Any) -> bytes:
    return (json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def make_intent(state_dir: Path, dispatch_id: str = "dispatch") -> str:
    return create_owner_intent(state_dir, **intent_args(dispatch_id=dispatch_id)).intent_id


def unexpected_verdict(**overrides: Any) -> dict[str, Any]:
    value = {
        "schema_version": 1,
        "generation": GENERATION,
        "session_id": SESSION,
        "server_key": "socket",
        "observed_at": "2026-01-01T00:00:00Z",
        "signal": "EXIT",
        "exit_code": 1,
        "result": "exit",
        "observer": "sidecar",
        "classification": "unexpected_owner_loss",
        "reason": "owner_exit",
        "dedupe_key": f"owner-loss:{SESSION}:{GENERATION}",
    }
    return value | overrides


@pytest.mark.parametrize(
    "overrides",
    [
        {"observed_at": "2026-01-01T00:00:00+01:00"},
        {"extra": "key"},
        {"operator_dispatch_id": None},
        {"exit_code": True},
        {"exit_code": 1.5},
        {"exit_kind": "x" * 65},
        {"reason": ""},
        {"observer": "unknown"},
        {"signal": "SIGUSR1"},
        {"op": "plan"},
        {"session_id": ".."},
        {"owner_generation": "a/b"},
    ],
)
def test_a_malformed_observation_is_refused_before_any_file_is_written(
    state_dir: Path, overrides: dict[str, Any]
) -> None:
    """An invalid observation raises terminal_observation_invalid before any journal or verdict is written."""
    with pytest.raises(TmuxOwnerError) as raised:
        observe_owner_terminal(request_json(state_dir, **overrides))
    assert str(raised.value) == "terminal_observation_invalid"
    assert sorted(os.listdir(root_of(state_dir))) == [
        "generation-generation.published.json",
        "generation.json",
        "owner-locks.sqlite",
    ]


def test_a_foreign_or_missing_generation_is_a_mismatch(tmp_path: Path) -> None:
    """Observing a generation that is missing or not current raises generation_mismatch and writes nothing for it."""
    with pytest.raises(TmuxOwnerError, match=r"^generation_mismatch$"):
        observe_owner_terminal(request_json(tmp_path))
    assert not (tmp_path / SESSION).exists()
    replace_owner_generation(tmp_path, SESSION, "current")
    with pytest.raises(TmuxOwnerError, match=r"^generation_mismatch$"):
        observe_owner_terminal(request_json(tmp_path, owner_generation="foreign"))
    assert not (root_of(tmp_path) / "verdict-foreign.json").exists()


def test_an_authorized_sigterm_is_an_expected_shutdown_that_consumes_the_intent(state_dir: Path) -> None:
    """An authorized SIGTERM is an expected shutdown: the verdict is published, the intent consumed, the alias written
    and the journal removed.
    """
    intent_id = make_intent(state_dir)
    verdict = observe_owner_terminal(request_json(state_dir, operator_dispatch_id="dispatch"))
    assert verdict.classification == "expected_operator_shutdown"
    assert verdict.result == "owner_term_then_session_cleanup"
    assert verdict.intent_id == intent_id
    root = root_of(state_dir)
    assert (root / "verdict-generation.json").read_bytes() == compact(verdict.to_json())
    assert (root / "intent-generation.json.consumed").exists()
    assert not (root / "intent-generation.json").exists()
    alias = json.loads((root / "verdict.json").read_text())
    assert alias == {**verdict.to_json(), "owner_generation": GENERATION}
    assert list(alias)[-1] == "owner_generation"
    assert not (root / "verdict-generation.journal").exists()
    assert not (root / "incident-generation.json").exists()


def test_the_first_verdict_wins_over_every_later_observation(state_dir: Path) -> None:
    """A later observer reporting other fields receives the first verdict, and the stored file is unchanged."""
    make_intent(state_dir)
    first = observe_owner_terminal(request_json(state_dir, operator_dispatch_id="dispatch"))
    file = root_of(state_dir) / "verdict-generation.json"
    before = file.read_bytes()
    later = observe_owner_terminal(
        request_json(state_dir, observer="raw_monitor", reason="different", signal="SIGKILL", exit_code=9)
    )
    assert later == first
    assert later.observer == "sidecar"
    assert file.read_bytes() == before


def test_observation_gives_up_while_another_connection_holds_the_lock(state_dir: Path) -> None:
    """While another connection holds the lock, observation raises verdict_lock_contended, and it succeeds once the lock
    is free.
    """
    holder = sqlite3.connect(root_of(state_dir) / "owner-locks.sqlite", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(TmuxOwnerError, match=r"^verdict_lock_contended$"):
            observe_owner_terminal(request_json(state_dir))
        assert not (root_of(state_dir) / "verdict-generation.json").exists()
    finally:
        holder.close()
    verdict = observe_owner_terminal(request_json(state_dir))
    assert verdict.classification == "unexpected_owner_loss"


def test_a_partial_persisted_verdict_conflicts_but_the_loss_is_still_recorded(state_dir: Path) -> None:
    """A partial verdict file raises immutable_record_conflict, while the unexpected loss is still recorded as an
    incident.
    """
    root = root_of(state_dir)
    partial = {"schema_version": 1, "generation": GENERATION, "session_id": SESSION, "server_key": "socket"}
    (root / "verdict-generation.json").write_text(json.dumps(partial))
    with pytest.raises(TmuxOwnerError, match=r"^immutable_record_conflict$"):
        observe_owner_terminal(request_json(state_dir, exit_kind="owner_lost"))
    assert (root / "incident-generation.json").exists()
    assert (root / "verdict-generation.journal").exists()
    assert json.loads((root / "verdict-generation.json").read_text()) == partial


@pytest.mark.parametrize("content", ["{broken", "[]", "null"])
def test_a_verdict_file_that_is_not_an_object_is_corrupt(state_dir: Path, content: str) -> None:
    """A verdict file that is invalid JSON or not an object raises immutable_record_corrupt, and the incident is still
    written.
    """
    (root_of(state_dir) / "verdict-generation.json").write_text(content)
    with pytest.raises(TmuxOwnerError, match=r"^immutable_record_corrupt$"):
        observe_owner_terminal(request_json(state_dir))
    assert (root_of(state_dir) / "incident-generation.json").exists()


def test_a_symlinked_verdict_file_is_never_followed(state_dir: Path, tmp_path: Path) -> None:
    """Beyond the seed, a symlink at verdict-<G>.json reads as corrupt even when it points at a valid verdict."""
    target = tmp_path / "planted.json"
    target.write_text(json.dumps(unexpected_verdict()))
    (root_of(state_dir) / "verdict-generation.json").symlink_to(target)
    with pytest.raises(TmuxOwnerError, match=r"^immutable_record_corrupt$"):
        observe_owner_terminal(request_json(state_dir))


def test_an_unexpected_loss_publishes_an_incident_dated_at_the_observation(state_dir: Path) -> None:
    """Without an intent, an exit is an unexpected loss with an incident dated at the observation and an alias."""
    verdict = observe_owner_terminal(request_json(state_dir, signal="EXIT", exit_code=3))
    assert (verdict.classification, verdict.result, verdict.intent_id) == ("unexpected_owner_loss", "exit", None)
    root = root_of(state_dir)
    incident = {
        "schema_version": 1,
        "generation": GENERATION,
        "session_id": SESSION,
        "dedupe_key": "owner-loss:session:generation",
        "created_at": "2026-01-01T00:00:01.000Z",
        "classification": "unexpected_owner_loss",
    }
    assert (root / "incident-generation.json").read_bytes() == compact(incident)
    assert json.loads((root / "verdict.json").read_text())["owner_generation"] == GENERATION


def test_a_cleanup_without_intent_is_a_non_operator_cleanup(state_dir: Path) -> None:
    """Exit kind cleanup without an intent is a non_operator_cleanup with result cleanup and no incident."""
    verdict = observe_owner_terminal(request_json(state_dir, exit_kind="cleanup", signal="EXIT"))
    assert (verdict.classification, verdict.result) == ("non_operator_cleanup", "cleanup")
    assert not (root_of(state_dir) / "incident-generation.json").exists()


def test_an_unknown_exit_kind_is_expected_with_an_intent_and_unknown_without(tmp_path: Path) -> None:
    """An unknown exit kind still matches an intent as an expected shutdown, and without one it is stored as
    unknown_terminal.
    """
    replace_owner_generation(tmp_path, SESSION, GENERATION)
    make_intent(tmp_path)
    expected = observe_owner_terminal(request_json(tmp_path, exit_kind="sigterm", operator_dispatch_id="dispatch"))
    assert (expected.classification, expected.result) == (
        "expected_operator_shutdown",
        "owner_term_then_session_cleanup",
    )
    other = tmp_path / "other"
    replace_owner_generation(other, SESSION, GENERATION)
    unexpected = observe_owner_terminal(request_json(other, exit_kind="sigterm"))
    assert (unexpected.classification, unexpected.result) == ("unexpected_owner_loss", "unknown_terminal")


@pytest.mark.parametrize("reason", ["different", "terminal", "x"])
def test_unknown_reasons_are_stored_as_terminal_observation(state_dir: Path, reason: str) -> None:
    """A reason outside the allowed set is stored as terminal_observation."""
    assert observe_owner_terminal(request_json(state_dir, reason=reason)).reason == "terminal_observation"


def test_a_journaled_observation_is_recovered_after_a_crash(state_dir: Path) -> None:
    """After a crash the verdict is built from the journaled observation, not from the new one, and the journal is
    removed.
    """
    root = root_of(state_dir)
    observation_a = request_json(
        state_dir, observer="raw_monitor", observed_at="2026-01-01T00:00:00Z", exit_kind="owner_lost"
    )
    (root / "verdict-generation.journal").write_text(
        json.dumps({"schema_version": 1, "observation": observation_a, "token": "dead-process"})
    )
    verdict = observe_owner_terminal(request_json(state_dir, observed_at="2026-01-01T00:09:00Z", exit_kind="exit"))
    assert (verdict.observer, verdict.observed_at, verdict.result) == (
        "raw_monitor",
        "2026-01-01T00:00:00Z",
        "owner_lost",
    )
    assert not (root / "verdict-generation.journal").exists()
    incident = json.loads((root / "incident-generation.json").read_text())
    assert incident["created_at"] == "2026-01-01T00:00:00Z"


@pytest.mark.parametrize(
    "journal",
    [
        {"schema_version": 1, "observation": {"socket_key": "other-socket"}},
        {"schema_version": 1, "observation": {"state_dir": "/elsewhere"}},
        {"schema_version": 2, "observation": {}},
        {"schema_version": True, "observation": {}},
        {"schema_version": 1, "observation": {"unexpected": "key"}},
        "not json",
    ],
)
def test_a_journal_for_another_owner_or_malformed_is_ignored(state_dir: Path, journal: Any) -> None:
    """A journal for another owner, with a wrong schema, invalid or unparsable is ignored in favour of the new
    observation.
    """
    root = root_of(state_dir)
    if isinstance(journal, dict):
        observation = request_json(state_dir, observer="raw_monitor", observed_at="2026-01-01T00:00:00Z")
        observation |= journal["observation"]
        content = json.dumps({"schema_version": journal["schema_version"], "observation": observation})
    else:
        content = journal
    (root / "verdict-generation.journal").write_text(content)
    verdict = observe_owner_terminal(request_json(state_dir))
    assert (verdict.observer, verdict.observed_at) == ("sidecar", "2026-01-01T00:00:01.000Z")


def test_a_crash_after_the_verdict_is_reconciled_by_the_next_observer(state_dir: Path) -> None:
    """A stored expected verdict whose intent is still pending is reconciled by the next observer: intent consumed,
    alias written.
    """
    intent_id = make_intent(state_dir)
    root = root_of(state_dir)
    stored = unexpected_verdict(
        classification="expected_operator_shutdown",
        signal="SIGTERM",
        result="owner_term_then_session_cleanup",
        intent_id=intent_id,
        exit_code=None,
    )
    stored = {key: stored[key] for key in [*list(stored)[:-1], "intent_id", "dedupe_key"]}
    (root / "verdict-generation.json").write_bytes(compact(stored))
    (root / "verdict-generation.journal").write_text("{}")
    verdict = observe_owner_terminal(request_json(state_dir, signal="EXIT"))
    assert verdict.to_json() == stored
    assert (root / "intent-generation.json.consumed").exists()
    assert json.loads((root / "verdict.json").read_text()) == {**stored, "owner_generation": GENERATION}
    assert not (root / "verdict-generation.journal").exists()


def test_a_conflicting_incident_is_reported_after_the_verdict_is_published(state_dir: Path) -> None:
    """A conflicting incident raises immutable_record_conflict after the verdict is published, leaving no alias and the
    journal in place.
    """
    root = root_of(state_dir)
    (root / "incident-generation.json").write_text(json.dumps({"schema_version": 1, "other": True}))
    with pytest.raises(TmuxOwnerError, match=r"^immutable_record_conflict$"):
        observe_owner_terminal(request_json(state_dir))
    assert is_valid_owner_verdict(json.loads((root / "verdict-generation.json").read_text()))
    assert not (root / "verdict.json").exists()
    assert (root / "verdict-generation.journal").exists()


def test_identical_incident_republication_is_a_no_op(state_dir: Path) -> None:
    """Publishing an incident identical to the one already on disk is accepted as a no-op."""
    root = root_of(state_dir)
    incident = OwnerIncident(
        generation=GENERATION,
        session_id=SESSION,
        dedupe_key="owner-loss:session:generation",
        created_at="2026-01-01T00:00:01.000Z",
    )
    (root / "incident-generation.json").write_bytes(compact(incident.to_json()))
    assert observe_owner_terminal(request_json(state_dir)).classification == "unexpected_owner_loss"
    assert OwnerIncident.from_json(json.loads((root / "incident-generation.json").read_text())) == incident


def test_a_generation_replaced_before_the_alias_leaves_the_verdict_without_alias(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generation replaced before the alias is written raises generation_mismatch, and the verdict stays without
    alias.
    """
    real_publish_incident = _verdicts._publish_incident

    def publish_then_replace(paths: Any, incident: OwnerIncident) -> None:
        real_publish_incident(paths, incident)
        # Write the pointer directly: the publisher would wait on the verdict lock this thread holds.
        (root_of(state_dir) / "generation.json").write_text(
            json.dumps(
                {
                    "schema_version": 1,
                    "generation": "next",
                    "session_id": SESSION,
                    "published_at": "2026-01-01T00:00:00Z",
                }
            )
        )

    monkeypatch.setattr(_verdicts, "_publish_incident", publish_then_replace)
    with pytest.raises(TmuxOwnerError, match=r"^generation_mismatch$"):
        observe_owner_terminal(request_json(state_dir))
    assert (root_of(state_dir) / "verdict-generation.json").exists()
    assert not (root_of(state_dir) / "verdict.json").exists()


def test_an_unexpected_verdict_leaves_the_intent_pending_and_blocks_a_later_close(state_dir: Path) -> None:
    """An unexpected SIGHUP verdict leaves the intent pending, so a new intent for the generation is still a replay."""
    make_intent(state_dir)
    verdict = observe_owner_terminal(request_json(state_dir, signal="SIGHUP", operator_dispatch_id="dispatch"))
    assert (verdict.classification, verdict.intent_id) == ("unexpected_owner_loss", None)
    assert (root_of(state_dir) / "intent-generation.json").exists()
    with pytest.raises(TmuxOwnerError, match=r"^owner_intent_replay$"):
        make_intent(state_dir, dispatch_id="another")


def test_a_dispatch_mismatch_is_an_unexpected_loss(state_dir: Path) -> None:
    """A SIGTERM presenting another dispatch id than the intent's is an unexpected loss."""
    make_intent(state_dir)
    verdict = observe_owner_terminal(request_json(state_dir, operator_dispatch_id="someone-else"))
    assert verdict.classification == "unexpected_owner_loss"


@pytest.mark.parametrize(
    "overrides",
    [
        {"schema_version": 2},
        {"schema_version": True},
        {"observer": "unknown"},
        {"observed_at": "not-a-timestamp"},
        {"observed_at": "2026-01-01T00:00:00+01:00"},
        {"observed_at": "2026-01-01 00:00:00Z"},
        {"observed_at": "2026-02-29T00:00:00Z"},
        {"observed_at": "2026-01-01T24:00:00Z"},
        {"observed_at": "2026-01-01T00:00:00.1Z"},
        {"dedupe_key": "wrong"},
        {"unexpected": "key"},
        {"signal": "SIGUSR1"},
        {"exit_code": True},
        {"exit_code": "1"},
        {"result": "x" * 65},
        {"result": "owner_term_then_session_cleanup"},
        {"reason": "different"},
        {"intent_id": "i"},
        {"intent_id": None},
        {"classification": "non_operator_cleanup"},
        {"classification": "expected_operator_shutdown"},
        {"generation": ""},
    ],
)
def test_malformed_persisted_verdicts_are_rejected(overrides: dict[str, Any]) -> None:
    """A persisted verdict with a wrong or extra field, or inconsistent classification, result or intent, is invalid."""
    value = unexpected_verdict(**overrides)
    assert not is_valid_owner_verdict(value)
    with pytest.raises(InvalidRecordError):
        OwnerVerdict.from_json(value)


def test_consistent_persisted_verdicts_are_accepted() -> None:
    """Each classification with its consistent result and intent is a valid verdict, for its own owner only."""
    assert is_valid_owner_verdict(unexpected_verdict())
    assert is_valid_owner_verdict(unexpected_verdict(result="unknown_terminal"))
    assert is_valid_owner_verdict(
        unexpected_verdict(exit_code=None, classification="non_operator_cleanup", result="cleanup")
    )
    expected = unexpected_verdict(
        classification="expected_operator_shutdown",
        signal="SIGTERM",
        result="owner_term_then_session_cleanup",
        intent_id="intent",
    )
    assert is_valid_owner_verdict(expected)
    assert OwnerVerdict.from_json(expected).intent_id == "intent"
    request = ObserveTerminalRequest.from_json(request_json(Path("/s")))
    assert is_valid_owner_verdict(expected, request)
    assert not is_valid_owner_verdict(unexpected_verdict(server_key="other"), request)


@pytest.mark.parametrize(
    ("moved_to", "outcome"), [(".consumed", "ok"), (".cancelled", "owner_intent_consumption_failed")]
)
def test_an_intent_gone_before_consumption_is_accepted_only_if_already_consumed(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch, moved_to: str, outcome: str
) -> None:
    """When the intent is renamed away before consumption, observation succeeds only if it was already consumed."""
    make_intent(state_dir)
    root = root_of(state_dir)
    real_build = _verdicts._build_verdict

    def build_then_move_intent(observation: Any, intent: Any) -> OwnerVerdict:
        # Another actor renames the intent after it was read, before this observer consumes it.
        os.rename(root / "intent-generation.json", root / f"intent-generation.json{moved_to}")
        return real_build(observation, intent)

    monkeypatch.setattr(_verdicts, "_build_verdict", build_then_move_intent)
    request = request_json(state_dir, operator_dispatch_id="dispatch")
    if outcome == "ok":
        assert observe_owner_terminal(request).classification == "expected_operator_shutdown"
        assert (root / "verdict.json").exists()
    else:
        with pytest.raises(TmuxOwnerError, match=rf"^{outcome}$"):
            observe_owner_terminal(request)
        assert (root / "verdict-generation.json").exists()
        assert not (root / "verdict.json").exists()
