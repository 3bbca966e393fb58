"""Nothing below the state directory is followed through a symlink.

Each test plants a symlink at one component below the state directory (the session
directory, the lifecycle directory, a record file, the lock database or one of its side
files) pointing into a "victim" directory outside it, runs every operation that touches
that component, and checks that the operation refuses and that nothing in the victim
directory was created, written, or had its mode changed. The state directory itself may
be a symlink: the caller chose it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from tmux_support import GENERATION, SESSION, World, intent_args, observe_request_json, root_of

from tmux_owner import (
    ExactOwnerCloseDependencies,
    ExactOwnerCloseRequest,
    OwnerGenerationBaseline,
    PublishGenerationRequest,
    TmuxOwnerError,
    capture_owner_generation_baseline,
    close_exact_tmux_owner,
    create_owner_intent,
    observe_owner_terminal,
    publish_owner_generation,
    replace_owner_generation,
    resolve_managed_owner_predecessor,
)
from tmux_owner._plan_records import write_attempt

ARGV = ["tmux", "new-session", "-s", "owned"]
Snapshot = dict[str, tuple[int, bytes]]


def snapshot(top: Path) -> Snapshot:
    """Every entry below ``top`` with its mode and its bytes (a symlink's target, a directory's nothing)."""
    entries: Snapshot = {}
    for directory, names, files in os.walk(top):
        for name in names + files:
            path = Path(directory, name)
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                content = os.readlink(path).encode()
            elif stat.S_ISREG(info.st_mode):
                content = path.read_bytes()
            else:
                content = b""
            entries[str(path.relative_to(top))] = (info.st_mode, content)
    return entries


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A directory outside the state directory holding a complete, valid lifecycle of the usual session, a decoy
    database and a decoy record, all 0644, which a followed symlink would read, write or chmod.
    """
    top = tmp_path / "victim"
    replace_owner_generation(top, SESSION, GENERATION)
    create_owner_intent(top, **intent_args())
    (top / "decoy.sqlite").write_bytes(b"")
    (top / "decoy.json").write_text('{"decoy":true}\n')
    for path in top.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return top


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state directory in which the usual generation is published and its SIGTERM intent is pending."""
    top = tmp_path / "state"
    replace_owner_generation(top, SESSION, GENERATION)
    create_owner_intent(top, **intent_args())
    return top


def refused(operation: Callable[[], object], code: str) -> None:
    with pytest.raises(TmuxOwnerError) as raised:
        operation()
    assert raised.value.code == code


def publish(state: Path, generation: str = "next") -> object:
    baseline = capture_owner_generation_baseline(state, SESSION)
    return publish_owner_generation(
        PublishGenerationRequest(
            session_id=SESSION, owner_generation=generation, state_dir=str(state), baseline=baseline
        )
    )


def observe(state: Path, **overrides: Any) -> object:
    return observe_owner_terminal(observe_request_json(state, **overrides))


def observe_expected(state: Path) -> object:
    return observe(state, operator_dispatch_id="dispatch")


def close(state: Path) -> object:
    request = ExactOwnerCloseRequest(
        state_dir=state,
        session_id=SESSION,
        generation=GENERATION,
        server_key="socket",
        pid=4242,
        start_time="1234",
        dispatch_id="another-dispatch",
        created_at="2026-01-01T00:00:00.000Z",
        expires_at="2099-01-01T00:00:00.000Z",
    )
    deps = ExactOwnerCloseDependencies(read_start_time=lambda _pid: "1234", send_sigterm=lambda _pid: None)
    return close_exact_tmux_owner(request, deps)


def link_directory(state: Path, victim: Path, which: str) -> None:
    """Replace the session or lifecycle directory of ``state`` by a symlink to the victim's."""
    if which == "session":
        shutil.rmtree(state / SESSION)
        (state / SESSION).symlink_to(victim / SESSION, target_is_directory=True)
    else:
        shutil.rmtree(root_of(state))
        root_of(state).symlink_to(root_of(victim), target_is_directory=True)


DIRECTORY_OPERATIONS: dict[str, Callable[[Path], object]] = {
    "capture": lambda state: capture_owner_generation_baseline(state, SESSION),
    "replace": lambda state: replace_owner_generation(state, SESSION, "next"),
    "publish": lambda state: publish_owner_generation(
        PublishGenerationRequest(
            session_id=SESSION, owner_generation="next", state_dir=str(state), baseline=OwnerGenerationBaseline.absent()
        )
    ),
    "create_intent": lambda state: create_owner_intent(state, **intent_args(generation="other")),
    "observe": observe_expected,
    "close": close,
    "predecessor": lambda state: resolve_managed_owner_predecessor(
        state, SESSION, capture_owner_generation_baseline(state.parent / "victim", SESSION)
    ),
}


@pytest.mark.parametrize("operation", sorted(DIRECTORY_OPERATIONS))
@pytest.mark.parametrize("which", ["session", "lifecycle"])
def test_a_symlinked_session_or_lifecycle_directory_is_an_untrusted_root(
    state: Path, victim: Path, which: str, operation: str
) -> None:
    """Every operation refuses a session or lifecycle directory that is a symlink with untrusted_root and touches
    nothing behind it.
    """
    link_directory(state, victim, which)
    before = snapshot(victim)
    refused(lambda: DIRECTORY_OPERATIONS[operation](state), "untrusted_root")
    assert snapshot(victim) == before


def test_a_symlinked_directory_refuses_a_bootstrap_and_a_scoped_attempt(tmp_path: Path, victim: Path) -> None:
    """A bootstrap and an attempt write through a symlinked lifecycle directory are refused with untrusted_root."""
    world = World(tmp_path / "state", list(ARGV)).setup()
    link_directory(world.state_dir, victim, "lifecycle")
    before = snapshot(victim)
    refused(world.run, "untrusted_root")
    assert world.attempt is not None
    attempt = attrs.evolve(world.attempt, token="another-token")
    refused(lambda: write_attempt(str(world.state_dir), SESSION, GENERATION, attempt), "untrusted_root")
    assert snapshot(victim) == before


LOCK_OPERATIONS: dict[str, Callable[[Path], object]] = {
    "publish": publish,
    "observe": observe_expected,
    "close": close,
}


@pytest.mark.parametrize("operation", sorted(LOCK_OPERATIONS))
@pytest.mark.parametrize("suffix", ["", "-journal", "-wal", "-shm"])
@pytest.mark.parametrize("target", ["decoy.sqlite", "absent.sqlite"])
def test_a_symlinked_lock_database_or_side_file_is_refused(
    state: Path, victim: Path, operation: str, suffix: str, target: str
) -> None:
    """A symlink at owner-locks.sqlite or its -journal, -wal or -shm file is refused with untrusted_lifecycle_file,
    and the target is neither created, written nor chmodded.
    """
    lock = root_of(state) / f"owner-locks.sqlite{suffix}"
    lock.unlink(missing_ok=True)
    lock.symlink_to(victim / target)
    before = snapshot(victim)
    refused(lambda: LOCK_OPERATIONS[operation](state), "untrusted_lifecycle_file")
    assert snapshot(victim) == before


def test_a_symlinked_lock_database_refuses_a_bootstrap(tmp_path: Path, victim: Path) -> None:
    """A bootstrap whose lock database is a symlink is refused with untrusted_lifecycle_file and leaves the target
    unchanged.
    """
    world = World(tmp_path / "state", list(ARGV)).setup()
    lock = root_of(world.state_dir) / "owner-locks.sqlite"
    lock.unlink()
    lock.symlink_to(victim / "decoy.sqlite")
    before = snapshot(victim)
    refused(world.run, "untrusted_lifecycle_file")
    assert snapshot(victim) == before
    assert world.spawns == []


def plant(state: Path, victim: Path, name: str, target: str) -> None:
    """Replace the record ``name`` of ``state`` (if any) by a symlink to ``target`` in the victim directory."""
    path = root_of(state) / name
    path.unlink(missing_ok=True)
    path.symlink_to(victim / target)


VICTIM_GENERATION = f"{SESSION}/owner-lifecycle/generation.json"
VICTIM_INTENT = f"{SESSION}/owner-lifecycle/intent-{GENERATION}.json"

# (record, what the symlink points at, the operation, its refusal)
RECORD_CASES: list[tuple[str, str, Callable[[Path], object], str]] = [
    ("generation.json", VICTIM_GENERATION, lambda state: capture_owner_generation_baseline(state, SESSION),
     "baseline_generation_corrupt"),
    ("generation.json", VICTIM_GENERATION, lambda state: replace_owner_generation(state, SESSION, "next"),
     "baseline_generation_corrupt"),
    ("generation.json", VICTIM_GENERATION, observe_expected, "generation_mismatch"),
    ("generation-next.published.json", "decoy.json", publish, "generation_replay"),
    (f"generation-{GENERATION}.published.json", "decoy.json", publish, "generation_replay"),
    (f"intent-{GENERATION}.json", VICTIM_INTENT, lambda state: create_owner_intent(state, **intent_args()),
     "owner_intent_replay"),
    (f"intent-{GENERATION}.json", VICTIM_INTENT, close, "owner_intent_replay"),
    *(
        (f"intent-{GENERATION}.json{suffix}", "absent.json", lambda state: create_owner_intent(state, **intent_args()),
         "owner_intent_replay")
        for suffix in (".consumed", ".cancelled", ".expired", ".invalidated")
    ),
    (f"intent-{GENERATION}.json.consumed", "absent.json", observe_expected, "untrusted_lifecycle_file"),
    (f"verdict-{GENERATION}.json", "decoy.json", observe_expected, "immutable_record_corrupt"),
    (f"verdict-{GENERATION}.json", "absent.json", observe_expected, "immutable_record_corrupt"),
    ("verdict.json", "decoy.json", observe_expected, "untrusted_lifecycle_file"),
    ("verdict.json", "absent.json", observe_expected, "untrusted_lifecycle_file"),
    (f"incident-{GENERATION}.json", "absent.json", lambda state: observe(state, signal="EXIT"),
     "immutable_record_corrupt"),
    (f"verdict-{GENERATION}.journal", "decoy.json", observe_expected, "untrusted_lifecycle_file"),
    (f"verdict-{GENERATION}.journal", "absent.json", observe_expected, "untrusted_lifecycle_file"),
]  # fmt: skip


@pytest.mark.parametrize(("record", "target", "operation", "code"), RECORD_CASES)
def test_a_symlinked_record_is_refused_and_never_followed(
    state: Path, victim: Path, record: str, target: str, operation: Callable[[Path], object], code: str
) -> None:
    """An operation that meets a symlink at a record refuses with its documented code and neither reads through it
    into a decision nor writes, creates or chmods anything at its target.
    """
    plant(state, victim, record, target)
    before = snapshot(victim)
    refused(lambda: operation(state), code)
    assert snapshot(victim) == before


def test_a_symlinked_intent_never_authorizes_an_expected_shutdown(state: Path, victim: Path) -> None:
    """A symlink at intent-<G>.json pointing at a valid intent is not followed: the observation is an unexpected loss,
    and the victim's intent is neither read into the verdict nor renamed.
    """
    plant(state, victim, f"intent-{GENERATION}.json", VICTIM_INTENT)
    before = snapshot(victim)
    verdict = observe_expected(state)
    assert getattr(verdict, "classification", None) == "unexpected_owner_loss"
    assert snapshot(victim) == before


def test_a_symlinked_attempt_is_invalid_and_its_target_untouched(tmp_path: Path, victim: Path) -> None:
    """A bootstrap whose attempt file, or its consumed name, is a symlink is refused without renaming or writing its
    target, and nothing is spawned.
    """
    world = World(tmp_path / "state", list(ARGV)).setup()
    real = world.attempt_file.read_bytes()
    (victim / "attempt.json").write_bytes(real)
    world.attempt_file.unlink()
    world.attempt_file.symlink_to(victim / "attempt.json")
    before = snapshot(victim)
    assert world.run().diagnostic == "attempt_capability_invalid"
    world.attempt_file.unlink()
    world.attempt_file.write_bytes(real)
    Path(f"{world.attempt_file}.consumed").symlink_to(victim / "consumed.json")
    assert world.run().diagnostic == "attempt_capability_replayed"
    assert snapshot(victim) == before
    assert world.spawns == []


def test_a_state_directory_that_is_itself_a_symlink_is_used(tmp_path: Path) -> None:
    """The state directory is the caller's choice: reached through a symlink, publication and observation work."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    state = tmp_path / "alias"
    replace_owner_generation(state, SESSION, GENERATION)
    verdict = observe(state, signal="EXIT")
    assert getattr(verdict, "classification", None) == "unexpected_owner_loss"
    assert json.loads((root_of(real) / "verdict.json").read_text())["generation"] == GENERATION
