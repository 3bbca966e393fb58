"""Lifecycle file layout: where every record of one session's owner lifecycle lives.

Layout (the seed's ``lifecyclePaths``): all files of one session live in
``<state_dir>/<session_id>/owner-lifecycle/``, created 0700; files are 0600. The paths
here name the files; every read and write goes through :class:`LifecycleDir`
(``_dirfd``), which reaches that directory without following a symlink below the state
directory, and the durable writes of ``_durable``: a record appears whole or not at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, get_args

import attrs

from ._dirfd import DIR_MODE, FILE_MODE, LIFECYCLE_DIRECTORY, NAME_MAX, LifecycleDir, state_dir_path
from ._durable import TEMPORARY_SUFFIX_BYTES
from ._errors import TmuxOwnerError
from ._jscompat import encode_uri_component
from ._locks import GENERATION_LOCK_WAIT_MS, LOCK_DATABASE, VERDICT_LOCK_WAIT_MS
from ._validators import is_safe_path_component

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "GENERATION_LOCK_WAIT_MS",
    "RETIRED_INTENT_SUFFIXES",
    "VERDICT_LOCK_WAIT_MS",
    "LifecyclePaths",
    "MemoryGuardClaimPaths",
    "RetiredIntentSuffix",
    "create_lifecycle",
    "lifecycle_paths",
    "memory_guard_claim_paths",
    "open_lifecycle",
    "require_path_component",
]

RetiredIntentSuffix = Literal[".consumed", ".cancelled", ".expired", ".invalidated"]
RETIRED_INTENT_SUFFIXES: tuple[RetiredIntentSuffix, ...] = get_args(RetiredIntentSuffix)


@attrs.frozen
class LifecyclePaths:
    """Every file of one session's owner lifecycle, for one generation."""

    root: Path
    generation: str
    generation_file: Path
    generation_marker_file: Path
    intent_file: Path
    verdict_file: Path
    verdict_alias_file: Path
    incident_file: Path
    lock_database_file: Path
    journal_file: Path
    state_dir: Path
    session_id: str

    def retired_intent_file(self, suffix: RetiredIntentSuffix) -> Path:
        """``intent-<G>.json<suffix>``: the intent once consumed, cancelled, expired or invalidated."""
        return self.intent_file.with_name(self.intent_file.name + suffix)

    def attempt_file(self, token: str) -> Path:
        """``attempt-<token>.json``: a scoped-bootstrap capability."""
        require_path_component(token, "token")
        name = f"attempt-{token}.json"
        _require_short_names([f"{name}.consumed"], "token")
        return self.root / name


def require_path_component(value: object, what: str) -> str:
    """Refuse a value that would escape or confuse the lifecycle directory (beyond the seed)."""
    if not is_safe_path_component(value) or len(os.fsencode(value)) > NAME_MAX:
        raise TmuxOwnerError(f"invalid_{what}")
    return value


def _require_short_names(names: Iterable[str], what: str) -> None:
    """Beyond the seed: refuse an id whose file names (or their temporary files) the file system cannot hold."""
    if any(len(os.fsencode(name)) + TEMPORARY_SUFFIX_BYTES > NAME_MAX for name in names):
        raise TmuxOwnerError(f"invalid_{what}")


def lifecycle_paths(state_dir: str | os.PathLike[str], session_id: str, generation: str) -> LifecyclePaths:
    """The seed's ``lifecyclePaths``; refuses unusable state directories, unsafe session ids and generations."""
    base = state_dir_path(state_dir)
    require_path_component(session_id, "session_id")
    require_path_component(generation, "generation")
    root = base / session_id / LIFECYCLE_DIRECTORY
    paths = LifecyclePaths(
        root=root,
        generation=generation,
        generation_file=root / "generation.json",
        generation_marker_file=root / f"generation-{encode_uri_component(generation)}.published.json",
        intent_file=root / f"intent-{generation}.json",
        verdict_file=root / f"verdict-{generation}.json",
        verdict_alias_file=root / "verdict.json",
        incident_file=root / f"incident-{generation}.json",
        lock_database_file=root / LOCK_DATABASE,
        journal_file=root / f"verdict-{generation}.journal",
        state_dir=base,
        session_id=session_id,
    )
    retired = (paths.retired_intent_file(suffix) for suffix in RETIRED_INTENT_SUFFIXES)
    files = (paths.generation_marker_file, paths.intent_file, paths.verdict_file, paths.incident_file)
    _require_short_names((file.name for file in (*files, paths.journal_file, *retired)), "generation")
    return paths


@attrs.frozen
class MemoryGuardClaimPaths:
    """The seed's ``memoryGuardClaimPaths``."""

    root: Path
    database_file: Path
    wal_file: Path
    shm_file: Path


def memory_guard_claim_paths(state_dir: str | os.PathLike[str], session_id: str) -> MemoryGuardClaimPaths:
    base = state_dir_path(state_dir)
    require_path_component(session_id, "session_id")
    root = base / "memory-guard-claims" / session_id
    database = root / "claims.sqlite"
    return MemoryGuardClaimPaths(
        root=root,
        database_file=database,
        wal_file=Path(f"{database}-wal"),
        shm_file=Path(f"{database}-shm"),
    )


def open_lifecycle(paths: LifecyclePaths) -> LifecycleDir | None:
    """The session's verified lifecycle directory, or ``None`` if it does not exist (see :class:`LifecycleDir`)."""
    return LifecycleDir.open(paths.state_dir, paths.session_id)


def create_lifecycle(paths: LifecyclePaths) -> LifecycleDir:
    """The session's verified lifecycle directory, created 0700 where missing."""
    return LifecycleDir.create(paths.state_dir, paths.session_id)
