"""Exact owner close: the start-time proof, the intent, the SIGTERM, the verdict wait and the retired-intent markers."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gates import require
from tmux_support import GENERATION, SESSION, observe_request_json, root_of

from tmux_owner import _close
from tmux_owner._close import (
    ExactOwnerCloseDependencies,
    ExactOwnerCloseRequest,
    close_exact_tmux_owner,
    read_proc_start_time,
)
from tmux_owner._errors import TmuxOwnerError
from tmux_owner._intents import create_owner_intent
from tmux_owner._timestamps import iso_now
from tmux_owner._verdict_records import OwnerVerdict
from tmux_owner._verdicts import observe_owner_terminal

PROC_AVAILABLE = Path("/proc/self/stat").exists()


def intent_file(state_dir: Path, suffix: str = "") -> Path:
    return root_of(state_dir) / f"intent-{GENERATION}.json{suffix}"


def close_request(state_dir: Path, **overrides: Any) -> ExactOwnerCloseRequest:
    now_ms = int(time.time() * 1000)
    fields: dict[str, Any] = {
        "state_dir": str(state_dir),
        "session_id": SESSION,
        "generation": GENERATION,
        "server_key": "socket",
        "pid": 4242,
        "start_time": "1234",
        "dispatch_id": "dispatch",
        "created_at": iso_now(now_ms - 1000),
        "expires_at": iso_now(now_ms + 60_000),
    }
    return ExactOwnerCloseRequest(**(fields | overrides))


class FakeOwner:
    """Recording dependencies: a start-time sequence, signals sent, cleanups run."""

    def __init__(self, start_times: list[str | None], verdict: Callable[[], OwnerVerdict | None] = lambda: None):
        self.start_times = start_times
        self.signals: list[int] = []
        self.cleanups = 0
        self.verdict = verdict
        self.send_error: BaseException | None = None

    def deps(self) -> ExactOwnerCloseDependencies:
        def read_start_time(_pid: int) -> str | None:
            return self.start_times.pop(0) if len(self.start_times) > 1 else self.start_times[0]

        def send_sigterm(pid: int) -> None:
            if self.send_error is not None:
                raise self.send_error
            self.signals.append(pid)

        def cleanup() -> None:
            self.cleanups += 1

        return ExactOwnerCloseDependencies(
            read_start_time=read_start_time,
            send_sigterm=send_sigterm,
            wait_for_verdict=self.verdict,
            cleanup_session=cleanup,
        )


def observe_sigterm(state_dir: Path, dispatch_id: str = "dispatch") -> OwnerVerdict:
    return observe_owner_terminal(
        observe_request_json(state_dir, observed_at=iso_now(), operator_dispatch_id=dispatch_id)
    )


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    require(PROC_AVAILABLE, "needs Linux /proc")
    process = subprocess.Popen(["sleep", "600"])
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_a_wrong_start_time_refuses_a_real_child_without_any_signal(
    state_dir: Path, child: subprocess.Popen[bytes]
) -> None:
    """A start time that is not the real child's refuses the close before any intent or signal; the child lives on."""
    real = read_proc_start_time(child.pid)
    assert real is not None
    wrong = str(int(real) + 1)
    with pytest.raises(TmuxOwnerError, match=r"^owner_pid_identity_mismatch$"):
        close_exact_tmux_owner(close_request(state_dir, pid=child.pid, start_time=wrong))
    assert child.poll() is None
    assert read_proc_start_time(child.pid) == real
    assert not intent_file(state_dir).exists()


def test_the_right_start_time_sends_a_real_sigterm_and_consumes_the_intent(
    state_dir: Path, child: subprocess.Popen[bytes]
) -> None:
    """With the right start time a real child dies of SIGTERM, the observer's expected-shutdown verdict is returned, the
    intent is consumed and cleanup runs once.
    """
    start_time = read_proc_start_time(child.pid)
    assert start_time is not None
    observed: list[OwnerVerdict] = []

    def sidecar() -> None:
        child.wait()
        observed.append(observe_sigterm(state_dir))

    watcher = threading.Thread(target=sidecar)
    watcher.start()
    cleanups: list[bool] = []
    try:
        deps = ExactOwnerCloseDependencies(cleanup_session=lambda: cleanups.append(True))
        verdict = close_exact_tmux_owner(close_request(state_dir, pid=child.pid, start_time=start_time), deps)
    finally:
        if child.poll() is None:
            child.kill()
        watcher.join()
    assert child.returncode == -signal.SIGTERM
    assert observed == [verdict]
    assert verdict.classification == "expected_operator_shutdown"
    consumed = json.loads(intent_file(state_dir, ".consumed").read_text())
    assert verdict.intent_id == consumed["intent_id"]
    assert not intent_file(state_dir).exists()
    assert cleanups == [True]
    alias = json.loads((root_of(state_dir) / "verdict.json").read_text())
    assert alias["owner_generation"] == GENERATION


def test_a_start_time_mismatch_sends_nothing_and_writes_no_intent(state_dir: Path) -> None:
    """A start-time mismatch at the first proof raises owner_pid_identity_mismatch before any intent or signal."""
    owner = FakeOwner(["9999"])
    with pytest.raises(TmuxOwnerError, match=r"^owner_pid_identity_mismatch$"):
        close_exact_tmux_owner(close_request(state_dir), owner.deps())
    assert (owner.signals, owner.cleanups) == ([], 0)
    assert not intent_file(state_dir).exists()


def test_a_stale_generation_is_refused_before_the_intent(state_dir: Path) -> None:
    """Closing a generation that is not current raises owner_generation_mismatch with no intent and no signal."""
    owner = FakeOwner(["1234"])
    with pytest.raises(TmuxOwnerError, match=r"^owner_generation_mismatch$"):
        close_exact_tmux_owner(close_request(state_dir, generation="stale"), owner.deps())
    assert not (root_of(state_dir) / "intent-stale.json").exists()
    assert owner.signals == []


def test_a_generation_with_an_earlier_intent_cannot_be_closed_again(state_dir: Path) -> None:
    """An earlier intent of the generation, even from another dispatch, makes close raise owner_intent_replay without a
    signal.
    """
    create_owner_intent(
        state_dir,
        generation=GENERATION,
        session_id=SESSION,
        server_key="socket",
        dispatch_id="earlier",
        created_at="2026-01-01T00:00:00Z",
        expires_at="2026-01-01T00:01:00Z",
    )
    owner = FakeOwner(["1234"])
    with pytest.raises(TmuxOwnerError, match=r"^owner_intent_replay$"):
        close_exact_tmux_owner(close_request(state_dir), owner.deps())
    assert owner.signals == []


def test_an_intent_created_after_its_expiry_is_invalid(state_dir: Path) -> None:
    """An intent created after its expiry raises owner_intent_invalid with no intent file and no signal."""
    owner = FakeOwner(["1234"])
    request = close_request(state_dir, created_at="2026-01-01T00:00:00Z", expires_at="2020-01-01T00:00:00Z")
    with pytest.raises(TmuxOwnerError, match=r"^owner_intent_invalid$"):
        close_exact_tmux_owner(request, owner.deps())
    assert not intent_file(state_dir).exists()
    assert owner.signals == []


def test_an_already_expired_intent_is_marked_expired_without_a_signal(state_dir: Path) -> None:
    """An intent whose expiry has already passed is renamed .expired and close raises owner_term_verdict_timeout
    unsignalled.
    """
    owner = FakeOwner(["1234"])
    request = close_request(state_dir, created_at="2019-01-01T00:00:00Z", expires_at="2020-01-01T00:00:00Z")
    with pytest.raises(TmuxOwnerError, match=r"^owner_term_verdict_timeout$"):
        close_exact_tmux_owner(request, owner.deps())
    assert intent_file(state_dir, ".expired").exists()
    assert owner.signals == []


def test_a_changed_start_time_at_the_second_proof_cancels_the_intent(state_dir: Path) -> None:
    """A start time that changes between the two proofs cancels the intent, with no signal and no cleanup."""
    owner = FakeOwner(["1234", "5678"])
    with pytest.raises(TmuxOwnerError, match=r"^owner_pid_identity_mismatch$"):
        close_exact_tmux_owner(close_request(state_dir), owner.deps())
    assert intent_file(state_dir, ".cancelled").exists()
    assert (owner.signals, owner.cleanups) == ([], 0)


def test_a_generation_replaced_after_the_intent_cancels_it(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A generation replaced right after the intent is written cancels it and raises owner_generation_mismatch."""
    real_create = _close.create_owner_intent

    def create_then_replace(*args: Any, **kwargs: Any) -> Any:
        intent = real_create(*args, **kwargs)
        # Write the pointer directly: a real publisher would wait on the generation lock close holds.
        pointer = {"schema_version": 1, "generation": "next", "session_id": SESSION, "published_at": iso_now()}
        (root_of(state_dir) / "generation.json").write_text(json.dumps(pointer))
        return intent

    monkeypatch.setattr(_close, "create_owner_intent", create_then_replace)
    owner = FakeOwner(["1234"])
    with pytest.raises(TmuxOwnerError, match=r"^owner_generation_mismatch$"):
        close_exact_tmux_owner(close_request(state_dir), owner.deps())
    assert intent_file(state_dir, ".cancelled").exists()
    assert owner.signals == []


def test_a_failed_dispatch_cancels_the_intent_and_propagates_its_error(state_dir: Path) -> None:
    """An error from sending the SIGTERM propagates unchanged, cancels the intent and runs no cleanup."""
    owner = FakeOwner(["1234"])
    owner.send_error = TmuxOwnerError("dispatch_failed")
    with pytest.raises(TmuxOwnerError, match=r"^dispatch_failed$"):
        close_exact_tmux_owner(close_request(state_dir), owner.deps())
    assert intent_file(state_dir, ".cancelled").exists()
    assert owner.cleanups == 0


def test_no_verdict_within_the_wait_expires_the_intent(state_dir: Path) -> None:
    """A verdict wait that returns nothing after the signal expires the intent and raises owner_term_verdict_timeout."""
    owner = FakeOwner(["1234"])
    with pytest.raises(TmuxOwnerError, match=r"^owner_term_verdict_timeout$"):
        close_exact_tmux_owner(close_request(state_dir), owner.deps())
    assert owner.signals == [4242]
    assert intent_file(state_dir, ".expired").exists()
    assert owner.cleanups == 0


@pytest.mark.parametrize("kind", ["wrong_intent", "unexpected"])
def test_a_verdict_for_another_intent_or_unexpected_loss_is_a_timeout(state_dir: Path, kind: str) -> None:
    """A verdict that is not an expected shutdown naming this close's intent expires the intent and runs no cleanup."""
    base = {
        "schema_version": 1,
        "generation": GENERATION,
        "session_id": SESSION,
        "server_key": "socket",
        "observed_at": "2026-01-01T00:00:00Z",
        "exit_code": None,
        "observer": "sidecar",
        "reason": "owner_exit",
        "dedupe_key": f"owner-loss:{SESSION}:{GENERATION}",
    }
    if kind == "wrong_intent":
        fields = {
            "signal": "SIGTERM",
            "result": "owner_term_then_session_cleanup",
            "classification": "expected_operator_shutdown",
            "intent_id": "wrong-intent",
        }
    else:
        fields = {"signal": "EXIT", "result": "exit", "classification": "unexpected_owner_loss"}
    owner = FakeOwner(["1234"], verdict=lambda: OwnerVerdict.from_json(base | fields))
    with pytest.raises(TmuxOwnerError, match=r"^owner_term_verdict_timeout$"):
        close_exact_tmux_owner(close_request(state_dir), owner.deps())
    assert intent_file(state_dir, ".expired").exists()
    assert owner.cleanups == 0


def test_a_matching_sigterm_verdict_runs_cleanup_once(state_dir: Path) -> None:
    """A verdict wait that performs the real SIGTERM observation leads to exactly one cleanup and a consumed intent."""
    owner = FakeOwner(["1234"], verdict=lambda: observe_sigterm(state_dir))
    verdict = close_exact_tmux_owner(close_request(state_dir), owner.deps())
    assert verdict.classification == "expected_operator_shutdown"
    assert owner.cleanups == 1
    assert json.loads((root_of(state_dir) / "verdict.json").read_text())["owner_generation"] == GENERATION
    assert intent_file(state_dir, ".consumed").exists()


def test_close_gives_up_when_the_generation_lock_is_held(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the generation lock within the (shortened) wait, close raises generation_lock_contended and signals
    nothing.
    """
    monkeypatch.setattr(_close, "GENERATION_LOCK_WAIT_MS", 100)
    owner = FakeOwner(["1234"])
    holder = sqlite3.connect(root_of(state_dir) / "owner-locks.sqlite", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(TmuxOwnerError, match=r"^generation_lock_contended$"):
            close_exact_tmux_owner(close_request(state_dir), owner.deps())
    finally:
        holder.close()
    assert owner.signals == []
    assert not intent_file(state_dir).exists()


def test_the_live_start_time_reader_takes_field_22_after_the_last_parenthesis() -> None:
    """The live start-time reader returns field 22 of /proc/<pid>/stat, counted after the last ')', and None for a
    missing pid.
    """
    require(PROC_AVAILABLE, "needs Linux /proc")
    stat_text = Path(f"/proc/{os.getpid()}/stat").read_text()
    assert read_proc_start_time(os.getpid()) == stat_text.rsplit(")", 1)[1].split()[19]
    assert read_proc_start_time(2**22 + 1) is None


def test_close_requests_need_a_positive_integer_pid_and_non_empty_identifiers() -> None:
    """A pid must be a positive integer (never a boolean); ids and the start time must be non-empty."""
    for pid in (0, -1, True, 1.5, "12"):
        with pytest.raises((TypeError, ValueError)):
            close_request(Path("/s"), pid=pid)
    for field in ("session_id", "generation", "server_key", "start_time", "dispatch_id"):
        with pytest.raises(ValueError):
            close_request(Path("/s"), **{field: ""})
