"""Planning and executing an owner launch with injected probes: request validation, the truth table, execution."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from tmux_support import plan_request_json

from tmux_owner._cgroup import CgroupInfo
from tmux_owner._execute import ExecutionDependencies, ExecutionFailure, ExecutionSuccess, SpawnResult, execute_plan
from tmux_owner._generations import OwnerGenerationBaseline, replace_owner_generation
from tmux_owner._jscompat import dumps, safe_diagnostic
from tmux_owner._plan import plan_owner_isolation
from tmux_owner._plan_records import (
    AttemptCapability,
    DirectExecution,
    PlanFailure,
    PlanRequest,
    PlanSuccess,
)
from tmux_owner._server_proof import TmuxServerProof, is_safe_server_proof, same_server_identity

ARGV = ["tmux", "new-session", "-d", "-s", "owned-session", "a b"]
SAFE_CGROUP = CgroupInfo("safe", scope="/")
SAFE_SERVER = TmuxServerProof("safe", 1, "1", SAFE_CGROUP)


@attrs.define
class FakeProbe:
    """An injected probe that records every call."""

    server: TmuxServerProof | Exception = SAFE_SERVER
    caller_cgroup: str | Exception | None = "0::/unit.service"
    calls: list[tuple[str, Any]] = attrs.field(factory=list)

    def read_caller_cgroup(self) -> str | None:
        self.calls.append(("read_caller_cgroup", None))
        if isinstance(self.caller_cgroup, Exception):
            raise self.caller_cgroup
        return self.caller_cgroup

    def probe_server(self, socket_key: str, control_argv: Sequence[str] | None = None) -> TmuxServerProof:
        self.calls.append(("probe_server", (socket_key, list(control_argv or []))))
        if isinstance(self.server, Exception):
            raise self.server
        return self.server

    def record_attempt(self, *, state_dir: str, session_id: str, generation: str, attempt: AttemptCapability) -> None:
        self.calls.append(("record_attempt", (state_dir, session_id, generation, attempt)))

    def named(self, name: str) -> list[Any]:
        return [args for call, args in self.calls if call == name]


def plan_json(root: Path, /, **overrides: Any) -> dict[str, Any]:
    """A valid plan request for ``ARGV`` as parsed JSON."""
    return plan_request_json(root, ARGV, **overrides)


def failure(code: str, diagnostic: str) -> PlanFailure:
    return PlanFailure(code, diagnostic)  # type: ignore[arg-type]  # the tests spell codes as plain str


# --- request validators -------------------------------------------------------------------

PLAN_KEYS = list(plan_json(Path("/s")))
MISTYPED: list[tuple[str, Any]] = [
    ("schema_version", 2),
    ("schema_version", True),
    ("schema_version", "1"),
    ("op", "bootstrap"),
    ("platform", "plan9"),
    ("platform", None),
    ("session_id", ""),
    ("session_id", 5),
    ("owner_generation", ""),
    ("cwd", None),
    ("state_dir", ""),
    ("socket_key", ""),
    ("tmux_argv", []),
    ("tmux_argv", [""]),
    ("tmux_argv", "tmux new-session"),
    ("tmux_argv", ["tmux", 1]),
    ("tmux_argv", ["tmux", "a\0b"]),
    ("baseline", {"state": "absent", "extra": 1}),
    ("baseline", {"state": "current"}),
    ("baseline", None),
    # beyond the seed: ids become path components, so unsafe ones are refused
    ("session_id", ".."),
    ("session_id", "a/b"),
    ("owner_generation", "."),
    ("owner_generation", "g\0"),
]


@pytest.mark.parametrize("key", PLAN_KEYS)
def test_a_plan_request_missing_any_key_is_invalid(tmp_path: Path, key: str) -> None:
    """A plan request missing any one key is invalid_plan_request."""
    value = plan_json(tmp_path)
    del value[key]
    assert plan_owner_isolation(value, FakeProbe()) == failure("scope_unavailable", "invalid_plan_request")


@pytest.mark.parametrize(("key", "bad"), MISTYPED)
def test_a_plan_request_with_a_mistyped_key_is_invalid(tmp_path: Path, key: str, bad: Any) -> None:
    """A wrong schema, op or platform, an empty or unsafe id, a bad argv or a bad baseline is invalid_plan_request
    before any probe.
    """
    probe = FakeProbe()
    assert plan_owner_isolation(plan_json(tmp_path, **{key: bad}), probe) == failure(
        "scope_unavailable", "invalid_plan_request"
    )
    assert probe.calls == []


def test_a_plan_request_with_an_extra_key_is_invalid(tmp_path: Path) -> None:
    """A plan request with one extra key is invalid_plan_request."""
    assert plan_owner_isolation(plan_json(tmp_path, extra=1), FakeProbe()) == failure(
        "scope_unavailable", "invalid_plan_request"
    )


def test_a_plan_request_round_trips_to_the_seed_bytes(tmp_path: Path) -> None:
    """A parsed plan request serialises back to exactly the seed's JSON bytes."""
    value = plan_json(tmp_path, tmux_argv=["tmux", ""])
    assert dumps(PlanRequest.from_json(value).to_json()) == json.dumps(value, separators=(",", ":"))


@pytest.mark.parametrize(
    "argv",
    [
        ["tmux", "-s", "x"],
        ["tmux", "new-session", "-s", "a", "new-session"],
        ["new-session", "-s", "x"],
        ["tmux", "new-session", "-d"],
        ["tmux", "new-session", "-s", "a", "--session-name", "b"],
        ["tmux", "new-session", "-s"],
        ["tmux", "new-session", "-s", ""],
    ],
)
def test_an_argv_without_exactly_one_canonical_new_session_has_no_attempt_session(
    tmp_path: Path, argv: list[str]
) -> None:
    """An argv without exactly one new-session (not first) carrying exactly one non-empty -s/--session-name is
    attempt_session_missing before any probe.
    """
    probe = FakeProbe()
    assert plan_owner_isolation(plan_json(tmp_path, tmux_argv=argv), probe) == failure(
        "scope_unavailable", "attempt_session_missing"
    )
    assert probe.calls == []


def test_a_stale_baseline_is_refused_before_any_probe_or_attempt(tmp_path: Path) -> None:
    """A generation published after the caller captured its baseline makes the plan owner_generation_stale before any
    probe or attempt.
    """
    replace_owner_generation(tmp_path, "session", "competing")
    probe = FakeProbe(caller_cgroup="0::/caller.service", server=TmuxServerProof("absent"))
    assert plan_owner_isolation(plan_json(tmp_path), probe) == failure("scope_unavailable", "owner_generation_stale")
    assert probe.calls == []


def test_a_corrupt_generation_file_reads_as_a_stale_baseline(tmp_path: Path) -> None:
    """A corrupt generation.json reads as a stale baseline (owner_generation_stale), as in the seed's sync plan."""
    root = tmp_path / "session" / "owner-lifecycle"
    root.mkdir(parents=True)
    (root / "generation.json").write_text('{"schema_version":1,"generation":"newer"}\n')
    assert plan_owner_isolation(plan_json(tmp_path), FakeProbe()) == failure(
        "scope_unavailable", "owner_generation_stale"
    )


# --- the truth table ------------------------------------------------------------------------

VTE = (
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-org.gnome.Terminal.slice/"
    "vte-spawn-4006c3d1-0f5c-4ddb-b522-7b73d1f1fb59.scope"
)
TABLE: list[tuple[str, TmuxServerProof, str, str | None, tuple[str, str]]] = [
    # (case, server, platform, caller cgroup, (code, diagnostic-or-mode)); "x" is target_server_unverifiable
    ("unsafe-server", TmuxServerProof("unsafe"), "linux", "0::/x.service", ("server_unsafe", "target_server_unsafe")),
    (
        "unverifiable-server",
        TmuxServerProof("unverifiable"),
        "linux",
        "0::/",
        ("server_unverifiable", "target_server_unverifiable"),
    ),
    ("safe-server", SAFE_SERVER, "linux", "0::/unit.service", ("not_required", "direct")),
    (
        "safe-without-identity",
        TmuxServerProof("safe"),
        "linux",
        "0::/",
        ("server_unverifiable", "target_server_unverifiable"),
    ),
    (
        "safe-with-boolean-pid",
        TmuxServerProof("safe", True, "1", SAFE_CGROUP),
        "linux",
        "0::/",
        ("server_unverifiable", "x"),
    ),
    ("safe-with-pid-zero", TmuxServerProof("safe", 0, "1", SAFE_CGROUP), "linux", "0::/", ("server_unverifiable", "x")),
    (
        "safe-with-empty-start-time",
        TmuxServerProof("safe", 1, "", SAFE_CGROUP),
        "linux",
        "0::/",
        ("server_unverifiable", "x"),
    ),
    (
        "not-applicable-server-off-linux",
        TmuxServerProof("safe", 1, "not_applicable", CgroupInfo("not_applicable")),
        "darwin",
        None,
        ("not_required", "direct"),
    ),
    (
        "not-applicable-server-on-linux",
        TmuxServerProof("safe", 1, "not_applicable", CgroupInfo("not_applicable")),
        "linux",
        "0::/",
        ("server_unverifiable", "target_server_unverifiable"),
    ),
    ("absent-server-off-linux", TmuxServerProof("absent"), "darwin", None, ("not_required", "direct")),
    ("absent-server-root-caller", TmuxServerProof("absent"), "linux", "0::/", ("not_required", "direct")),
    ("absent-server-terminal-caller", TmuxServerProof("absent"), "linux", VTE, ("not_required", "direct")),
    (
        "absent-server-malformed-caller",
        TmuxServerProof("absent"),
        "linux",
        "broken",
        ("server_unverifiable", "cgroup_metadata_malformed"),
    ),
    (
        "absent-server-missing-caller",
        TmuxServerProof("absent"),
        "linux",
        "",
        ("server_unverifiable", "cgroup_metadata_missing"),
    ),
    (
        "absent-server-unowned-caller",
        TmuxServerProof("absent"),
        "linux",
        "4:memory:/process_api/abc\n0::/",
        ("server_unverifiable", "cgroup_ownership_unproven"),
    ),
    (
        "absent-server-service-caller",
        TmuxServerProof("absent"),
        "linux",
        "0::/caller.service",
        ("unsafe_scope_required", "scoped"),
    ),
]


@pytest.mark.parametrize(("case", "server", "platform", "cgroup", "expected"), TABLE, ids=[row[0] for row in TABLE])
def test_the_plan_truth_table_over_server_proof_and_caller_cgroup(
    tmp_path: Path, case: str, server: TmuxServerProof, platform: str, cgroup: str | None, expected: tuple[str, str]
) -> None:
    """Each combination of server proof and caller cgroup gives its plan code and mode or diagnostic, reading the
    caller's cgroup only when the server is absent.
    """
    probe = FakeProbe(server=server, caller_cgroup=cgroup)
    plan = plan_owner_isolation(plan_json(tmp_path, platform=platform), probe)
    code, detail = expected
    assert plan.code == code
    if isinstance(plan, PlanFailure):
        if detail != "x":
            assert plan.diagnostic == detail
        else:
            assert plan.diagnostic == "target_server_unverifiable"
    else:
        assert plan.execution.mode == detail
    caller_read = bool(probe.named("read_caller_cgroup"))
    assert caller_read == (server.state == "absent")
    assert bool(probe.named("record_attempt")) == (detail == "scoped")
    assert probe.named("probe_server") == [("socket", ["tmux"])]


def test_a_direct_plan_against_a_safe_server_copies_its_identity_and_argv_literally(tmp_path: Path) -> None:
    """A direct plan against a safe server keeps the argv byte for byte and carries the server's pid, start time and
    cgroup.
    """
    plan = plan_owner_isolation(plan_json(tmp_path), FakeProbe())
    assert plan == PlanSuccess(
        "not_required", DirectExecution(ARGV, "owned-session", "socket", False, 1, "1"), SAFE_CGROUP, "safe"
    )
    assert dumps(plan.to_json()) == (
        '{"schema_version":1,"ok":true,"code":"not_required","execution":{"mode":"direct",'
        '"argv":["tmux","new-session","-d","-s","owned-session","a b"],"attempt_session":"owned-session",'
        '"server_key":"socket","server_absent_before":false,"server_pid":1,"server_start_time":"1"},'
        '"classification":{"classification":"safe","scope":"/"},"server_state":"safe"}'
    )


def test_an_absent_server_on_a_non_linux_platform_plans_direct_without_a_pid(tmp_path: Path) -> None:
    """Off Linux, an absent server gives a direct plan with server_absent_before true and a not_applicable
    classification.
    """
    plan = plan_owner_isolation(plan_json(tmp_path, platform="darwin"), FakeProbe(server=TmuxServerProof("absent")))
    assert dumps(plan.to_json()) == (
        '{"schema_version":1,"ok":true,"code":"not_required","execution":{"mode":"direct",'
        '"argv":["tmux","new-session","-d","-s","owned-session","a b"],"attempt_session":"owned-session",'
        '"server_key":"socket","server_absent_before":true},'
        '"classification":{"classification":"not_applicable"},"server_state":"absent"}'
    )


def test_a_scoped_plan_records_one_attempt_and_hands_the_bootstrap_its_stdin_line(tmp_path: Path) -> None:
    """A scoped plan mints a token, records its attempt once, and hands the bootstrap request on stdin, never in the
    argv.
    """
    probe = FakeProbe(server=TmuxServerProof("absent"), caller_cgroup="0::/caller.service")
    plan = plan_owner_isolation(plan_json(tmp_path), probe, now_ms=lambda: 1_767_225_600_000)
    assert isinstance(plan, PlanSuccess)
    execution = plan.execution
    assert execution.mode == "scoped"
    attempt = execution.attempt
    assert probe.named("record_attempt") == [(str(tmp_path), "session", "generation", attempt)]
    assert attempt.expires_at == "2026-01-01T00:00:07.000Z"
    assert attempt.session_name == "owned-session"
    assert attempt.baseline == OwnerGenerationBaseline.absent()
    assert execution.expected_scope == f"gjc-owner-{attempt.token}.scope"
    assert execution.argv[:6] == ("systemd-run", "--user", "--scope", "--quiet", "--unit", execution.expected_scope)
    assert execution.argv[-1] == "--internal-tmux-owner-isolation"
    assert "sh" not in execution.argv
    assert "-c" not in execution.argv
    assert execution.stdin_line not in execution.argv
    assert json.loads(execution.stdin_line) == {
        "schema_version": 1,
        "op": "bootstrap",
        "session_id": "session",
        "owner_generation": "generation",
        "state_dir": str(tmp_path),
        "socket_key": "socket",
        "expected_scope": execution.expected_scope,
        "tmux_argv": ARGV,
        "attempt": attempt.to_json(),
    }


@pytest.mark.parametrize("broken", ["server", "caller"])
def test_a_probe_that_raises_fails_closed(tmp_path: Path, broken: str) -> None:
    """An exception from the server probe or the caller's cgroup reader fails closed as synchronous_probe_failed."""
    probe = FakeProbe(server=TmuxServerProof("absent"), caller_cgroup="0::/")
    if broken == "server":
        probe.server = OSError("boom")
    else:
        probe.caller_cgroup = OSError("boom")
    assert plan_owner_isolation(plan_json(tmp_path), probe) == failure("scope_unavailable", "synchronous_probe_failed")


def test_the_probe_receives_the_control_argv_before_new_session(tmp_path: Path) -> None:
    """For the argv `tmux -L explicit new-session …` the server is probed through `["tmux", "-L", "explicit"]`."""
    probe = FakeProbe()
    plan_owner_isolation(plan_json(tmp_path, tmux_argv=["tmux", "-L", "explicit", "new-session", "-s", "x"]), probe)
    assert probe.named("probe_server") == [("socket", ["tmux", "-L", "explicit"])]


def test_plan_failure_diagnostics_are_sanitised_to_printable_ascii_and_512_characters() -> None:
    """A plan failure's diagnostic turns non-printable ASCII into `?` (two for a non-BMP character) and is cut to 512
    characters.
    """
    assert PlanFailure("scope_unavailable", "a\nb\u00e9\U0001f600").diagnostic == "a?b???"
    assert len(PlanFailure("scope_unavailable", "x" * 600).diagnostic) == 512


def test_safe_diagnostic_cuts_after_replacing_like_the_seed() -> None:
    """A lone surrogate becomes one `?`, and the 512-character cut counts the replaced UTF-16 units."""
    assert safe_diagnostic("\ud800~\x7f ") == "?~? "
    assert safe_diagnostic("\U0001f600" * 300) == "?" * 512


def test_server_proof_safety_and_identity_compare_structure_and_cgroup() -> None:
    """A safe server proof needs a positive safe-integer pid, a start time and a safe cgroup, and two proofs are the
    same server only when pid, start time and cgroup all match.
    """
    assert is_safe_server_proof(SAFE_SERVER)
    assert not is_safe_server_proof(attrs.evolve(SAFE_SERVER, pid=2**53))
    assert not is_safe_server_proof(attrs.evolve(SAFE_SERVER, cgroup=CgroupInfo("not_applicable")))
    assert is_safe_server_proof(attrs.evolve(SAFE_SERVER, cgroup=CgroupInfo("not_applicable")), "darwin")
    assert same_server_identity(SAFE_SERVER, attrs.evolve(SAFE_SERVER, session_names=("a",)))
    assert not same_server_identity(SAFE_SERVER, attrs.evolve(SAFE_SERVER, start_time="2"))
    assert not same_server_identity(SAFE_SERVER, attrs.evolve(SAFE_SERVER, cgroup=CgroupInfo("safe", scope="/x")))


# --- execution with injected dependencies ----------------------------------------------------


@attrs.define
class FakeWorld:
    """Injected spawn/probe/generation/cleanup that count their calls."""

    stdout: str = "$0\n"
    exit_code: int | None = 0
    after: TmuxServerProof | Exception = SAFE_SERVER
    current: list[bool] = attrs.field(factory=lambda: [True, True])
    cleanup_error: Exception | None = None
    spawns: list[tuple[list[str], str | None]] = attrs.field(factory=list)
    probes: list[str] = attrs.field(factory=list)
    cleanups: list[tuple[DirectExecution, str]] = attrs.field(factory=list)

    def deps(self, *, with_generation: bool = True, with_cleanup: bool = True) -> ExecutionDependencies:
        return ExecutionDependencies(
            socket_key="socket",
            spawn=self.spawn,
            probe_server=self.probe,
            is_current_generation=self.is_current if with_generation else None,
            cleanup_spawned=self.cleanup if with_cleanup else None,
        )

    def spawn(self, argv: Sequence[str], stdin_line: str | None) -> SpawnResult:
        self.spawns.append((list(argv), stdin_line))
        return SpawnResult(self.exit_code, self.stdout)

    def probe(self, socket_key: str) -> TmuxServerProof:
        self.probes.append(socket_key)
        if isinstance(self.after, Exception):
            raise self.after
        return self.after

    def is_current(self) -> bool:
        return self.current.pop(0)

    def cleanup(self, execution: DirectExecution, native_session_id: str, server: TmuxServerProof) -> None:
        self.cleanups.append((execution, native_session_id))
        if self.cleanup_error is not None:
            raise self.cleanup_error


def direct_plan(*, absent_before: bool = False, pid: int | None = 1, start: str | None = "1") -> PlanSuccess:
    execution = DirectExecution(ARGV, "owned-session", "socket", absent_before, pid, start)
    return PlanSuccess("not_required", execution, SAFE_CGROUP, "absent" if absent_before else "safe")


def scoped_plan(tmp_path: Path) -> PlanSuccess:
    probe = FakeProbe(server=TmuxServerProof("absent"), caller_cgroup="0::/caller.service")
    plan = plan_owner_isolation(plan_json(tmp_path), probe)
    assert isinstance(plan, PlanSuccess)
    return plan


RECEIPT = (
    '{"schema_version":1,"ok":true,"code":"bootstrapped","native_session_id":"$0",'
    '"server_pid":12,"server_start_time":"34","session_name":"owned-session"}\n'
)


def test_a_failed_plan_passes_through_without_spawning() -> None:
    """Executing a failed plan returns its code and diagnostic and spawns nothing."""
    world = FakeWorld()
    result = execute_plan(PlanFailure("server_unsafe", "target_server_unsafe"), world.deps())
    assert result == ExecutionFailure("server_unsafe", "target_server_unsafe")
    assert world.spawns == []


def test_a_direct_plan_for_a_stale_generation_is_refused_before_spawning() -> None:
    """A direct plan whose generation is no longer current before the spawn is owner_generation_stale and spawns
    nothing.
    """
    world = FakeWorld(current=[False])
    assert execute_plan(direct_plan(), world.deps()) == ExecutionFailure(
        "scope_bootstrap_failed", "owner_generation_stale"
    )
    assert world.spawns == []


@pytest.mark.parametrize("exit_code", [1, None])
def test_a_failed_spawn_is_planned_spawn_failed(exit_code: int | None) -> None:
    """A spawn with a non-zero or missing exit code is planned_spawn_failed."""
    world = FakeWorld(exit_code=exit_code)
    assert execute_plan(direct_plan(), world.deps()).diagnostic == "planned_spawn_failed"  # type: ignore[union-attr]  # the result is a failure


def test_a_scoped_execution_spawns_with_stdin_and_reproves_the_receipts_server(tmp_path: Path) -> None:
    """A scoped execution spawns the planned argv with its stdin line and re-proves the server named by the receipt
    through the attempt's socket.
    """
    plan = scoped_plan(tmp_path)
    world = FakeWorld(stdout=RECEIPT, after=TmuxServerProof("safe", 12, "34", SAFE_CGROUP))
    result = execute_plan(plan, world.deps())
    assert isinstance(result, ExecutionSuccess)
    assert world.spawns == [(list(plan.execution.argv), plan.execution.stdin_line)]  # type: ignore[union-attr]  # the plan is scoped
    assert world.probes == ["socket"]
    assert (result.server_key, result.server_pid, result.server_start_time) == ("socket", 12, "34")
    assert (result.server_session, result.native_session_id) == ("owned-session", "$0")


def test_a_scoped_receipt_from_a_replaced_server_is_a_race(tmp_path: Path) -> None:
    """A receipt naming another server than the one the re-proof sees is bootstrap_server_identity_changed."""
    world = FakeWorld(stdout=RECEIPT, after=TmuxServerProof("safe", 13, "35", SAFE_CGROUP))
    assert execute_plan(scoped_plan(tmp_path), world.deps()) == ExecutionFailure(
        "server_race", "bootstrap_server_identity_changed"
    )


@pytest.mark.parametrize("stdout", ["", "not-json", RECEIPT.replace('"ok":true', '"ok":false'), RECEIPT + "x"])
def test_a_scoped_execution_without_an_exact_receipt_fails(tmp_path: Path, stdout: str) -> None:
    """A scoped execution whose stdout is not exactly one success receipt is scoped_bootstrap_receipt_invalid."""
    world = FakeWorld(stdout=stdout)
    result = execute_plan(scoped_plan(tmp_path), world.deps())
    assert result == ExecutionFailure("scope_bootstrap_failed", "scoped_bootstrap_receipt_invalid")


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (TmuxServerProof("unverifiable"), ("server_unverifiable", "target_server_unverifiable")),
        (TmuxServerProof("unsafe"), ("server_unsafe", "target_server_unsafe")),
        (TmuxServerProof("safe", 1, "after", SAFE_CGROUP), ("server_race", "target_server_identity_changed")),
        (OSError("probe"), ("scope_bootstrap_failed", "synchronous_execution_failed")),
    ],
)
def test_a_direct_reproof_that_does_not_match_fails_closed(after: Any, expected: tuple[str, str]) -> None:
    """An unverifiable, unsafe or different server after a direct spawn, or a raising probe, fails closed with its own
    code.
    """
    result = execute_plan(direct_plan(), FakeWorld(after=after).deps())
    assert result == ExecutionFailure(*expected)  # type: ignore[arg-type]  # codes as plain str


def test_a_direct_execution_keeps_only_a_native_session_id_of_the_dollar_form() -> None:
    """A direct spawn's stdout `$3` becomes the native session id, while `%1` is left out of the success."""
    assert execute_plan(direct_plan(), FakeWorld(stdout="$3\n").deps()).native_session_id == "$3"  # type: ignore[union-attr]  # the result is a success
    result = execute_plan(direct_plan(), FakeWorld(stdout="%1\n").deps())
    assert isinstance(result, ExecutionSuccess)
    assert result.native_session_id is None
    assert "native_session_id" not in result.to_json()


def test_a_server_created_by_the_spawn_is_accepted_when_structurally_safe() -> None:
    """With no server before the spawn, a structurally safe new server afterwards is accepted as the proved server."""
    result = execute_plan(direct_plan(absent_before=True, pid=None, start=None), FakeWorld(after=SAFE_SERVER).deps())
    assert isinstance(result, ExecutionSuccess)
    assert (result.server_pid, result.server_start_time) == (1, "1")


def test_a_non_linux_plan_accepts_a_not_applicable_reproof() -> None:
    """A plan classified not_applicable re-proves its server with the non-Linux rules."""
    server = TmuxServerProof("safe", 1, "not_applicable", CgroupInfo("not_applicable"))
    plan = PlanSuccess(
        "not_required",
        DirectExecution(ARGV, "owned-session", "socket", False, 1, "not_applicable"),
        CgroupInfo("not_applicable"),
        "safe",
    )
    assert isinstance(execute_plan(plan, FakeWorld(after=server).deps()), ExecutionSuccess)


STALE = ExecutionFailure("scope_bootstrap_failed", "owner_generation_stale")
UNCERTAIN = ExecutionFailure("scope_bootstrap_failed", "owner_generation_stale_cleanup_uncertain")


def test_a_generation_gone_stale_during_the_spawn_cleans_the_spawned_session() -> None:
    """A generation gone stale during the spawn on the same proved server cleans the spawned `$0` once and is
    owner_generation_stale.
    """
    world = FakeWorld(current=[True, False])
    assert execute_plan(direct_plan(), world.deps()) == STALE
    assert [(execution.attempt_session, native) for execution, native in world.cleanups] == [("owned-session", "$0")]


@pytest.mark.parametrize(
    ("world", "plan", "cleanup_calls"),
    [
        (FakeWorld(current=[True, False], stdout=""), direct_plan(), 0),  # no session id
        (FakeWorld(current=[True, False], cleanup_error=RuntimeError("x")), direct_plan(), 1),  # cleanup fails
        (
            FakeWorld(current=[True, False], after=TmuxServerProof("safe", 99, "replacement", SAFE_CGROUP)),
            direct_plan(),
            0,
        ),  # another server
        (FakeWorld(current=[True, False], after=OSError("probe")), direct_plan(), 0),  # the probe raises
        (FakeWorld(current=[True, False]), direct_plan(absent_before=True, pid=None, start=None), 0),  # new server
        (FakeWorld(current=[True, False], after=TmuxServerProof("unsafe")), direct_plan(), 0),  # unsafe server
        (FakeWorld(current=[True, False], after=TmuxServerProof("unverifiable")), direct_plan(), 0),
    ],
)
def test_an_uncertain_stale_cleanup_is_reported_and_never_guessed(
    world: FakeWorld, plan: PlanSuccess, cleanup_calls: int
) -> None:
    """A stale spawn with no session id, a failing cleanup, another, new, unsafe or unverifiable server, or a raising
    probe reports cleanup_uncertain and never guesses.
    """
    assert execute_plan(plan, world.deps()) == UNCERTAIN
    assert len(world.cleanups) == cleanup_calls


def test_a_stale_spawn_without_a_cleanup_dependency_is_uncertain() -> None:
    """A spawn gone stale without a cleanup dependency reports cleanup_uncertain."""
    assert execute_plan(direct_plan(), FakeWorld(current=[True, False]).deps(with_cleanup=False)) == UNCERTAIN
