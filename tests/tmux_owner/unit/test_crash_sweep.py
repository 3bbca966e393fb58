"""Crash safety: a process killed at any file-system call never loses, corrupts or forks a record.

Each sweep runs one operation in a forked child that counts its file-system calls and
SIGKILLs itself at call number k, for k = 1, 2, ... until the operation finishes before
reaching k. After every kill the test process runs the operation again on what the child
left behind and checks that it answers with the one verdict (or the one published
generation), that every record is whole, and that no temporary file is left over.
"""

from __future__ import annotations

import fcntl
import functools
import json
import multiprocessing
import os
import re
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tmux_support import GENERATION, SESSION, intent_args, observe_request_json, root_of

from tmux_owner import (
    GenerationRecord,
    OwnerGenerationBaseline,
    OwnerVerdict,
    PublishGenerationRequest,
    TmuxOwnerError,
    capture_owner_generation_baseline,
    create_owner_intent,
    observe_owner_terminal,
    publish_owner_generation,
    replace_owner_generation,
)

# Every call through which the package touches the file system (or its locks) is a kill point.
FILE_SYSTEM_CALLS: tuple[tuple[Any, str], ...] = (
    *(
        (os, name)
        for name in (
            "open", "read", "pread", "write", "fsync", "fchmod", "link", "rename", "replace", "unlink",
            "mkdir", "makedirs", "close", "listdir", "stat", "lstat", "fstat", "readlink",
        )
    ),
    (fcntl, "flock"),
)  # fmt: skip
# A record name, or a temporary file of the package (<final>.<uuid4>.tmp).
TEMPORARY = re.compile(r".+\.[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.tmp")
_FORK = multiprocessing.get_context("fork")


def _die_at_call(operation: Callable[[], object], kill_at: int) -> None:
    """The child: count file-system calls and SIGKILL this process at call ``kill_at``."""
    calls = 0

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)

        return call

    for module, name in FILE_SYSTEM_CALLS:
        setattr(module, name, counted(getattr(module, name)))
    operation()
    os._exit(0)


def run_until_killed(operation: Callable[[], object], kill_at: int) -> bool:
    """Run ``operation`` in a child killed at file-system call ``kill_at``; ``True`` if it finished first."""
    child = _FORK.Process(target=_die_at_call, args=(operation, kill_at))
    child.start()
    child.join(60)
    assert child.exitcode in (0, -signal.SIGKILL), f"the child failed at kill point {kill_at}: {child.exitcode}"
    return child.exitcode == 0


def temporary_files(root: Path) -> list[str]:
    return [name for name in os.listdir(root) if TEMPORARY.fullmatch(name) or ".tmp" in name]


def assert_no_temporary_files(root: Path) -> None:
    assert temporary_files(root) == []


def sweep(template: Path, workspace: Path, child: Callable[[Path], object], check: Callable[[Path], None]) -> int:
    """For k = 1, 2, ...: copy ``template``, kill ``child`` at call k, run ``check``; return the number of kill points.

    At least one kill must have left a temporary file behind, so the clean-up is exercised.
    """
    kill_at = 1
    leftovers = 0
    while True:
        state = workspace / f"k{kill_at}"
        shutil.copytree(template, state, symlinks=True)
        finished = run_until_killed(functools.partial(child, state), kill_at)
        leftovers += bool(temporary_files(root_of(state)))
        check(state)
        shutil.rmtree(state)
        if finished:
            assert leftovers > 0
            return kill_at - 1
        kill_at += 1
        assert kill_at < 1000, "the operation never finished"


def compact(value: Any) -> bytes:
    return (json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


OBSERVATION_A = {"observer": "sidecar", "observed_at": "2026-01-01T00:00:01.000Z", "exit_kind": "owner_lost"}
OBSERVATION_B = {"observer": "raw_monitor", "observed_at": "2026-01-01T00:00:02.000Z", "exit_kind": "exit"}
OBSERVATION_C = {"observer": "raw_monitor", "observed_at": "2026-01-01T00:00:03.000Z", "reason": "test"}


def observation(state: Path, expected: bool, fields: dict[str, str]) -> dict[str, Any]:
    extra = {"operator_dispatch_id": "dispatch", "signal": "SIGTERM"} if expected else {"signal": "EXIT"}
    return observe_request_json(state, **extra, **fields)


def verdict_on_copy(template: Path, workspace: Path, expected: bool, fields: dict[str, str]) -> OwnerVerdict:
    """The verdict an uninterrupted observation with ``fields`` publishes on a copy of ``template``."""
    state = workspace / f"reference-{fields['observer']}"
    shutil.copytree(template, state, symlinks=True)
    verdict = observe_owner_terminal(observation(state, expected, fields))
    shutil.rmtree(state)
    return verdict


@pytest.mark.parametrize("expected", [False, True], ids=["unexpected_loss", "expected_shutdown"])
def test_a_kill_at_any_file_system_call_of_observe_terminal_never_loses_the_verdict(
    tmp_path: Path, expected: bool
) -> None:
    """Killed at any file-system call of observe_terminal, the next observation answers with the one verdict (the
    killed observer's own once its journal or verdict was durable), completes every record, and leaves no temp file.
    """
    template = tmp_path / "template"
    replace_owner_generation(template, SESSION, GENERATION)
    if expected:
        create_owner_intent(template, **intent_args())
    verdict_a = verdict_on_copy(template, tmp_path, expected, OBSERVATION_A)
    verdict_b = verdict_on_copy(template, tmp_path, expected, OBSERVATION_B)
    assert verdict_a != verdict_b

    def check(state: Path) -> None:
        root = root_of(state)
        observer_a_durable = (root / "verdict-generation.journal").exists() or (
            root / "verdict-generation.json"
        ).exists()
        verdict = observe_owner_terminal(observation(state, expected, OBSERVATION_B))
        assert verdict == verdict_a if observer_a_durable else verdict in (verdict_a, verdict_b)
        assert observe_owner_terminal(observation(state, expected, OBSERVATION_C)) == verdict
        assert (root / "verdict-generation.json").read_bytes() == compact(verdict.to_json())
        assert (root / "verdict.json").read_bytes() == compact(verdict.alias_json())
        assert not (root / "verdict-generation.journal").exists()
        assert (root / "incident-generation.json").exists() == (not expected)
        if not expected:
            incident = json.loads((root / "incident-generation.json").read_text())
            assert incident["created_at"] == verdict.observed_at
        assert (root / "intent-generation.json.consumed").exists() == expected
        assert not (root / "intent-generation.json").exists() or not expected
        assert_no_temporary_files(root)

    points = sweep(
        template, tmp_path, lambda state: observe_owner_terminal(observation(state, expected, OBSERVATION_A)), check
    )
    assert points >= 20


def publish_request(state: Path, generation: str, baseline: OwnerGenerationBaseline) -> PublishGenerationRequest:
    return PublishGenerationRequest(
        session_id=SESSION, owner_generation=generation, state_dir=str(state), baseline=baseline
    )


def assert_whole_marker(root: Path, generation: str) -> GenerationRecord:
    marker = root / f"generation-{generation}.published.json"
    record = GenerationRecord.from_json(json.loads(marker.read_text()))
    assert marker.read_bytes() == compact(record.to_json())
    assert record.generation == generation
    return record


def test_a_kill_at_any_file_system_call_of_publish_generation_leaves_one_published_generation(tmp_path: Path) -> None:
    """Killed at any file-system call of publish_generation, the pointer names one whole generation, a retry answers
    published, replay (the id was burned, the pointer kept) or changed (the kill came after the pointer moved),
    the next generation publishes, and no temp file is left.
    """
    template = tmp_path / "template"
    replace_owner_generation(template, SESSION, "previous")
    create_owner_intent(template, **intent_args(generation="previous"))
    # The previous generation's marker is missing, so publication must also restore it.
    (root_of(template) / "generation-previous.published.json").unlink()
    previous = capture_owner_generation_baseline(template, SESSION)

    def check(state: Path) -> None:
        root = root_of(state)
        current = capture_owner_generation_baseline(state, SESSION)
        assert current.generation in ("previous", GENERATION)
        try:
            outcome = publish_owner_generation(publish_request(state, GENERATION, previous)).generation
        except TmuxOwnerError as error:
            outcome = error.code
        pointer = capture_owner_generation_baseline(state, SESSION)
        assert (outcome, pointer.generation) in {
            (GENERATION, GENERATION),
            ("generation_replay", "previous"),
            ("baseline_generation_changed", GENERATION),
        }
        assert pointer.record is not None
        assert publish_owner_generation(publish_request(state, "next", pointer)).generation == "next"
        assert capture_owner_generation_baseline(state, SESSION).generation == "next"
        assert_whole_marker(root, "previous")
        assert assert_whole_marker(root, "next") == capture_owner_generation_baseline(state, SESSION).record
        if (root / f"generation-{GENERATION}.published.json").exists():
            assert_whole_marker(root, GENERATION)
        assert_no_temporary_files(root)

    points = sweep(
        template, tmp_path, lambda state: publish_owner_generation(publish_request(state, GENERATION, previous)), check
    )
    assert points >= 15
