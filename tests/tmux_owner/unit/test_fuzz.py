"""Fuzz: hostile values at the ``tmux-owner`` protocol and at the public entry points only ever get documented answers.

Hostile means wrong types, NaN and infinities, huge and negative integers, empty and huge
strings, NUL, lone surrogates and deeply nested JSON. Every call must either succeed or
answer a documented refusal: a :class:`TmuxOwnerError` (or :class:`InvalidRecordError`)
whose code is in ``tmux_owner._errors.CODES``, or a protocol line with ``ok: false`` and a
documented diagnostic, never ``internal_error``. A refused call must leave the state
directory exactly as it was (names, modes and bytes).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tmux_support import GENERATION, SESSION, intent_args, observe_request_json

import tmux_owner
from tmux_owner import (
    AttemptCapability,
    BootstrapDependencies,
    BootstrapRequest,
    ExactOwnerCloseDependencies,
    ExactOwnerCloseRequest,
    GenerationRecord,
    InvalidRecordError,
    ObserveTerminalRequest,
    OwnerGenerationBaseline,
    OwnerIncident,
    OwnerIntent,
    OwnerVerdict,
    PersistedAttempt,
    PlanRequest,
    PublishGenerationRequest,
    PublishGenerationResult,
    RecoveryFsRoot,
    SpawnResult,
    TmuxOwnerError,
    TmuxServerProof,
    capture_owner_generation_baseline,
    create_owner_intent,
    replace_owner_generation,
)
from tmux_owner._cgroup import CgroupInfo
from tmux_owner._errors import CODES
from tmux_owner._protocol import run_protocol

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Every diagnostic a protocol failure line may carry.
DIAGNOSTICS = frozenset(
    {
        "invalid_json_line", "response_too_large", "generation_publication_failed", "terminal_observation_failed",
        "invalid_plan_request", "attempt_session_missing", "owner_generation_stale", "synchronous_probe_failed",
        "target_server_unsafe", "target_server_unverifiable", "caller_cgroup_unverifiable",
        "cgroup_metadata_missing", "cgroup_metadata_malformed", "cgroup_ownership_unproven",
        "invalid_bootstrap_request", "generation_lock_contended", "attempt_capability_invalid",
        "attempt_capability_expired", "attempt_capability_replayed", "tmux_control_argv_invalid",
        "scope_self_proof_failed", "tmux_spawn_failed", "native_session_identity_unavailable_cleanup_uncertain",
        "server_proof_failed_cleanup_uncertain", "bootstrap_cleanup_uncertain", "bootstrap_execution_failed",
    }
)  # fmt: skip
PROTOCOL_CODES = frozenset(
    {"scope_unavailable", "scope_bootstrap_failed", "server_unsafe", "server_unverifiable", "server_race"}
)
SPECIAL_STRINGS = [
    "", " ", "\0", "a\0b", "\ud800", "\udfff", "x\udc80y", "../escape", ".", "..", "/",
    "a/b", "\n", "\r", "NaN", "Infinity", "😀", "generation", "session",
]  # fmt: skip
SPECIAL_NUMBERS = [math.nan, math.inf, -math.inf, 2**53, -(2**53), 2**64, -(2**64), 10**400, -1, 0, 1, 1.5, -0.0]


def deep(depth: int, kind: str) -> Any:
    """A Python list or dict nested ``depth`` levels deep, built without recursion."""
    value: Any = [] if kind == "list" else {}
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


# Huge strings are built on demand, so no strategy carries (or prints) them.
HUGE_STRINGS = st.builds(str.__mul__, st.sampled_from(["x", "é", "\ud800", "/"]), st.integers(200, 20_000))
JSON_SCALARS = st.one_of(
    st.none(),
    HUGE_STRINGS,
    st.booleans(),
    st.integers(),
    st.floats(),
    st.sampled_from(SPECIAL_NUMBERS),
    st.sampled_from(SPECIAL_STRINGS),
    st.text(max_size=12),
)
# What JSON text can say (with NaN, infinities and lone surrogates), shallow.
JSONISH = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
# What a Python caller can pass: also bytes, paths, arbitrary objects and very deep nesting.
HOSTILE = (
    JSONISH
    | st.binary(max_size=4)
    | st.sampled_from([Path("/"), Path(""), object(), print, (), frozenset()])
    | st.builds(deep, st.integers(900, 5_000), st.sampled_from(["list", "dict"]))
)


def snapshot(top: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry below ``top`` with its mode and content (a symlink's target, a directory's nothing)."""
    entries: dict[str, tuple[int, bytes]] = {}
    for directory, names, files in os.walk(top):
        for name in names + files:
            path = Path(directory, name)
            info = path.lstat()
            content = path.read_bytes() if stat.S_ISREG(info.st_mode) else b""
            entries[str(path.relative_to(top))] = (info.st_mode, content)
    return entries


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory with the usual generation published and its SIGTERM intent pending."""
    top = tmp_path_factory.mktemp("fuzz") / "state"
    replace_owner_generation(top, SESSION, GENERATION)
    create_owner_intent(top, **intent_args())
    return top


@contextmanager
def fresh_state(template: Path) -> Iterator[Path]:
    """A copy of ``template``, with the working directory moved deep into the same scratch directory.

    A hostile relative state directory (``..``, ``ok``) then lands in the scratch directory too.
    """
    with tempfile.TemporaryDirectory() as scratch:
        state = Path(scratch) / "state"
        shutil.copytree(template, state)
        cwd = Path(scratch, "a", "b", "c", "d")
        cwd.mkdir(parents=True)
        previous = Path.cwd()
        os.chdir(cwd)
        try:
            yield state
        finally:
            os.chdir(previous)


def confined(value: Any) -> bool:
    """Whether ``value``, used as a state directory, cannot name anything outside the scratch directory."""
    if not isinstance(value, str | os.PathLike):
        return True
    text = os.fspath(value)
    return not isinstance(text, str) or ("\0" in text or (not text.startswith("/") and text.count("..") <= 2))


class FakeProbe:
    """A probe that never runs tmux: the server is absent and the caller's cgroup is the safe root."""

    def read_caller_cgroup(self) -> str | None:
        return "0::/"

    def probe_server(self, socket_key: str, control_argv: Sequence[str] | None = None) -> TmuxServerProof:
        return TmuxServerProof("absent")

    def record_attempt(self, *, state_dir: str, session_id: str, generation: str, attempt: AttemptCapability) -> None:
        raise AssertionError("a safe caller cgroup never records an attempt")


def fake_bootstrap_deps() -> BootstrapDependencies:
    return BootstrapDependencies(
        read_self_cgroup=lambda: "0::/",
        spawn=lambda _argv: SpawnResult(1, ""),
        probe_server=lambda _key, _argv: TmuxServerProof("absent"),
    )


def valid_requests(state: Path) -> dict[str, dict[str, Any]]:
    """One valid request of each protocol operation against ``state``."""
    baseline = capture_owner_generation_baseline(state, SESSION).to_json()
    attempt = {
        "token": "token",
        "session_name": "owned",
        "socket_key": "socket",
        "server_absent_before": True,
        "baseline": baseline,
        "expires_at": "2026-01-01T00:00:07.000Z",
    }
    common = {"schema_version": 1, "session_id": SESSION, "owner_generation": GENERATION, "state_dir": str(state)}
    argv = ["tmux", "new-session", "-s", "owned"]
    return {
        "plan": {**common, "op": "plan", "platform": "linux", "cwd": "/", "socket_key": "socket",
                 "tmux_argv": argv, "baseline": baseline},
        "bootstrap": {**common, "op": "bootstrap", "socket_key": "socket", "expected_scope": "gjc-owner-token.scope",
                      "tmux_argv": argv, "attempt": attempt},
        "publish_generation": {**common, "op": "publish_generation", "owner_generation": "fresh",
                               "baseline": baseline},
        "observe_terminal": observe_request_json(state, operator_dispatch_id="dispatch"),
    }  # fmt: skip


def hostile_line(data: st.DataObject, request: dict[str, Any]) -> bytes:
    """``request`` with one hostile change, as the raw bytes of a request line."""
    how = data.draw(st.sampled_from(["replace", "nest", "drop", "add", "text", "value"]))
    value = dict(request)
    keys = sorted(value)
    if how == "text":
        text = data.draw(st.sampled_from(SPECIAL_STRINGS) | HUGE_STRINGS | st.text(max_size=40))
        return text.encode("utf-8", "surrogatepass")
    if how == "value":
        value = data.draw(JSONISH)
    elif how == "drop":
        del value[data.draw(st.sampled_from(keys))]
    elif how == "add":
        value[data.draw(st.text(max_size=8))] = data.draw(JSONISH)
    elif how == "nest":
        key = data.draw(st.sampled_from(keys))
        depth = data.draw(st.integers(1, 5_000))
        text = json.dumps({**value, key: "__HOSTILE__"})
        return text.replace('"__HOSTILE__"', "[" * depth + "]" * depth).encode()
    else:
        value[data.draw(st.sampled_from(keys))] = data.draw(JSONISH)
    text = json.dumps(value, allow_nan=True, ensure_ascii=data.draw(st.booleans()))
    return text.encode("utf-8", "surrogatepass")


@FUZZ
@given(data=st.data())
def test_the_protocol_answers_every_hostile_line_with_a_documented_line(template: Path, data: st.DataObject) -> None:
    """Any hostile request line gets one JSON response line: a success, or ok:false with a documented code and
    diagnostic (never internal_error) that left the state directory unchanged.
    """
    with fresh_state(template) as state:
        request = valid_requests(state)[data.draw(st.sampled_from(["plan", "bootstrap", "publish_generation",
                                                                    "observe_terminal"]))]  # fmt: skip
        line = hostile_line(data, request)
        before = snapshot(state)
        output, status = run_protocol(line, probe=FakeProbe(), bootstrap_deps=fake_bootstrap_deps())
        response = json.loads(output)
        assert "\n" not in output
        assert isinstance(response, dict)
        # A success is the operation's record (an observation answers with the verdict itself).
        if response.get("ok") is False:
            assert response["code"] in PROTOCOL_CODES, response
            assert response["diagnostic"] in DIAGNOSTICS, response
            assert status in (0, 1)
            assert snapshot(state) == before


RECORDS: list[type[Any]] = [
    ObserveTerminalRequest, PublishGenerationRequest, PublishGenerationResult, PlanRequest, BootstrapRequest,
    OwnerVerdict, OwnerIncident, OwnerIntent, GenerationRecord, OwnerGenerationBaseline, AttemptCapability,
    PersistedAttempt, CgroupInfo,
]  # fmt: skip


def refusal(call: Callable[[], object]) -> TmuxOwnerError | None:
    """The TmuxOwnerError ``call`` raised, or ``None`` if it returned; any other exception propagates."""
    try:
        call()
    except TmuxOwnerError as error:
        return error
    return None


@FUZZ
@given(record=st.sampled_from(RECORDS), value=HOSTILE)
def test_every_record_parser_refuses_hostile_json_with_invalid_record(record: type[Any], value: Any) -> None:
    """Each record's from_json turns any hostile value into a record or an InvalidRecordError, nothing else."""
    error = refusal(lambda: record.from_json(value))
    assert error is None or (isinstance(error, InvalidRecordError) and error.code == "invalid_record")


def close_with(state: Path, key: str, value: Any) -> object:
    request: dict[str, Any] = {
        "state_dir": state, "session_id": SESSION, "generation": GENERATION, "server_key": "socket", "pid": 4242,
        "start_time": "1234", "dispatch_id": "another", "created_at": "2026-01-01T00:00:00.000Z",
        "expires_at": "2099-01-01T00:00:00.000Z",
    }  # fmt: skip
    deps = ExactOwnerCloseDependencies(
        read_start_time=lambda _pid: "1234", send_sigterm=lambda _pid: None, wait_for_verdict=lambda: None
    )
    return tmux_owner.close_exact_tmux_owner(ExactOwnerCloseRequest(**{**request, key: value}), deps)


def intent_with(state: Path, key: str, value: Any) -> object:
    return tmux_owner.create_owner_intent(state, **intent_args(**{key: value}))


def observe_with(state: Path, key: str, value: Any) -> object:
    return tmux_owner.observe_owner_terminal({**observe_request_json(state), key: value})


def recovery_read(state: Path, relative: Any, max_bytes: Any) -> object:
    with RecoveryFsRoot.open(state.resolve()) as root:
        return root.read(relative, max_bytes)


def baseline_of(state: Path) -> OwnerGenerationBaseline:
    return capture_owner_generation_baseline(state, SESSION)


def each_field(
    prefix: str, call: Callable[[Path, str, Any], object], keys: Sequence[str]
) -> dict[str, Callable[[Path, Any], object]]:
    """One entry point per field ``key``: ``call(state, key, hostile)``."""

    def bind(key: str) -> Callable[[Path, Any], object]:
        return lambda state, hostile: call(state, key, hostile)

    return {f"{prefix}/{key}": bind(key) for key in keys}


def execute(plan: Any) -> object:
    deps = tmux_owner.ExecutionDependencies(
        socket_key="socket",
        spawn=lambda _argv, _stdin=None: SpawnResult(1, ""),
        probe_server=lambda _key: TmuxServerProof("absent"),
    )
    return tmux_owner.execute_plan(plan, deps)


OBSERVE_FIELDS = (
    "session_id", "owner_generation", "state_dir", "socket_key", "observed_at", "signal", "exit_code", "exit_kind",
    "reason", "operator_dispatch_id",
)  # fmt: skip
CLOSE_FIELDS = (
    "state_dir", "session_id", "generation", "server_key", "pid", "start_time", "dispatch_id", "created_at",
    "expires_at",
)  # fmt: skip

# Each entry point with its arguments as a function of the state directory and one hostile value.
ENTRY_POINTS: dict[str, Callable[[Path, Any], object]] = {
    "capture/state_dir": lambda _s, h: tmux_owner.capture_owner_generation_baseline(h, SESSION),
    "capture/session_id": lambda s, h: tmux_owner.capture_owner_generation_baseline(s, h),
    "is_current/state_dir": lambda s, h: tmux_owner.is_owner_generation_baseline_current(h, SESSION, baseline_of(s)),
    "is_current/baseline": lambda s, h: tmux_owner.is_owner_generation_baseline_current(s, SESSION, h),
    "replace/state_dir": lambda _s, h: tmux_owner.replace_owner_generation(h, SESSION, "fresh"),
    "replace/session_id": lambda s, h: tmux_owner.replace_owner_generation(s, h, "fresh", baseline_of(s)),
    "replace/generation": lambda s, h: tmux_owner.replace_owner_generation(s, SESSION, h, baseline_of(s)),
    "replace/baseline": lambda s, h: tmux_owner.replace_owner_generation(s, SESSION, "fresh", h),
    "publish/request": lambda _s, h: tmux_owner.publish_owner_generation(h),
    "publish/state_dir": lambda s, h: tmux_owner.publish_owner_generation(
        {**valid_requests(s)["publish_generation"], "state_dir": h}
    ),
    "same_baseline": lambda s, h: tmux_owner.same_owner_generation_baseline(baseline_of(s), h),
    "create_intent/state_dir": lambda _s, h: tmux_owner.create_owner_intent(h, **intent_args(generation="g2")),
    **each_field(
        "create_intent",
        intent_with,
        ("generation", "session_id", "server_key", "dispatch_id", "created_at", "expires_at"),
    ),
    "observe/request": lambda _s, h: tmux_owner.observe_owner_terminal(h),
    **each_field("observe", observe_with, OBSERVE_FIELDS),
    "close/request": lambda _s, h: tmux_owner.close_exact_tmux_owner(h),
    **each_field("close", close_with, CLOSE_FIELDS),
    "predecessor/state_dir": lambda s, h: tmux_owner.resolve_managed_owner_predecessor(h, SESSION, baseline_of(s)),
    "predecessor/session_id": lambda s, h: tmux_owner.resolve_managed_owner_predecessor(s, h, baseline_of(s)),
    "predecessor/baseline": lambda s, h: tmux_owner.resolve_managed_owner_predecessor(s, SESSION, h),
    "bootstrap/request": lambda _s, h: tmux_owner.bootstrap_owner_isolation(h, fake_bootstrap_deps()),
    "plan/request": lambda _s, h: tmux_owner.plan_owner_isolation(h, FakeProbe()),
    "execute/plan": lambda _s, h: execute(h),
    "lifecycle_paths/state_dir": lambda _s, h: tmux_owner.lifecycle_paths(h, SESSION, GENERATION),
    "lifecycle_paths/session_id": lambda s, h: tmux_owner.lifecycle_paths(s, h, GENERATION),
    "lifecycle_paths/generation": lambda s, h: tmux_owner.lifecycle_paths(s, SESSION, h),
    "memory_guard_claim_paths": lambda s, h: tmux_owner.memory_guard_claim_paths(s, h),
    "open_recovery_fs_root": lambda _s, h: tmux_owner.open_recovery_fs_root(h),
    "recovery_read/relative": lambda s, h: recovery_read(s, h, 1024),
    "recovery_read/max_bytes": lambda s, h: recovery_read(s, f"{SESSION}/owner-lifecycle/generation.json", h),
    "parse_request": lambda _s, h: tmux_owner.parse_request(h),
    "serialize_response": lambda _s, h: tmux_owner.serialize_response(h),
    "handle_request": lambda _s, h: tmux_owner.handle_request(h),
    "classify_cgroup/platform": lambda _s, h: tmux_owner.classify_cgroup(h, "0::/"),
    "classify_cgroup/text": lambda _s, h: tmux_owner.classify_cgroup("linux", h),
    "is_canonical_utc_timestamp": lambda _s, h: tmux_owner.is_canonical_utc_timestamp(h),
    "parse_linux_proc_start_time": lambda _s, h: tmux_owner.parse_linux_proc_start_time(h),
    "owner_process_start_time/platform": lambda _s, h: tmux_owner.owner_process_start_time(h, "1 (x) S 0"),
    "owner_process_start_time/stat": lambda _s, h: tmux_owner.owner_process_start_time("linux", h),
    "read_linux_proc_start_time": lambda _s, h: tmux_owner.read_linux_proc_start_time(h),
    "is_safe_server_proof/proof": lambda _s, h: tmux_owner.is_safe_server_proof(h),
    "is_safe_server_proof/platform": lambda _s, h: tmux_owner.is_safe_server_proof(TmuxServerProof("absent"), h),
    "same_server_identity": lambda _s, h: tmux_owner.same_server_identity(TmuxServerProof("absent"), h),
    "is_valid_owner_intent/value": lambda _s, h: tmux_owner.is_valid_owner_intent(h),
    "is_valid_owner_intent/request": lambda _s, h: tmux_owner.is_valid_owner_intent({}, h),
    "is_valid_owner_verdict/value": lambda _s, h: tmux_owner.is_valid_owner_verdict(h),
    "is_valid_owner_verdict/request": lambda _s, h: tmux_owner.is_valid_owner_verdict({}, h),
    "is_exact_receipt": lambda _s, h: tmux_owner.is_exact_scoped_bootstrap_success_receipt(h),
}


@FUZZ
@given(data=st.data(), name=st.sampled_from(sorted(ENTRY_POINTS)))
def test_every_public_entry_point_answers_hostile_arguments_with_a_documented_refusal(
    template: Path, data: st.DataObject, name: str
) -> None:
    """Each public entry point given one hostile argument returns, or raises a TmuxOwnerError with a documented code,
    and a refused call leaves the state directory unchanged.
    """
    # A state directory slot never gets a real absolute path: the call could write there.
    hostile = data.draw(HOSTILE.filter(confined) if "state_dir" in name else HOSTILE)
    with fresh_state(template) as state:
        before = snapshot(state)
        error = refusal(lambda: ENTRY_POINTS[name](state, hostile))
        if error is not None:
            assert error.code in CODES, (name, error.code)
            assert snapshot(state) == before
