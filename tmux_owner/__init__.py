"""tmux_owner: launch, supervise and close tmux-hosted agent owners through file evidence.

Independent of :mod:`admission_plane`; no SQLAlchemy. The public surface is re-exported
here through ``__all__``; the private modules are free to change. All lifecycle files of
a session live in ``<state_dir>/<session_id>/owner-lifecycle/`` (see :func:`lifecycle_paths`).

The behaviour, the JSON records byte for byte and the error codes are those of the original
TypeScript implementation, which the docstrings call *the seed*; what this package adds
on top is marked "beyond the seed".

Plan, then execute, a direct tmux session (the target server is re-proved after the spawn)::

    from tmux_owner import (
        ExecutionDependencies, PlanRequest, TmuxProbe, capture_owner_generation_baseline,
        execute_plan, is_owner_generation_baseline_current, kill_spawned_session,
        plan_owner_isolation, spawn_tmux,
    )

    baseline = capture_owner_generation_baseline(state_dir, "session")
    control = ["tmux", "-S", "/run/user/1000/owner.sock"]
    request = PlanRequest(
        platform="linux", session_id="session", owner_generation="g1", cwd=state_dir,
        state_dir=state_dir, socket_key="owner-socket", baseline=baseline,
        tmux_argv=[*control, "new-session", "-d", "-s", "owner", "-P", "-F", "#{session_id}"],
    )
    probe = TmuxProbe(control)
    plan = plan_owner_isolation(request, probe)  # PlanSuccess (direct or scoped) or PlanFailure
    result = execute_plan(plan, ExecutionDependencies(
        socket_key="owner-socket", spawn=spawn_tmux, probe_server=probe.probe_server,
        is_current_generation=lambda: is_owner_generation_baseline_current(state_dir, "session", baseline),
        cleanup_spawned=kill_spawned_session,
    ))  # ExecutionSuccess(server_pid=..., native_session_id="$3") or ExecutionFailure

Publish a generation (compare-and-set against the baseline the caller saw)::

    published = publish_owner_generation(PublishGenerationRequest(
        session_id="session", owner_generation="g1", state_dir=state_dir, baseline=baseline))

Create the one SIGTERM intent of a generation, before signalling its owner::

    intent = create_owner_intent(
        state_dir, generation="g1", session_id="session", server_key="owner-socket",
        dispatch_id="dispatch-7", created_at=now, expires_at=in_thirty_seconds)

Observe how an owner ended; the first valid verdict of a generation wins forever::

    verdict = observe_owner_terminal(ObserveTerminalRequest(
        session_id="session", owner_generation="g1", state_dir=state_dir, socket_key="owner-socket",
        observer="sidecar", observed_at=now, signal="SIGTERM", exit_code=None,
        exit_kind="owner_lost", reason="sidecar", operator_dispatch_id="dispatch-7"))

Close an exact owner: prove its pid by start time, write the intent, SIGTERM, await the verdict::

    verdict = close_exact_tmux_owner(ExactOwnerCloseRequest(
        state_dir=state_dir, session_id="session", generation="g1", server_key="owner-socket",
        pid=owner_pid, start_time=read_linux_proc_start_time(owner_pid), dispatch_id="dispatch-7",
        created_at=now, expires_at=in_thirty_seconds))

The one-line JSON protocol (``plan``, ``bootstrap``, ``publish_generation``,
``observe_terminal``): one request line of at most 16 KiB on stdin, one response line on
stdout; :func:`parse_request`, :func:`handle_request` and :func:`serialize_response` do
the same in process::

    $ echo '{"schema_version":1,"op":"publish_generation",...}' | python -m tmux_owner
    {"schema_version":1,"ok":true,"code":"generation_published","generation":"g1"}

Errors: refusals raise :class:`TmuxOwnerError` whose ``code`` is the seed's bare code
(``generation_replay``, ``verdict_lock_contended``, ...); a malformed record raises
:class:`InvalidRecordError`.

Files: a record appears under its name whole or not at all (a fsynced temporary file,
then a rename or, for immutable records, a hard link that never replaces), so a process
killed at any moment leaves the old state or the new one. Nothing below ``state_dir`` is
followed through a symlink (``untrusted_root``, ``untrusted_lifecycle_file``); the state
directory itself may be one.
"""

from ._bootstrap import BootstrapDependencies, BootstrapRequest, BootstrapResult, bootstrap_owner_isolation
from ._cgroup import CgroupInfo, classify_cgroup
from ._close import ExactOwnerCloseDependencies, ExactOwnerCloseRequest, close_exact_tmux_owner
from ._errors import InvalidRecordError, TmuxOwnerError
from ._execute import (
    ExecutionDependencies,
    ExecutionFailure,
    ExecutionSuccess,
    SpawnResult,
    execute_plan,
    is_exact_scoped_bootstrap_success_receipt,
)
from ._files import LifecyclePaths, lifecycle_paths, memory_guard_claim_paths
from ._generations import (
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
from ._intents import OwnerIntent, create_owner_intent
from ._plan import OwnerIsolationProbe, plan_owner_isolation
from ._plan_records import (
    AttemptCapability,
    DirectExecution,
    PersistedAttempt,
    PlanFailure,
    PlanRequest,
    PlanSuccess,
    ScopedExecution,
)
from ._predecessor import ManagedOwnerPredecessorEvidence, resolve_managed_owner_predecessor
from ._procstat import owner_process_start_time, parse_linux_proc_start_time, read_linux_proc_start_time
from ._protocol import handle_request, parse_request, serialize_response
from ._recovery_fs import RecoveryFsRoot, open_recovery_fs_root
from ._server_proof import TmuxServerProof, is_safe_server_proof, same_server_identity
from ._timestamps import is_canonical_utc_timestamp
from ._tmux import TmuxProbe, kill_spawned_session, spawn_tmux
from ._verdict_records import (
    ObserveTerminalRequest,
    OwnerIncident,
    OwnerVerdict,
    is_valid_owner_intent,
    is_valid_owner_verdict,
)
from ._verdicts import observe_owner_terminal

__all__ = [
    "AttemptCapability",
    "BootstrapDependencies",
    "BootstrapRequest",
    "BootstrapResult",
    "CgroupInfo",
    "DirectExecution",
    "ExactOwnerCloseDependencies",
    "ExactOwnerCloseRequest",
    "ExecutionDependencies",
    "ExecutionFailure",
    "ExecutionSuccess",
    "GenerationRecord",
    "InvalidRecordError",
    "LifecyclePaths",
    "ManagedOwnerPredecessorEvidence",
    "ObserveTerminalRequest",
    "OwnerGenerationBaseline",
    "OwnerIncident",
    "OwnerIntent",
    "OwnerIsolationProbe",
    "OwnerVerdict",
    "PersistedAttempt",
    "PlanFailure",
    "PlanRequest",
    "PlanSuccess",
    "PublishGenerationRequest",
    "PublishGenerationResult",
    "RecoveryFsRoot",
    "ScopedExecution",
    "SpawnResult",
    "TmuxOwnerError",
    "TmuxProbe",
    "TmuxServerProof",
    "bootstrap_owner_isolation",
    "capture_owner_generation_baseline",
    "classify_cgroup",
    "close_exact_tmux_owner",
    "create_owner_intent",
    "execute_plan",
    "handle_request",
    "is_canonical_utc_timestamp",
    "is_exact_scoped_bootstrap_success_receipt",
    "is_owner_generation_baseline_current",
    "is_safe_server_proof",
    "is_valid_owner_intent",
    "is_valid_owner_verdict",
    "kill_spawned_session",
    "lifecycle_paths",
    "memory_guard_claim_paths",
    "observe_owner_terminal",
    "open_recovery_fs_root",
    "owner_process_start_time",
    "parse_linux_proc_start_time",
    "parse_request",
    "plan_owner_isolation",
    "publish_owner_generation",
    "read_linux_proc_start_time",
    "replace_owner_generation",
    "resolve_managed_owner_predecessor",
    "same_owner_generation_baseline",
    "same_server_identity",
    "serialize_response",
    "spawn_tmux",
]
