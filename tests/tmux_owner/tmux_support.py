"""Plain helpers the tmux_owner tests share: the usual owner, its lifecycle directory, and valid requests.

Imported by bare name (``from tmux_support import ...``): ``tests/tmux_owner`` holds a
``conftest.py``, so pytest puts this directory on ``sys.path``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from tmux_owner._bootstrap import BootstrapDependencies, BootstrapResult, bootstrap_owner_isolation
from tmux_owner._cgroup import CgroupInfo
from tmux_owner._execute import SpawnResult
from tmux_owner._generations import capture_owner_generation_baseline, replace_owner_generation
from tmux_owner._plan_records import AttemptCapability, write_attempt
from tmux_owner._server_proof import TmuxServerProof
from tmux_owner._timestamps import iso_now

SESSION = "session"
GENERATION = "generation"
PROJECT = Path(__file__).resolve().parents[2]


def root_of(state_dir: Path) -> Path:
    """The lifecycle directory of the usual session under ``state_dir``."""
    return state_dir / SESSION / "owner-lifecycle"


def observe_request_json(state_dir: Path, **overrides: Any) -> dict[str, Any]:
    """A valid ``observe_terminal`` request for the usual owner, without an operator dispatch id."""
    value: dict[str, Any] = {
        "schema_version": 1,
        "op": "observe_terminal",
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
    }
    return value | overrides


def intent_args(**overrides: Any) -> dict[str, Any]:
    """The keyword arguments of ``create_owner_intent`` for a one-minute intent of the usual owner."""
    return {
        "generation": GENERATION,
        "session_id": SESSION,
        "server_key": "socket",
        "dispatch_id": "dispatch",
        "created_at": "2026-01-01T00:00:00.000Z",
        "expires_at": "2026-01-01T00:01:00.000Z",
    } | overrides


def plan_request_json(state_dir: Path, tmux_argv: Sequence[str], /, **overrides: Any) -> dict[str, Any]:
    """A valid ``plan`` request as parsed JSON: Linux, the usual owner, socket key ``socket``, no generation yet."""
    value: dict[str, Any] = {
        "schema_version": 1,
        "op": "plan",
        "platform": "linux",
        "session_id": SESSION,
        "owner_generation": GENERATION,
        "cwd": "/",
        "state_dir": str(state_dir),
        "socket_key": "socket",
        "tmux_argv": list(tmux_argv),
        "baseline": {"state": "absent"},
    }
    value.update(overrides)
    return value


BOOTSTRAP_NOW = 1_767_225_600_000
SAFE_SERVER = TmuxServerProof("safe", 1, "1", CgroupInfo("safe", scope="/"))


@attrs.define
class World:
    """A bootstrap scene: a published prior generation, a recorded attempt and injected dependencies."""

    state_dir: Path
    argv: list[str]
    token: str = attrs.field(factory=lambda: str(uuid.uuid4()))
    self_cgroup: str | None = None
    stdout: str = "$0\n"
    exit_code: int | None = 0
    proof: TmuxServerProof | Exception = SAFE_SERVER
    now: int = BOOTSTRAP_NOW
    spawns: list[list[str]] = attrs.field(factory=list)
    probes: list[tuple[str, list[str]]] = attrs.field(factory=list)
    attempt: AttemptCapability | None = None

    def setup(self, expires_in_ms: int = 5_000, generation: str = GENERATION) -> World:
        if not (root_of(self.state_dir) / "generation.json").exists():
            replace_owner_generation(self.state_dir, SESSION, "prior-generation")
        self.attempt = AttemptCapability(
            token=self.token,
            session_name=self.session_name(),
            socket_key="socket",
            server_absent_before=True,
            baseline=capture_owner_generation_baseline(self.state_dir, SESSION),
            expires_at=iso_now(self.now + expires_in_ms),
        )
        write_attempt(str(self.state_dir), SESSION, generation, self.attempt)
        return self

    def session_name(self) -> str:
        return self.argv[self.argv.index("-s") + 1]

    @property
    def scope(self) -> str:
        return f"gjc-owner-{self.token}.scope"

    @property
    def attempt_file(self) -> Path:
        return root_of(self.state_dir) / f"attempt-{self.token}.json"

    def request(self, **overrides: Any) -> dict[str, Any]:
        assert self.attempt is not None
        value = {
            "schema_version": 1,
            "op": "bootstrap",
            "session_id": SESSION,
            "owner_generation": GENERATION,
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
