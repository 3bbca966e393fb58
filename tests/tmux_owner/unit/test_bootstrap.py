"""The scoped bootstrap run in-process: attempt consumption, scope self-proof, spawn and receipt.

systemd cannot run here (no systemd as PID 1), so every test calls the bootstrap with a
real state directory and injects its self-cgroup reader, spawner and server probe; the
bootstrap that spawns a real tmux session is in ``real_tmux/test_bootstrap_real_tmux.py``.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import attrs
import pytest
from tmux_support import BOOTSTRAP_NOW as NOW
from tmux_support import World, root_of

from tmux_owner import _bootstrap
from tmux_owner._bootstrap import BootstrapRequest, BootstrapResult, bootstrap_owner_isolation
from tmux_owner._errors import TmuxOwnerError
from tmux_owner._execute import is_exact_scoped_bootstrap_success_receipt
from tmux_owner._generations import replace_owner_generation
from tmux_owner._jscompat import dumps
from tmux_owner._plan_records import write_attempt
from tmux_owner._server_proof import TmuxServerProof
from tmux_owner._timestamps import iso_now

ARGV = ["tmux", "new-session", "-s", "owned", "a b"]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path, list(ARGV)).setup()


def failed(diagnostic: str) -> BootstrapResult:
    return BootstrapResult.failed(diagnostic)


def test_a_bootstrap_in_its_proved_scope_spawns_the_exact_argv_and_answers_a_receipt(world: World) -> None:
    """A bootstrap in its own scope consumes the attempt, spawns the exact argv once, probes the server through
    `["tmux"]`, publishes no generation and answers the exact success receipt.
    """
    before = (root_of(world.state_dir) / "generation.json").read_bytes()
    result = world.run()
    assert result.to_json() == {
        "schema_version": 1,
        "ok": True,
        "code": "bootstrapped",
        "native_session_id": "$0",
        "server_pid": 1,
        "server_start_time": "1",
        "session_name": "owned",
    }
    assert world.spawns == [ARGV]
    assert world.probes == [("socket", ["tmux"])]
    assert (world.state_dir / "session" / "owner-lifecycle" / "generation.json").read_bytes() == before
    assert not world.attempt_file.exists()
    assert Path(f"{world.attempt_file}.consumed").exists()
    assert is_exact_scoped_bootstrap_success_receipt(dumps(result.to_json()) + "\n")


def test_the_bootstrap_probes_through_an_explicit_socket_argv(tmp_path: Path) -> None:
    """For the argv `tmux -L explicit new-session …` the bootstrap probes the server through `["tmux", "-L",
    "explicit"]`.
    """
    world = World(tmp_path, ["tmux", "-L", "explicit", "new-session", "-s", "owned-explicit", "a b"]).setup()
    assert world.run().ok
    assert world.probes == [("socket", ["tmux", "-L", "explicit"])]


def test_a_replayed_bootstrap_request_is_refused_without_spawning(world: World) -> None:
    """Replaying a request that already succeeded finds no attempt file, answers attempt_capability_invalid and spawns
    nothing.
    """
    assert world.run().ok
    assert world.run() == failed("attempt_capability_invalid")
    assert len(world.spawns) == 1


def rewrite_attempt(world: World, **changes: Any) -> None:
    record = json.loads(world.attempt_file.read_text())
    record.update(changes)
    world.attempt_file.write_text(json.dumps(record))


@pytest.mark.parametrize(
    "tamper",
    [
        "baseline_changed",
        "file_missing",
        "schema_version",
        "generation",
        "session_id",
        "session_name",
        "socket_key",
        "server_absent_before",
        "expires_at",
        "created_at_missing",
        "argv_session",
        "expected_scope",
    ],
)
def test_an_attempt_that_does_not_match_is_invalid_and_not_consumed(world: World, tamper: str) -> None:
    """A changed generation baseline, a missing or differing persisted attempt, another session name or another scope is
    attempt_capability_invalid and leaves the attempt unconsumed.
    """
    overrides: dict[str, Any] = {}
    if tamper == "baseline_changed":
        replace_owner_generation(world.state_dir, "session", "current")
    elif tamper == "file_missing":
        world.attempt_file.unlink()
    elif tamper == "created_at_missing":
        record = json.loads(world.attempt_file.read_text())
        del record["created_at"]
        world.attempt_file.write_text(json.dumps(record))
    elif tamper == "argv_session":
        overrides["tmux_argv"] = ["tmux", "new-session", "-s", "other"]
    elif tamper == "expected_scope":
        overrides["expected_scope"] = "gjc-owner-other.scope"
    else:
        values = {
            "schema_version": 2,
            "generation": "prior-generation",
            "session_id": "other",
            "session_name": "other",
            "socket_key": "other",
            "server_absent_before": False,
            "expires_at": iso_now(NOW + 4_000),
        }
        rewrite_attempt(world, **{tamper: values[tamper]})
    assert world.run(**overrides) == failed("attempt_capability_invalid")
    assert world.spawns == []
    assert not Path(f"{world.attempt_file}.consumed").exists()


@pytest.mark.parametrize("expires_in_ms", [-1, 0, 7_001])
def test_an_expired_or_too_distant_attempt_is_refused_and_not_consumed(tmp_path: Path, expires_in_ms: int) -> None:
    """An attempt that expires in the past, exactly now, or more than 7 s from now is attempt_capability_expired and
    stays unconsumed.
    """
    world = World(tmp_path, list(ARGV)).setup(expires_in_ms=expires_in_ms)
    assert world.run() == failed("attempt_capability_expired")
    assert world.attempt_file.exists()
    assert world.spawns == []


def test_a_capability_that_cannot_be_renamed_is_a_replay(world: World) -> None:
    """When the attempt cannot be renamed to `.consumed` (a directory is in the way) the bootstrap answers
    attempt_capability_replayed without spawning.
    """
    blocker = Path(f"{world.attempt_file}.consumed")
    blocker.mkdir()
    (blocker / "occupied").write_text("x")
    assert world.run() == failed("attempt_capability_replayed")
    assert world.spawns == []


@pytest.mark.parametrize(
    "cgroup",
    ["0::/bad.service", "0::/", "0::/user.slice/user-1000.slice/session-2.scope", "0::/gjc-owner-OTHER.scope", None],
)
def test_a_bootstrap_outside_its_own_scope_fails_self_proof_after_consuming(world: World, cgroup: str | None) -> None:
    """A bootstrap whose own cgroup is not `gjc-owner-<token>.scope` fails scope_self_proof_failed without spawning, and
    its attempt is spent all the same.
    """
    world.self_cgroup = cgroup or ""
    assert world.run() == failed("scope_self_proof_failed")
    assert world.spawns == []
    assert Path(f"{world.attempt_file}.consumed").exists()
    assert world.run() == failed("attempt_capability_invalid")


def test_a_user_manager_app_slice_scope_passes_self_proof(world: World) -> None:
    """The attempt's scope under a user manager (`…/user@1000.service/app.slice/gjc-owner-<token>.scope`) passes the
    self-proof.
    """
    world.self_cgroup = f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/{world.scope}"
    assert world.run().ok


def test_a_generation_published_between_consumption_and_spawn_stops_the_spawn(world: World) -> None:
    """A generation published after the attempt was consumed is caught by the second baseline check, so nothing is
    spawned.
    """

    def cgroup_then_publish() -> str:
        replace_owner_generation(world.state_dir, "session", "intruder")
        return f"0::/{world.scope}"

    deps = attrs.evolve(world.deps(), read_self_cgroup=cgroup_then_publish)
    assert bootstrap_owner_isolation(world.request(), deps) == failed("attempt_capability_invalid")
    assert world.spawns == []


@pytest.mark.parametrize(
    ("change", "diagnostic"),
    [
        ({"exit_code": 1}, "tmux_spawn_failed"),
        ({"exit_code": None}, "tmux_spawn_failed"),
        ({"stdout": ""}, "native_session_identity_unavailable_cleanup_uncertain"),
        ({"stdout": "%1"}, "native_session_identity_unavailable_cleanup_uncertain"),
        ({"stdout": "$x"}, "native_session_identity_unavailable_cleanup_uncertain"),
        ({"proof": TmuxServerProof("unsafe", 41, "1", None, ("owned",))}, "server_proof_failed_cleanup_uncertain"),
        ({"proof": TmuxServerProof("unverifiable", 43)}, "server_proof_failed_cleanup_uncertain"),
        ({"proof": OSError("probe")}, "bootstrap_cleanup_uncertain"),
    ],
)
def test_spawn_and_proof_failures_after_consumption_are_reported_without_cleanup(
    world: World, change: dict[str, Any], diagnostic: str
) -> None:
    """A failed spawn, a missing or malformed `$N` session id, and an unsafe, unverifiable or raising server proof after
    the spawn each answer their own diagnostic.
    """
    for key, value in change.items():
        setattr(world, key, value)
    assert world.run() == failed(diagnostic)
    assert len(world.spawns) == 1


def test_an_exception_before_the_spawn_is_bootstrap_execution_failed(world: World) -> None:
    """An error after the attempt is consumed but before anything is spawned answers bootstrap_execution_failed."""

    def broken() -> str:
        raise OSError("cgroup")

    deps = attrs.evolve(world.deps(), read_self_cgroup=broken)
    assert bootstrap_owner_isolation(world.request(), deps) == failed("bootstrap_execution_failed")


def test_a_corrupt_generation_file_raises_and_releases_the_lock(world: World) -> None:
    """A corrupt generation.json read under the first lock raises baseline_generation_corrupt and releases the lock."""
    root = root_of(world.state_dir)
    (root / "generation.json").write_text("{not json")
    with pytest.raises(TmuxOwnerError, match="baseline_generation_corrupt"):
        world.run()
    connection = sqlite3.connect(root / "owner-locks.sqlite", timeout=0, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("COMMIT")
    finally:
        connection.close()


def test_a_held_generation_lock_is_contended(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A generation lock held by another connection past the (shortened) wait answers generation_lock_contended and
    leaves the attempt in place.
    """
    monkeypatch.setattr(_bootstrap, "GENERATION_LOCK_WAIT_MS", 50)
    holder = sqlite3.connect(root_of(world.state_dir) / "owner-locks.sqlite", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        assert world.run() == failed("generation_lock_contended")
    finally:
        holder.close()
    assert world.attempt_file.exists()


INVALID_REQUESTS: list[tuple[str, Any]] = [
    ("extra", 1),
    ("schema_version", 2),
    ("op", "plan"),
    ("session_id", ""),
    ("session_id", "../escape"),
    ("owner_generation", ".."),
    ("state_dir", ""),
    ("socket_key", ""),
    ("expected_scope", ""),
    ("tmux_argv", []),
    ("tmux_argv", ["", "new-session"]),
    ("attempt", None),
]


@pytest.mark.parametrize(("key", "value"), INVALID_REQUESTS)
def test_a_malformed_bootstrap_request_is_refused_before_any_lock(world: World, key: str, value: Any) -> None:
    """An extra key, a wrong schema or op, an empty or unsafe id, a bad argv or a missing attempt answers
    invalid_bootstrap_request.
    """
    assert world.run(**{key: value}) == failed("invalid_bootstrap_request")


@pytest.mark.parametrize(
    "change",
    [
        {"socket_key": "other"},
        {"server_absent_before": False},
        {"expires_at": "never"},
        {"token": "a/b"},
        {"token": ""},
        {"extra": 1},
    ],
)
def test_a_bootstrap_attempt_that_is_not_bound_to_the_request_is_malformed(
    world: World, change: dict[str, Any]
) -> None:
    """An attempt that names another socket, a server present before, an unparseable expiry, an unsafe token or an extra
    key makes the request invalid_bootstrap_request.
    """
    assert world.attempt is not None
    assert world.run(attempt={**world.attempt.to_json(), **change}) == failed("invalid_bootstrap_request")


def test_a_bootstrap_request_missing_any_key_is_malformed(world: World) -> None:
    """A bootstrap request missing any one of its nine keys answers invalid_bootstrap_request, and the complete one
    round-trips.
    """
    for key in list(world.request()):
        value = world.request()
        del value[key]
        assert bootstrap_owner_isolation(value, world.deps()) == failed("invalid_bootstrap_request")
        assert BootstrapRequest.from_json(world.request()).to_json() == world.request()


def test_the_attempt_file_is_the_seed_record_followed_by_one_newline(world: World) -> None:
    """attempt-<token>.json is one compact JSON line with the persisted keys in the seed's order, mode 0600, and is
    never overwritten.
    """
    assert world.attempt is not None
    data = world.attempt_file.read_bytes()
    record = json.loads(data)
    assert list(record) == [
        "schema_version", "generation", "session_id", "token", "session_name", "socket_key",
        "server_absent_before", "baseline", "expires_at", "created_at",
    ]  # fmt: skip
    assert data == (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    assert os.stat(world.attempt_file).st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        write_attempt(str(world.state_dir), "session", "generation", world.attempt)


RECEIPT = (
    '{"schema_version":1,"ok":true,"code":"bootstrapped","native_session_id":"$0",'
    '"server_pid":12,"server_start_time":"34","session_name":"owned-session"}'
)


@pytest.mark.parametrize(
    ("stdout", "accepted"),
    [
        (RECEIPT + "\n", True),
        (RECEIPT, True),
        (RECEIPT + "\nextra", False),
        (RECEIPT.replace('"schema_version":1', '"schema_version":2'), False),
        (RECEIPT[:-1] + ',"x":1}', False),
        (RECEIPT.replace(',"session_name":"owned-session"', ""), False),
        ("not-json", False),
        (RECEIPT[:-1] + ',"pad":"' + "x" * 16_400 + '"}', False),
        (RECEIPT.replace(",", ",\r", 1), False),
        (RECEIPT.replace('"server_pid":12', '"server_pid":0'), False),
        (RECEIPT.replace('"server_pid":12', '"server_pid":-1'), False),
        (RECEIPT.replace('"server_pid":12', '"server_pid":true'), False),
        (RECEIPT.replace('"server_start_time":"34"', '"server_start_time":""'), False),
        (RECEIPT.replace('"session_name":"owned-session"', '"session_name":""'), False),
        (RECEIPT.replace('"$0"', '"%0"'), False),
        (RECEIPT.replace('"$0"', '"$0\\n"'), False),
    ],
)
def test_only_the_exact_bootstrap_success_receipt_is_accepted(stdout: str, accepted: bool) -> None:
    """Only one line holding exactly the seven success keys, with a `$N` session id, a positive pid and non-empty
    strings, is a bootstrap success receipt.
    """
    assert is_exact_scoped_bootstrap_success_receipt(stdout) is accepted
