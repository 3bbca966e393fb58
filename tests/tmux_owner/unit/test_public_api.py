"""The public surface: what ``tmux_owner`` exports, and what importing it must not pull in.

Each check runs in a fresh interpreter in the project root: there, and in every
consumer, ``tmux_owner`` is the real package. Inside a ``pytest`` run started as
``.venv/bin/pytest``, ``tests/`` is on ``sys.path`` and ``tests/tmux_owner`` would shadow
the package as a namespace package of the same name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tmux_support import PROJECT

# The names the package promises; a removal or rename is a breaking change.
PROMISED = {
    "TmuxOwnerError", "InvalidRecordError", "is_canonical_utc_timestamp",
    "LifecyclePaths", "lifecycle_paths", "memory_guard_claim_paths",
    "CgroupInfo", "classify_cgroup",
    "owner_process_start_time", "parse_linux_proc_start_time", "read_linux_proc_start_time",
    "TmuxServerProof", "PlanRequest", "AttemptCapability", "PersistedAttempt", "DirectExecution",
    "ScopedExecution", "PlanSuccess", "PlanFailure", "ExecutionSuccess", "ExecutionFailure",
    "ExecutionDependencies", "SpawnResult", "OwnerIsolationProbe", "TmuxProbe", "is_safe_server_proof",
    "same_server_identity", "plan_owner_isolation", "execute_plan",
    "BootstrapRequest", "BootstrapResult", "BootstrapDependencies", "bootstrap_owner_isolation",
    "is_exact_scoped_bootstrap_success_receipt",
    "parse_request", "serialize_response", "handle_request",
    "OwnerGenerationBaseline", "GenerationRecord", "capture_owner_generation_baseline",
    "is_owner_generation_baseline_current", "same_owner_generation_baseline", "replace_owner_generation",
    "PublishGenerationRequest", "PublishGenerationResult", "publish_owner_generation",
    "OwnerIntent", "create_owner_intent",
    "ObserveTerminalRequest", "OwnerVerdict", "OwnerIncident", "observe_owner_terminal",
    "is_valid_owner_intent", "is_valid_owner_verdict",
    "ExactOwnerCloseRequest", "ExactOwnerCloseDependencies", "close_exact_tmux_owner",
    "ManagedOwnerPredecessorEvidence", "resolve_managed_owner_predecessor",
    "RecoveryFsRoot", "open_recovery_fs_root",
}  # fmt: skip

INSPECT = """
import json, sys
import tmux_owner
star = {}
exec("from tmux_owner import *", star)
print(json.dumps({
    "file": tmux_owner.__file__,
    "all": list(tmux_owner.__all__),
    "missing": [name for name in tmux_owner.__all__ if getattr(tmux_owner, name, None) is None],
    "star": sorted(set(star) - {"__builtins__"}),
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("sqlalchemy", "admission_plane")),
}))
"""


def inspect_package() -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-c", INSPECT], cwd=PROJECT, capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_every_exported_name_imports_and_every_promised_name_is_exported() -> None:
    """Each name in `__all__` imports from `tmux_owner`, each once, and every promised public name is there."""
    package = inspect_package()
    assert Path(package["file"]) == PROJECT / "tmux_owner" / "__init__.py"
    assert package["missing"] == []
    assert len(package["all"]) == len(set(package["all"]))
    assert not PROMISED - set(package["all"]), sorted(PROMISED - set(package["all"]))
    assert package["star"] == sorted(package["all"])


def test_importing_the_package_loads_neither_sqlalchemy_nor_admission_plane() -> None:
    """`import tmux_owner` in a fresh interpreter stays independent of the admission plane and SQLAlchemy."""
    assert inspect_package()["loaded"] == []
