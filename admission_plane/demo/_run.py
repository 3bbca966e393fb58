"""The demo's run: workers, the two faults, the reaper, live progress."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

import attrs

from ..clock import wall_clock_ms
from ..keys import CONTENT_KEY_VARIABLE, ENCRYPTION_KEY_VARIABLE, load_keys
from ..migrate import upgrade
from ..plane import AdmissionPlane
from ..policy import Policy
from ..states import START_WINDOW_PHASES, TERMINAL_STATES, RequestState
from ..store.status import PlaneStatus, read_status
from ._options import DemoOptions, Display
from ._records import Victim, Worker
from ._verdict import report, summarize

_PR_SET_CHILD_SUBREAPER = 36
_TICK_S = 0.1
_REAP_EVERY_S = 0.25
_HANG_AT_LEAST_S = 1.0
_RELEASE_TIMEOUT_S = 15.0
_DEMO_TIMEOUT_S = 180.0


def run_demo(options: DemoOptions, out: TextIO | None = None) -> int:
    """Run the demo; returns 0 when every invariant held, 1 otherwise."""
    out = out or sys.stdout
    workdir = Path(tempfile.mkdtemp(prefix="admission-plane-demo-"))
    try:
        return Demo(options, workdir, out).run()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class Demo:
    """One run of the demo."""

    def __init__(self, options: DemoOptions, workdir: Path, out: TextIO) -> None:
        self.options = options
        self.workdir = workdir
        self.out = out
        self.display = Display(options.progress if not options.json_summary else "none", out)
        self.policy = Policy(
            options.seats, options.starts, options.start_interval_ms, options.queue_timeout_ms, options.cooldown_ms
        )
        self.messages: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.workers: list[Worker] = []
        self.results: dict[str, dict[str, Any]] = {}
        self.violations: list[str] = []
        self.max_seats = 0
        self.reaper_totals: Counter[str] = Counter()
        self.victim: Victim | None = None
        self.capacity_request: str | None = None
        self.plan = self._plan()

    # --- set-up ----------------------------------------------------------------------------------

    def _plan(self) -> dict[str, list[dict[str, Any]]]:
        options = self.options
        rng = secrets.SystemRandom()
        low, high = sorted(options.provider_ms)
        plan: dict[str, list[dict[str, Any]]] = {}
        run_id = secrets.token_hex(3)
        for a in range(options.agents):
            agent = f"agent-{a}"
            plan[agent] = [
                {
                    "index": i,
                    "request_id": f"demo-{run_id}-{agent}-{i}",
                    "model": options.models[a % len(options.models)],  # an agent session keeps its model
                    "provider_ms": rng.randint(low, high),
                    "mode": "ok",
                    "kill_point": False,
                }
                for i in range(options.turns)
            ]
        if options.capacity_fault:
            # An early turn on the first model, so the cooldown overlaps plenty of other traffic.
            spec = plan["agent-0"][0]
            spec["model"], spec["mode"] = options.models[0], "capacity"
            self.capacity_request = spec["request_id"]
        if options.kill_fault:
            agent = f"agent-{options.agents - 1}"
            index = min(1, options.turns - 1)
            spec = plan[agent][index]
            if spec["request_id"] == self.capacity_request:
                index = options.turns - 1
                spec = plan[agent][index]
            if spec["request_id"] != self.capacity_request:
                spec["mode"], spec["kill_point"] = "hang", True
                self.victim = Victim(spec["request_id"], agent, index)
        return plan

    def _database(self) -> tuple[str, bytes, bytes]:
        if self.options.database is None:
            return str(self.workdir / "admission.sqlite"), secrets.token_bytes(32), secrets.token_bytes(32)
        keys = load_keys(self.options.key_file, create=True)
        return self.options.database, keys.encryption_key, keys.content_fingerprint_key

    def _start_worker(self, agent: str, specs: list[dict[str, Any]]) -> None:
        environment = dict(os.environ)
        environment[ENCRYPTION_KEY_VARIABLE] = self.encryption_key.hex()
        environment[CONTENT_KEY_VARIABLE] = self.content_key.hex()
        environment["PYTHONUNBUFFERED"] = "1"
        stderr_path = self.workdir / f"{agent}-{len(self.workers)}.stderr"
        with open(stderr_path, "w") as stderr:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "admission_plane.demo.worker",
                    "--db",
                    self.database,
                    "--agent",
                    agent,
                    "--policy",
                    json.dumps(list(self.policy.as_tuple())),
                    "--plan",
                    json.dumps(specs),
                ],
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                text=True,
                env=environment,
            )
        worker = Worker(agent, process, stderr_path)
        self.workers.append(worker)
        threading.Thread(target=self._read_worker, args=(worker,), daemon=True).start()

    def _read_worker(self, worker: Worker) -> None:
        assert worker.process.stdout is not None
        for line in worker.process.stdout:
            with contextlib.suppress(ValueError):
                self.messages.put((worker.agent, json.loads(line)))

    # --- the run -----------------------------------------------------------------------------------

    def run(self) -> int:
        self.database, self.encryption_key, self.content_key = self._database()
        upgrade(self.database)
        _become_subreaper()
        options = self.options
        total = options.agents * options.turns
        if not options.json_summary:
            self.out.write(
                f"admission-plane demo: {options.agents} agents x {options.turns} turns = {total} turns, "
                f"policy {options.seats} seats / {options.starts} starts, models {', '.join(options.models)}\n"
                f"faults: capacity failure {'on' if self.capacity_request else 'off'}, "
                f"worker SIGKILL mid-dispatch {'on' if self.victim else 'off'}\n"
            )
            self.out.flush()
        self.plane = AdmissionPlane(
            self.database,
            policy=self.policy,
            encryption_key=self.encryption_key,
            content_fingerprint_key=self.content_key,
        )
        started = time.monotonic()
        try:
            for agent, specs in self.plan.items():
                self._start_worker(agent, specs)
            self._supervise(started)
        finally:
            self._stop_workers()
            self.display.finish()
        self.elapsed_s = time.monotonic() - started
        try:
            summary = summarize(self)
        finally:
            self.plane.close()
        report(self, summary)
        return 1 if self.violations else 0

    def _supervise(self, started: float) -> None:
        last_reap = 0.0
        while True:
            self.drain_messages()
            now_s = time.monotonic()
            if now_s - last_reap >= _REAP_EVERY_S:
                self.reap(wall_clock_ms())
                last_reap = now_s
            status = read_status(self.plane.engine, wall_clock_ms())
            self.max_seats = max(self.max_seats, status.seats_in_use)
            self.display.update(self._progress_line(status))
            self._advance_victim()
            workers_done = all(worker.process.poll() is not None for worker in self.workers)
            victim_done = (
                self.victim is None
                or self.victim.released_at is not None
                or (self.victim.killed_at is None and workers_done)
            )
            if workers_done and victim_done and self.messages.empty():
                return
            if now_s - started > _DEMO_TIMEOUT_S:
                self.violations.append(f"the demo did not finish within {_DEMO_TIMEOUT_S:.0f} s")
                return
            time.sleep(_TICK_S)

    def drain_messages(self) -> None:
        while True:
            try:
                agent, message = self.messages.get_nowait()
            except queue.Empty:
                return
            if message.get("event") == "result":
                self.results[message["request_id"]] = message
                if message["request_id"] == self.capacity_request:
                    self.display.note(
                        f"fault: the provider of {message['model']} answered 'overloaded': the turn ended "
                        f"{message['outcome']} and {message['model']} cools down for "
                        f"{self.policy.capacity_cooldown_ms / 1000:.1f} s while other models keep flowing"
                    )
            elif message.get("event") == "kill_point" and self.victim is not None:
                self._kill_worker(agent, message)

    def _kill_worker(self, agent: str, message: dict[str, Any]) -> None:
        victim = self.victim
        assert victim is not None
        worker = next(w for w in self.workers if w.agent == agent and w.process.poll() is None)
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.wait()
        worker.killed = True
        victim.killed_at = time.monotonic()
        victim.child_pid = int(message["child_pid"])
        self.display.note(
            f"fault: SIGKILLed worker {agent} (pid {worker.process.pid}) right after its dispatch intent; "
            f"its provider child (pid {victim.child_pid}) keeps running"
        )
        remaining = [spec for spec in self.plan[agent] if spec["index"] > victim.index]
        if remaining:
            self._start_worker(agent, remaining)
            self.display.note(f"restarted {agent} as a new connector for its {len(remaining)} later turn(s)")

    def reap(self, now: int) -> None:
        summary = self.plane.reap_suspects(now)
        for name, value in attrs.asdict(summary).items():
            self.reaper_totals[name] += value
        victim = self.victim
        if victim is None or victim.killed_at is None or victim.released_at is not None:
            return
        lease = next((d for d in self.plane.list_recoverable_dispatches() if d.request_id == victim.request_id), None)
        if lease is not None:
            victim.phases_seen.add(str(lease.phase))
            if victim.child_killed_at is None and _alive(victim.child_pid):
                victim.passes_retained_while_child_alive += 1
        elif victim.child_killed_at is None:
            self.violations.append("the killed worker's seat was released while its provider child was alive")
            victim.released_at = time.monotonic()
        else:
            victim.released_at = time.monotonic()
            self.display.note(
                f"reaper: connector, child and group of {victim.agent}'s killed turn are gone; seat released "
                f"{victim.released_at - victim.killed_at:.1f} s after the kill"
            )

    def _advance_victim(self) -> None:
        victim = self.victim
        if victim is None or victim.killed_at is None or victim.child_killed_at is not None:
            if (
                victim is not None
                and victim.child_killed_at is not None
                and victim.released_at is None
                and (time.monotonic() - victim.child_killed_at > _RELEASE_TIMEOUT_S)
            ):
                self.violations.append("the reaper did not release the killed worker's seat after its child was gone")
                victim.released_at = time.monotonic()
            return
        if victim.passes_retained_while_child_alive >= 2 and time.monotonic() - victim.killed_at >= _HANG_AT_LEAST_S:
            assert victim.child_pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(victim.child_pid, signal.SIGKILL)
            victim.child_killed_at = time.monotonic()
            _reap_orphan(victim.child_pid)
            self.display.note(
                f"reaper kept the seat through {victim.passes_retained_while_child_alive} passes while the child "
                f"lived (phase {', '.join(sorted(victim.phases_seen))}); now killing the child's process group"
            )

    def _stop_workers(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.kill()
            worker.process.wait()
        victim = self.victim
        if victim is not None and victim.child_pid is not None and victim.child_killed_at is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(victim.child_pid, signal.SIGKILL)
            _reap_orphan(victim.child_pid)

    def _progress_line(self, status: PlaneStatus) -> str:
        states = status.requests_by_state
        starting = sum(states.get(s, 0) for s in START_WINDOW_PHASES)
        done = sum(states.get(s, 0) for s in TERMINAL_STATES)
        total = self.options.agents * self.options.turns
        cooling = ", ".join(f"{model} {max(0, nb - status.now) / 1000:.1f}s" for _p, model, nb in status.cooldowns)
        line = (
            f"queued {states.get(RequestState.QUEUED, 0):>2}  starting {starting:>2}  "
            f"active {states.get(RequestState.ACTIVE, 0):>2}  "
            f"done {done:>3}/{total}  seats {status.seats_in_use}/{self.policy.max_active_turns}"
        )
        if states.get(RequestState.RECOVERY_REQUIRED):
            line += f"  recovery {states[RequestState.RECOVERY_REQUIRED]}"
        if cooling:
            line += f"  cooling {cooling}"
        return line


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _become_subreaper() -> None:
    """Adopt orphaned descendants (the killed worker's child) so their zombies get reaped here."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_orphan(pid: int) -> None:
    """Wait for an adopted orphan in the background (a no-op if it is not our child)."""

    def wait() -> None:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)

    threading.Thread(target=wait, daemon=True).start()
