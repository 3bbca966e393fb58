"""Exactly one verdict per owner generation under concurrency: threads, OS processes, crashes and conflicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from tmux_support import GENERATION, PROJECT, SESSION, intent_args, root_of
from tmux_support import observe_request_json as request_json

from tmux_owner import _verdicts
from tmux_owner._errors import TmuxOwnerError
from tmux_owner._generations import replace_owner_generation
from tmux_owner._intents import create_owner_intent
from tmux_owner._verdict_records import OwnerVerdict
from tmux_owner._verdicts import observe_owner_terminal

# Each worker process announces it is ready, waits for the start file, then runs its
# observers on threads at once and prints one JSON outcome per observer.
WORKER = r"""
import json, os, sys, threading, time
from tmux_owner._errors import TmuxOwnerError
from tmux_owner._verdicts import observe_owner_terminal

start_file, requests = sys.argv[1], json.loads(sys.argv[2])
outcomes = [None] * len(requests)

def observe(index):
    # verdict_lock_contended is a transient refusal after the 250 ms lock wait, which
    # callers retry; any other error is an outcome the test rejects.
    for _attempt in range(200):
        try:
            outcomes[index] = {"verdict": observe_owner_terminal(requests[index]).to_json()}
            return
        except TmuxOwnerError as error:
            outcomes[index] = {"error": error.code}
            if error.code != "verdict_lock_contended":
                return

print("ready", flush=True)
while not os.path.exists(start_file):
    time.sleep(0.001)
threads = [threading.Thread(target=observe, args=(index,)) for index in range(len(requests))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(outcomes), flush=True)
"""

CRASHING_WORKER = r"""
import json, os, sys
from tmux_owner import _verdicts

def crash(paths, verdict, observation):
    # Die like a killed observer: the journal is durable, the verdict is not yet published.
    os._exit(17)

_verdicts._publish_verdict = crash
_verdicts.observe_owner_terminal(json.loads(sys.argv[1]))
"""


def varied_request(state_dir: Path, index: int) -> dict[str, Any]:
    """Observers disagree on everything but the owner; every second one presents the dispatch id."""
    overrides: dict[str, Any] = {
        "observer": ("sidecar", "raw_monitor")[index % 2],
        "observed_at": f"2026-01-01T00:00:{1 + index % 50:02d}.000Z",
        "reason": ("owner_exit", "raw_terminal", "different")[index % 3],
        "signal": ("SIGTERM", "EXIT")[index % 2],
    }
    if index % 2 == 0:
        overrides["operator_dispatch_id"] = "dispatch"
    return request_json(state_dir, **overrides)


def worker_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def state_dir(state_dir: Path) -> Path:
    """The shared state directory plus a pending intent of the usual dispatch (for the expected shutdowns)."""
    create_owner_intent(state_dir, **intent_args())
    return state_dir


def assert_exactly_one_verdict(state_dir: Path, verdicts: list[dict[str, Any]]) -> None:
    root = root_of(state_dir)
    names = os.listdir(root)
    assert [name for name in names if name.startswith("verdict-")] == ["verdict-generation.json"]
    assert not [name for name in names if name.endswith(".tmp")]
    stored = (root / "verdict-generation.json").read_bytes()
    for verdict in verdicts:
        assert stored == (json.dumps(verdict, separators=(",", ":")) + "\n").encode()


def test_eight_threads_observing_one_end_all_receive_the_one_verdict(state_dir: Path) -> None:
    """Eight concurrent in-process observers of one end produce one verdict file and all return it."""
    count = 8
    barrier = threading.Barrier(count)
    outcomes: list[Any] = [None] * count

    def observe(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = observe_owner_terminal(varied_request(state_dir, index)).to_json()
        except TmuxOwnerError as error:
            outcomes[index] = error.code

    threads = [threading.Thread(target=observe, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(outcome, dict) for outcome in outcomes), outcomes
    assert all(outcome == outcomes[0] for outcome in outcomes)
    assert_exactly_one_verdict(state_dir, outcomes)
    assert (root_of(state_dir) / "owner-locks.sqlite").exists()


def test_eight_processes_with_threads_observing_one_end_all_receive_the_one_verdict(state_dir: Path) -> None:
    """Eight OS processes of two threads and four threads here, retrying the transient lock refusal as callers do, all
    receive the one verdict.
    """
    start_file = state_dir / "start"
    workers: list[subprocess.Popen[str]] = []
    local_count = 4
    local: list[Any] = [None] * local_count
    try:
        for process_index in range(8):
            requests = [varied_request(state_dir, process_index * 2 + offset) for offset in range(2)]
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-c", WORKER, str(start_file), json.dumps(requests)],
                    stdout=subprocess.PIPE,
                    text=True,
                    env=worker_env(),
                    cwd=PROJECT,
                )
            )
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        release = threading.Event()

        def observe(index: int) -> None:
            release.wait()
            for _attempt in range(200):  # the 250 ms lock wait is easily exceeded on a loaded machine
                try:
                    local[index] = observe_owner_terminal(varied_request(state_dir, 100 + index)).to_json()
                    return
                except TmuxOwnerError as error:
                    local[index] = error.code
                    if error.code != "verdict_lock_contended":
                        return

        threads = [threading.Thread(target=observe, args=(index,)) for index in range(local_count)]
        for thread in threads:
            thread.start()
        start_file.touch()
        release.set()
        for thread in threads:
            thread.join()
        remote: list[Any] = []
        for worker in workers:
            output, _ = worker.communicate(timeout=60)
            assert worker.returncode == 0
            remote.extend(json.loads(output.strip().splitlines()[-1]))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    outcomes = [outcome.get("verdict", outcome) for outcome in remote] + local
    assert len(outcomes) == 20
    assert all(isinstance(outcome, dict) and "error" not in outcome for outcome in outcomes), outcomes
    assert all(outcome == outcomes[0] for outcome in outcomes)
    assert_exactly_one_verdict(state_dir, outcomes)
    assert not (root_of(state_dir) / "verdict-generation.journal").exists()


def test_concurrent_callers_with_the_same_key_share_one_observation(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second in-process caller for the same verdict file and socket shares the first call's observation."""
    second_waiting = threading.Event()
    calls: list[str] = []

    class SignallingFuture(Future):  # type: ignore[type-arg]  # stands in for any Future[OwnerVerdict]
        def result(self, timeout: float | None = None) -> Any:
            second_waiting.set()
            return super().result(timeout)

    real_exclusive = _verdicts._observe_exclusive

    def exclusive(request: Any, paths: Any) -> OwnerVerdict:
        calls.append(request.observer)
        assert second_waiting.wait(timeout=30)
        return real_exclusive(request, paths)

    monkeypatch.setattr(_verdicts, "Future", SignallingFuture)
    monkeypatch.setattr(_verdicts, "_observe_exclusive", exclusive)
    results: dict[str, OwnerVerdict] = {}

    def observe(observer: str, reason: str) -> None:
        results[observer] = observe_owner_terminal(request_json(state_dir, observer=observer, reason=reason))

    first = threading.Thread(target=observe, args=("sidecar", "owner_exit"))
    first.start()
    while not _verdicts._live_observations:
        threading.Event().wait(0.001)
    second = threading.Thread(target=observe, args=("raw_monitor", "different"))
    second.start()
    first.join()
    second.join()
    assert calls == ["sidecar"]
    assert results["sidecar"] is results["raw_monitor"]
    assert _verdicts._live_observations == {}


def test_current_and_foreign_generation_observations_are_not_coalesced(state_dir: Path) -> None:
    """A foreign-generation observation in flight beside a current one is not coalesced with it and fails alone with
    generation_mismatch.
    """
    barrier = threading.Barrier(2)
    outcomes: dict[str, Any] = {}

    def observe(generation: str) -> None:
        barrier.wait()
        try:
            outcomes[generation] = observe_owner_terminal(request_json(state_dir, owner_generation=generation))
        except TmuxOwnerError as error:
            outcomes[generation] = error.code

    threads = [threading.Thread(target=observe, args=(name,)) for name in (GENERATION, "foreign")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes["foreign"] == "generation_mismatch"
    assert outcomes[GENERATION].server_key == "socket"


def test_observations_from_two_socket_authorities_elect_one_and_refuse_the_other(tmp_path: Path) -> None:
    """Concurrent observations through two socket authorities elect one verdict, and the other gets
    immutable_record_conflict.
    """
    replace_owner_generation(tmp_path, SESSION, GENERATION)
    barrier = threading.Barrier(2)
    outcomes: dict[str, Any] = {}

    def observe(socket_key: str) -> None:
        barrier.wait()
        try:
            outcomes[socket_key] = observe_owner_terminal(request_json(tmp_path, socket_key=socket_key))
        except TmuxOwnerError as error:
            outcomes[socket_key] = error.code

    threads = [threading.Thread(target=observe, args=(key,)) for key in ("socket-a", "socket-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [key for key, outcome in outcomes.items() if isinstance(outcome, OwnerVerdict)]
    assert len(winners) == 1
    assert outcomes[winners[0]].server_key == winners[0]
    loser = "socket-b" if winners == ["socket-a"] else "socket-a"
    assert outcomes[loser] == "immutable_record_conflict"


def test_a_conflicting_pre_existing_verdict_is_refused(tmp_path: Path) -> None:
    """A valid verdict for another socket authority is never replaced nor returned, and observing it again gives it
    back.
    """
    replace_owner_generation(tmp_path, SESSION, GENERATION)
    original = observe_owner_terminal(request_json(tmp_path, socket_key="socket-a"))
    file = root_of(tmp_path) / "verdict-generation.json"
    before = file.read_bytes()
    with pytest.raises(TmuxOwnerError, match=r"^immutable_record_conflict$"):
        observe_owner_terminal(request_json(tmp_path, socket_key="socket-b"))
    assert file.read_bytes() == before
    assert observe_owner_terminal(request_json(tmp_path, socket_key="socket-a")) == original


def test_an_observer_killed_after_its_journal_is_recovered_by_the_next_observer(state_dir: Path) -> None:
    """An observer killed after journaling leaves the lock free, and the next observer publishes the journaled
    observation.
    """
    crashed = request_json(
        state_dir, observer="raw_monitor", observed_at="2026-01-01T00:00:05.000Z", operator_dispatch_id="dispatch"
    )
    result = subprocess.run(
        [sys.executable, "-c", CRASHING_WORKER, json.dumps(crashed)],
        env=worker_env(),
        cwd=PROJECT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 17
    root = root_of(state_dir)
    journal = json.loads((root / "verdict-generation.journal").read_text())
    assert journal["observation"]["observer"] == "raw_monitor"
    assert not (root / "verdict-generation.json").exists()
    verdict = observe_owner_terminal(request_json(state_dir, signal="EXIT", observed_at="2026-01-01T00:00:30.000Z"))
    assert (verdict.observer, verdict.observed_at) == ("raw_monitor", "2026-01-01T00:00:05.000Z")
    assert verdict.classification == "expected_operator_shutdown"
    assert (root / "intent-generation.json.consumed").exists()
    assert not (root / "verdict-generation.journal").exists()
