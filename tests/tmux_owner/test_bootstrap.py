"""Scoped bootstrap (contract §5, TO-66..TO-80, TO-152).

systemd cannot run here (no systemd as PID 1), so every test calls the bootstrap
in-process with a real state directory and injects its self-cgroup reader; spawn and
probe are injected too, except in the real-tmux test, which spawns a real session.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from tmux_owner import _bootstrap
from tmux_owner._bootstrap import BootstrapDependencies, BootstrapRequest, BootstrapResult, bootstrap_owner_isolation
from tmux_owner._cgroup import CgroupInfo
from tmux_owner._common import TmuxOwnerError, current_ms, dumps, iso_now
from tmux_owner._execute import SpawnResult, is_exact_scoped_bootstrap_success_receipt
from tmux_owner._generations import capture_owner_generation_baseline, replace_owner_generation
from tmux_owner._plan_records import AttemptCapability, TmuxServerProof, write_attempt
from tmux_owner._tmux import TmuxProbe, run_argv

NOW = 1_767_225_600_000
SAFE = TmuxServerProof("safe", 1, "1", CgroupInfo("safe", scope="/"))


@attrs.define
class World:
    """A bootstrap scene: a published prior generation, a recorded attempt and injected dependencies."""

    state_dir: Path
    argv: list[str]
    token: str = attrs.field(factory=lambda: str(uuid.uuid4()))
    self_cgroup: str | None = None
    stdout: str = "$0\n"
    exit_code: int | None = 0
    proof: TmuxServerProof | Exception = SAFE
    now: int = NOW
    spawns: list[list[str]] = attrs.field(factory=list)
    probes: list[tuple[str, list[str]]] = attrs.field(factory=list)
    attempt: AttemptCapability | None = None

    def setup(self, expires_in_ms: int = 5_000, generation: str = "generation") -> World:
        if not (self.state_dir / "session" / "owner-lifecycle" / "generation.json").exists():
            replace_owner_generation(self.state_dir, "session", "prior-generation")
        self.attempt = AttemptCapability(
            token=self.token,
            session_name=self.session_name(),
            socket_key="socket",
            server_absent_before=True,
            baseline=capture_owner_generation_baseline(self.state_dir, "session"),
            expires_at=iso_now(self.now + expires_in_ms),
        )
        write_attempt(str(self.state_dir), "session", generation, self.attempt)
        return self

    def session_name(self) -> str:
        return self.argv[self.argv.index("-s") + 1]

    @property
    def scope(self) -> str:
        return f"gjc-owner-{self.token}.scope"

    @property
    def attempt_file(self) -> Path:
        return self.state_dir / "session" / "owner-lifecycle" / f"attempt-{self.token}.json"

    def request(self, **overrides: Any) -> dict[str, Any]:
        assert self.attempt is not None
        value = {
            "schema_version": 1,
            "op": "bootstrap",
            "session_id": "session",
            "owner_generation": "generation",
            "state_dir": str(self.state_dir),
            "socket_key": "socket",
            "expected_scope": self.scope,
            "tmux_argv": self.argv,
            "attempt": self.attempt.to_json(),
        }
        value.update(overrides)
        return value

    def deps(self) -> BootstrapDependencies:
        return BootstrapDependencies(
            read_self_cgroup=lambda: f"0::/{self.scope}" if self.self_cgroup is None else self.self_cgroup,
            spawn=self.spawn,
            probe_server=self.probe,
            now_ms=lambda: self.now,
        )

    def spawn(self, argv: Sequence[str]) -> SpawnResult:
        self.spawns.append(list(argv))
        return SpawnResult(self.exit_code, self.stdout)

    def probe(self, socket_key: str, control_argv: Sequence[str]) -> TmuxServerProof:
        self.probes.append((socket_key, list(control_argv)))
        if isinstance(self.proof, Exception):
            raise self.proof
        return self.proof

    def run(self, **overrides: Any) -> BootstrapResult:
        return bootstrap_owner_isolation(self.request(**overrides), self.deps())


ARGV = ["tmux", "new-session", "-s", "owned", "a b"]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path, list(ARGV)).setup()


def failed(diagnostic: str) -> BootstrapResult:
    return BootstrapResult.failed(diagnostic)


def test_a_bootstrap_in_its_proved_scope_spawns_the_exact_argv_and_answers_a_receipt(world: World) -> None:
    """TO-68: consume the attempt, spawn the exact argv once, probe via `["tmux"]`, publish nothing, give a receipt."""
    before = (world.state_dir / "session" / "owner-lifecycle" / "generation.json").read_bytes()
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
    """TO-69: argv `tmux -L explicit new-session …` gives the probe `["tmux","-L","explicit"]`."""
    world = World(tmp_path, ["tmux", "-L", "explicit", "new-session", "-s", "owned-explicit", "a b"]).setup()
    assert world.run().ok
    assert world.probes == [("socket", ["tmux", "-L", "explicit"])]


def test_a_replayed_bootstrap_request_is_refused_without_spawning(world: World) -> None:
    """TO-70: the same request after a success finds no attempt file and is attempt_capability_invalid."""
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
    """TO-71: a changed baseline, a missing or different persisted attempt, another -s or scope is invalid."""
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
    """TO-72: an expiry in the past, equal to now, or more than 7 s ahead is attempt_capability_expired."""
    world = World(tmp_path, list(ARGV)).setup(expires_in_ms=expires_in_ms)
    assert world.run() == failed("attempt_capability_expired")
    assert world.attempt_file.exists()
    assert world.spawns == []


def test_a_capability_that_cannot_be_renamed_is_a_replay(world: World) -> None:
    """TO-73: when the rename to `.consumed` fails (a directory is in the way) it is attempt_capability_replayed."""
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
    """TO-74: a self cgroup that is not `gjc-owner-<token>.scope` fails, spawns nothing, and the capability is spent."""
    world.self_cgroup = cgroup or ""
    assert world.run() == failed("scope_self_proof_failed")
    assert world.spawns == []
    assert Path(f"{world.attempt_file}.consumed").exists()
    assert world.run() == failed("attempt_capability_invalid")


def test_a_user_manager_app_slice_scope_passes_self_proof(world: World) -> None:
    """TO-74: `…/user@1000.service/app.slice/gjc-owner-<token>.scope` is a valid self-proof."""
    world.self_cgroup = f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/{world.scope}"
    assert world.run().ok


def test_a_generation_published_between_consumption_and_spawn_stops_the_spawn(world: World) -> None:
    """TO-75: the baseline is re-checked under the second lock, so a new generation means no spawn."""

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
    """TO-76..79: a failed spawn, a missing `$N`, an unsafe or failing post-spawn proof each have their diagnostic."""
    for key, value in change.items():
        setattr(world, key, value)
    assert world.run() == failed(diagnostic)
    assert len(world.spawns) == 1


def test_an_exception_before_the_spawn_is_bootstrap_execution_failed(world: World) -> None:
    """TO-79: an error after consumption but before any spawn is bootstrap_execution_failed."""

    def broken() -> str:
        raise OSError("cgroup")

    deps = attrs.evolve(world.deps(), read_self_cgroup=broken)
    assert bootstrap_owner_isolation(world.request(), deps) == failed("bootstrap_execution_failed")


def test_a_corrupt_generation_file_raises_and_releases_the_lock(world: World) -> None:
    """TO-80: a corrupt generation.json under the first lock raises baseline_generation_corrupt and frees the lock."""
    root = world.state_dir / "session" / "owner-lifecycle"
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
    """TO-67: a lock held by another connection past the (shortened) wait is generation_lock_contended."""
    monkeypatch.setattr(_bootstrap, "GENERATION_LOCK_WAIT_MS", 50)
    holder = sqlite3.connect(
        world.state_dir / "session" / "owner-lifecycle" / "owner-locks.sqlite", isolation_level=None
    )
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
    """TO-66: an extra key, wrong schema/op, empty or unsafe id, bad argv or attempt is invalid_bootstrap_request."""
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
    """TO-66: the attempt must name the request's socket, an absent server, a parseable expiry and a safe token."""
    assert world.attempt is not None
    assert world.run(attempt={**world.attempt.to_json(), **change}) == failed("invalid_bootstrap_request")


def test_a_bootstrap_request_missing_any_key_is_malformed(world: World) -> None:
    """TO-66: every one of the nine keys is required."""
    for key in list(world.request()):
        value = world.request()
        del value[key]
        assert bootstrap_owner_isolation(value, world.deps()) == failed("invalid_bootstrap_request")
        assert BootstrapRequest.from_json(world.request()).to_json() == world.request()


def test_the_attempt_file_is_the_seed_record_followed_by_one_newline(world: World) -> None:
    """TO-42 / §1: attempt-<token>.json holds the persisted keys in the seed's order, compact, with mode 0600."""
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
    """TO-152: exactly one 7-key success line with a `$N` id, a positive pid and non-empty strings."""
    assert is_exact_scoped_bootstrap_success_receipt(stdout) is accepted


def test_a_bootstrap_spawns_a_real_tmux_session_with_only_its_self_cgroup_faked(
    tmp_path: Path, tmux_binary: str
) -> None:
    """§17: in-process bootstrap with a real tmux spawn and real probe (cgroups injected) answers a true receipt."""
    directory = Path(tempfile.mkdtemp(prefix="tmo-"))
    control = [tmux_binary, "-S", str(directory / "sock")]
    try:
        argv = [*control, "new-session", "-d", "-s", "owned", "-P", "-F", "#{session_id}", "sleep", "600"]
        world = World(tmp_path, argv, now=current_ms()).setup()
        probe = TmuxProbe(control, platform="linux", read_cgroup=lambda _entry: "0::/")
        deps = BootstrapDependencies(
            read_self_cgroup=lambda: f"0::/{world.scope}",
            spawn=lambda spawn_argv: run_argv(spawn_argv),
            probe_server=probe.probe_server,
        )
        result = bootstrap_owner_isolation(world.request(), deps)
        shown = subprocess.run([*control, "display-message", "-p", "#{pid}"], capture_output=True, text=True)
        pid = int(shown.stdout)
        assert (result.ok, result.native_session_id, result.server_pid, result.session_name) == (
            True,
            "$0",
            pid,
            "owned",
        )
    finally:
        subprocess.run([*control, "kill-server"], capture_output=True, check=False)
        shutil.rmtree(directory, ignore_errors=True)
