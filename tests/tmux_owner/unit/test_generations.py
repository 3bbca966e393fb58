"""Owner generations: baseline capture, compare-and-set publication and the immutable per-generation markers."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
import uuid
from pathlib import Path

import pytest
from tmux_support import SESSION, intent_args, root_of

from tmux_owner import _generations
from tmux_owner._errors import InvalidRecordError, TmuxOwnerError
from tmux_owner._files import lifecycle_paths
from tmux_owner._generations import (
    GenerationRecord,
    OwnerGenerationBaseline,
    PublishGenerationRequest,
    PublishGenerationResult,
    capture_owner_generation_baseline,
    is_owner_generation_baseline_current,
    publish_owner_generation,
    replace_owner_generation,
    same_owner_generation_baseline,
)
from tmux_owner._intents import create_owner_intent


def write_generation(state_dir: Path, content: str) -> Path:
    root = root_of(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    file = root / "generation.json"
    file.write_text(content)
    return file


def publish(state_dir: Path, generation: str, baseline: OwnerGenerationBaseline) -> str:
    request = PublishGenerationRequest(
        session_id=SESSION, owner_generation=generation, state_dir=str(state_dir), baseline=baseline
    )
    return publish_owner_generation(request).generation


def test_capture_reports_absent_when_no_generation_was_published(tmp_path: Path) -> None:
    """Without generation.json the captured baseline is absent."""
    assert capture_owner_generation_baseline(tmp_path, SESSION) == OwnerGenerationBaseline.absent()
    assert capture_owner_generation_baseline(tmp_path, SESSION).to_json() == {"state": "absent"}


VALID = {"schema_version": 1, "generation": "g", "session_id": SESSION, "published_at": "2026-01-01T00:00:00.000Z"}


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({**VALID, "extra": 1}),
        json.dumps({key: value for key, value in VALID.items() if key != "published_at"}),
        json.dumps({"schema_version": 1, "generation": "newer"}),
        json.dumps({**VALID, "schema_version": 2}),
        json.dumps({**VALID, "schema_version": True}),
        json.dumps({**VALID, "session_id": "other"}),
        json.dumps({**VALID, "generation": ""}),
        json.dumps({**VALID, "published_at": "2026-01-01T00:00:00+00:00"}),
        "{not json",
        "[1]",
        "",
    ],
)
def test_capture_raises_corrupt_for_anything_but_this_sessions_exact_record(tmp_path: Path, content: str) -> None:
    """A generation.json that is not exactly this session's four-key record raises baseline_generation_corrupt and is
    never current.
    """
    write_generation(tmp_path, content)
    with pytest.raises(TmuxOwnerError) as raised:
        capture_owner_generation_baseline(tmp_path, SESSION)
    assert str(raised.value) == "baseline_generation_corrupt"
    assert not is_owner_generation_baseline_current(tmp_path, SESSION, OwnerGenerationBaseline.absent())


def test_a_symlinked_generation_file_reads_as_corrupt(tmp_path: Path) -> None:
    """Beyond the seed, a symlinked generation.json is never followed, even to a valid record, and reads as corrupt."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(VALID))
    root = root_of(tmp_path)
    root.mkdir(parents=True)
    (root / "generation.json").symlink_to(elsewhere)
    with pytest.raises(TmuxOwnerError, match=r"^baseline_generation_corrupt$"):
        capture_owner_generation_baseline(tmp_path, SESSION)
    with pytest.raises(TmuxOwnerError, match=r"^baseline_generation_corrupt$"):
        replace_owner_generation(tmp_path, SESSION, "next")
    with pytest.raises(TmuxOwnerError, match=r"^baseline_generation_changed$"):
        publish(tmp_path, "next", OwnerGenerationBaseline.current(GenerationRecord(**VALID)))


def test_publication_chain_moves_the_pointer_and_leaves_a_marker_per_generation(tmp_path: Path) -> None:
    """Publishing absent -> first -> newer moves the pointer, leaves both markers, 0600 files and a 0700 directory."""
    assert publish(tmp_path, "first", OwnerGenerationBaseline.absent()) == "first"
    first = capture_owner_generation_baseline(tmp_path, SESSION)
    assert publish(tmp_path, "newer", first) == "newer"
    current = capture_owner_generation_baseline(tmp_path, SESSION)
    assert current.state == "current"
    assert (current.generation, current.session_id, current.record.schema_version) == ("newer", SESSION, 1)
    root = root_of(tmp_path)
    assert (root / "generation-first.published.json").exists()
    assert (root / "generation-newer.published.json").exists()
    pointer = (root / "generation.json").read_bytes()
    assert pointer == (json.dumps(current.record.to_json(), separators=(",", ":")) + "\n").encode()
    assert stat.S_IMODE((root / "generation.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((root / "generation-newer.published.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert not [name for name in os.listdir(root) if name.endswith(".tmp")]


@pytest.mark.parametrize("generation", ["first", "newer"])
def test_republishing_an_old_or_current_generation_is_a_replay(tmp_path: Path, generation: str) -> None:
    """A generation whose marker exists is never published again (generation_replay), and the pointer stays."""
    publish(tmp_path, "first", OwnerGenerationBaseline.absent())
    publish(tmp_path, "newer", capture_owner_generation_baseline(tmp_path, SESSION))
    before = (root_of(tmp_path) / "generation.json").read_bytes()
    with pytest.raises(TmuxOwnerError) as raised:
        publish(tmp_path, generation, capture_owner_generation_baseline(tmp_path, SESSION))
    assert str(raised.value) == "generation_replay"
    assert (root_of(tmp_path) / "generation.json").read_bytes() == before


def test_a_stale_baseline_loses_the_compare_and_set_with_each_publishers_spelling(tmp_path: Path) -> None:
    """A stale baseline loses the compare-and-set as baseline_generation_changed when published and
    generation_baseline_changed when replaced.
    """
    publish(tmp_path, "first", OwnerGenerationBaseline.absent())
    outdated = capture_owner_generation_baseline(tmp_path, SESSION)
    publish(tmp_path, "newer", outdated)
    with pytest.raises(TmuxOwnerError, match=r"^baseline_generation_changed$"):
        publish(tmp_path, "stale", outdated)
    with pytest.raises(TmuxOwnerError, match=r"^generation_baseline_changed$"):
        replace_owner_generation(tmp_path, SESSION, "stale", outdated)
    assert not (root_of(tmp_path) / "generation-stale.published.json").exists()


def test_a_rewritten_publication_time_makes_the_old_baseline_stale(tmp_path: Path) -> None:
    """The same generation with another published_at is a different baseline, so the old one is stale."""
    publish(tmp_path, "first", OwnerGenerationBaseline.absent())
    old = capture_owner_generation_baseline(tmp_path, SESSION)
    write_generation(tmp_path, json.dumps({**old.record.to_json(), "published_at": "2030-01-01T00:00:00.000Z"}))
    assert not is_owner_generation_baseline_current(tmp_path, SESSION, old)
    with pytest.raises(TmuxOwnerError, match=r"^baseline_generation_changed$"):
        publish(tmp_path, "second", old)


def test_replace_without_arguments_publishes_a_fresh_uuid_unconditionally(tmp_path: Path) -> None:
    """Replacing without a generation publishes a random UUID, and without an expected baseline it skips the
    compare-and-set.
    """
    publish(tmp_path, "first", OwnerGenerationBaseline.absent())
    generation = replace_owner_generation(tmp_path, SESSION)
    assert str(uuid.UUID(generation)) == generation
    assert capture_owner_generation_baseline(tmp_path, SESSION).generation == generation


def test_concurrent_unconditional_replacements_all_succeed_serialised_by_sqlite(tmp_path: Path) -> None:
    """Racing unconditional replacements all publish, serialised by owner-locks.sqlite alone."""
    barrier = threading.Barrier(6)
    published: list[str] = []
    errors: list[BaseException] = []

    def replace(index: int) -> None:
        barrier.wait()
        try:
            published.append(replace_owner_generation(tmp_path, SESSION, f"g{index}"))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=replace, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(published) == [f"g{index}" for index in range(6)]
    names = os.listdir(root_of(tmp_path))
    assert sorted(name for name in names if name.endswith(".published.json")) == [
        f"generation-g{index}.published.json" for index in range(6)
    ]
    assert "generation.lock" not in names
    assert "owner-locks.sqlite" in names
    assert capture_owner_generation_baseline(tmp_path, SESSION).generation in published


def test_publication_gives_up_when_another_connection_holds_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the SQLite generation lock within the wait, publication raises generation_lock_contended and writes
    nothing.
    """
    monkeypatch.setattr(_generations, "GENERATION_LOCK_WAIT_MS", 100)
    root = root_of(tmp_path)
    root.mkdir(parents=True)
    holder = sqlite3.connect(root / "owner-locks.sqlite", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(TmuxOwnerError, match=r"^generation_lock_contended$"):
            publish(tmp_path, "first", OwnerGenerationBaseline.absent())
        assert not (root / "generation-first.published.json").exists()
    finally:
        holder.close()
    assert publish(tmp_path, "first", OwnerGenerationBaseline.absent()) == "first"


def test_a_failed_publication_releases_the_lock(tmp_path: Path) -> None:
    """After a refused publication the lock is free again and no temporary file is left behind."""
    publish(tmp_path, "first", OwnerGenerationBaseline.absent())
    with pytest.raises(TmuxOwnerError):
        publish(tmp_path, "first", capture_owner_generation_baseline(tmp_path, SESSION))
    holder = sqlite3.connect(root_of(tmp_path) / "owner-locks.sqlite", isolation_level=None, timeout=0)
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("COMMIT")
    finally:
        holder.close()
    assert not [name for name in os.listdir(root_of(tmp_path)) if name.endswith(".tmp")]


def test_publication_restores_the_previous_marker_and_refuses_a_forged_one(tmp_path: Path) -> None:
    """Publication recreates a missing marker of the previous generation; a marker with other content is a replay."""
    publish(tmp_path, "first", OwnerGenerationBaseline.absent())
    root = root_of(tmp_path)
    marker = root / "generation-first.published.json"
    original = marker.read_bytes()
    marker.unlink()
    publish(tmp_path, "second", capture_owner_generation_baseline(tmp_path, SESSION))
    assert marker.read_bytes() == original
    second_marker = root / "generation-second.published.json"
    second_marker.unlink()
    second_marker.write_text(
        json.dumps({**json.loads(original), "generation": "second", "published_at": "2020-01-01T00:00:00Z"})
    )
    with pytest.raises(TmuxOwnerError, match=r"^generation_replay$"):
        publish(tmp_path, "third", capture_owner_generation_baseline(tmp_path, SESSION))
    # The new marker is written before the previous one is checked, so the id is spent anyway.
    assert (root / "generation-third.published.json").exists()
    assert capture_owner_generation_baseline(tmp_path, SESSION).generation == "second"


def test_publishing_a_new_generation_invalidates_the_old_pending_intent(tmp_path: Path) -> None:
    """Publishing a new generation renames the previous generation's pending intent to .invalidated."""
    publish(tmp_path, "old", OwnerGenerationBaseline.absent())
    create_owner_intent(tmp_path, **intent_args(generation="old"))
    publish(tmp_path, "new", capture_owner_generation_baseline(tmp_path, SESSION))
    root = root_of(tmp_path)
    assert not (root / "intent-old.json").exists()
    assert (root / "intent-old.json.invalidated").exists()


def test_marker_names_use_uri_component_encoding(tmp_path: Path) -> None:
    """Marker names encode the generation like encodeURIComponent, while every other file name uses it raw."""
    replace_owner_generation(tmp_path, SESSION, "a!b*'()")
    replace_owner_generation(tmp_path, SESSION, "g 1")
    names = os.listdir(root_of(tmp_path))
    assert "generation-a!b*'().published.json" in names
    assert "generation-g%201.published.json" in names
    paths = lifecycle_paths("/s", "sess", "g 1")
    assert paths.intent_file == Path("/s/sess/owner-lifecycle/intent-g 1.json")


@pytest.mark.parametrize("generation", ["", ".", "..", "a/b", "x\0y"])
def test_unsafe_generations_are_refused_before_anything_is_written(tmp_path: Path, generation: str) -> None:
    """Beyond the seed, a generation that would be a dangerous path component is refused before anything is written."""
    with pytest.raises(TmuxOwnerError):
        replace_owner_generation(tmp_path, SESSION, generation)
    with pytest.raises(InvalidRecordError):
        PublishGenerationRequest.from_json(
            {
                "schema_version": 1,
                "op": "publish_generation",
                "session_id": SESSION,
                "owner_generation": generation,
                "state_dir": str(tmp_path),
                "baseline": {"state": "absent"},
            }
        )
    assert not (tmp_path / SESSION).exists()


@pytest.mark.parametrize("session_id", ["", ".", "..", "a/b", "x\0y"])
def test_unsafe_session_ids_are_refused(tmp_path: Path, session_id: str) -> None:
    """Beyond the seed, a session id that would be a dangerous path component is refused before anything is written."""
    with pytest.raises(TmuxOwnerError):
        capture_owner_generation_baseline(tmp_path, session_id)
    with pytest.raises(TmuxOwnerError):
        replace_owner_generation(tmp_path, session_id, "g")
    assert os.listdir(tmp_path) == []


def test_baseline_round_trips_and_rejects_every_other_shape() -> None:
    """A baseline is exactly {"state":"absent"}, or "current" with exactly the four record keys and a canonical time."""
    current = {"state": "current", **VALID}
    assert OwnerGenerationBaseline.from_json(current).to_json() == current
    assert list(OwnerGenerationBaseline.from_json(current).to_json()) == [
        "state",
        "schema_version",
        "generation",
        "session_id",
        "published_at",
    ]
    assert OwnerGenerationBaseline.from_json({"state": "absent"}) == OwnerGenerationBaseline.absent()
    for bad in [
        {"state": "absent", "generation": "g"},
        {"state": "current"},
        {**current, "extra": 1},
        {**current, "published_at": "2026-01-01 00:00:00Z"},
        {**current, "schema_version": True},
        {**current, "generation": ""},
        {**current, "state": "absent"},
        ["state", "absent"],
        None,
    ]:
        with pytest.raises(InvalidRecordError):
            OwnerGenerationBaseline.from_json(bad)


def test_baselines_are_the_same_only_when_every_field_matches() -> None:
    """Two baselines are the same only when their state and all four record fields match."""
    record = GenerationRecord(**VALID)
    same = OwnerGenerationBaseline.current(GenerationRecord(**VALID))
    assert same_owner_generation_baseline(OwnerGenerationBaseline.current(record), same)
    assert same_owner_generation_baseline(OwnerGenerationBaseline.absent(), OwnerGenerationBaseline.absent())
    assert not same_owner_generation_baseline(OwnerGenerationBaseline.absent(), same)
    other = GenerationRecord(**{**VALID, "published_at": "2026-01-01T00:00:00Z"})
    assert not same_owner_generation_baseline(same, OwnerGenerationBaseline.current(other))


def test_publish_request_and_result_follow_the_protocol_shape(tmp_path: Path) -> None:
    """A publish request parses from its exact JSON, publishes once with generation_published, and any other shape is
    refused.
    """
    value = {
        "schema_version": 1,
        "op": "publish_generation",
        "session_id": SESSION,
        "owner_generation": "first",
        "state_dir": str(tmp_path),
        "baseline": {"state": "absent"},
    }
    request = PublishGenerationRequest.from_json(value)
    assert request.to_json() == value
    result = publish_owner_generation(request)
    assert result == PublishGenerationResult("first")
    assert result.to_json() == {"schema_version": 1, "ok": True, "code": "generation_published", "generation": "first"}
    with pytest.raises(TmuxOwnerError, match=r"^baseline_generation_changed$"):
        publish_owner_generation(request)
    for bad in [
        {**value, "extra": 1},
        {**value, "op": "plan"},
        {**value, "schema_version": 2},
        {**value, "state_dir": ""},
    ]:
        with pytest.raises(InvalidRecordError):
            PublishGenerationRequest.from_json(bad)
