"""``admission-plane demo``: several real agents share one plane, with two injected faults.

What runs: one worker process per agent (:mod:`admission_plane._demo_worker`), each a
connector with its own process identity, submitting its turns one after another through
the high-level turn API; every provider call is a real child process. This process shows
live progress from the database, runs the reaper with live ``/proc`` evidence, and
injects, unless told not to:

* a **provider capacity failure**: one turn's provider exits "overloaded", the turn ends
  ``failed`` with ``provider_capacity`` and its model cools down; turns of that model
  wait while the other models keep flowing;
* a **worker killed mid-dispatch**: one worker is SIGKILLed right after its dispatch
  intent committed. Its provider child (in its own process group) lives on for a while;
  the reaper must keep the seat while the child lives, and release it once connector,
  child and group are gone. The turn ends ``recovery_required`` and is never replayed.
  A replacement worker (a new connector) carries on with that agent's later turns.

The run ends with a summary and checks the invariants; the exit status is 1 if any of
them was violated. Keys are generated per run (or loaded, with ``--db``) and handed to
the workers in their environment; neither keys nor prompts are ever printed.
"""

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
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, TextIO

import attrs

from .keys import CONTENT_KEY_VARIABLE, ENCRYPTION_KEY_VARIABLE

__all__ = ["DemoOptions", "run_demo"]

_PR_SET_CHILD_SUBREAPER = 36
_TICK_S = 0.1
_REAP_EVERY_S = 0.25
_HANG_AT_LEAST_S = 1.0
_RELEASE_TIMEOUT_S = 15.0
_DEMO_TIMEOUT_S = 180.0
_TERMINAL = ("completed", "failed", "cancelled", "queue_timeout", "recovery_required")


@attrs.frozen
class DemoOptions:
    """Flags of ``admission-plane demo`` (see ``admission-plane demo --help``)."""

    agents: int = 6
    turns: int = 5
    seats: int = 3
    starts: int = 2
    start_interval_ms: int = 0
    cooldown_ms: int = 4_000
    models: tuple[str, ...] = ("model-a", "model-b")
    provider_ms: tuple[int, int] = (200, 700)
    capacity_fault: bool = True
    kill_fault: bool = True
    database: str | None = None
    key_file: str | None = None
    json_summary: bool = False
    progress: str = "auto"
    queue_timeout_ms: int = 600_000


@attrs.define
class _Worker:
    agent: str
    process: subprocess.Popen[str]
    stderr_path: Path
    killed: bool = False


@attrs.define
class _Victim:
    """The turn whose worker is killed mid-dispatch, and what the reaper did about it."""

    request_id: str
    agent: str
    index: int
    killed_at: float | None = None
    child_pid: int | None = None
    child_killed_at: float | None = None
    passes_retained_while_child_alive: int = 0
    phases_seen: set[str] = attrs.field(factory=set)
    released_at: float | None = None


class _Display:
    """A redrawn line on a terminal, plain periodic lines otherwise."""

    def __init__(self, mode: str, out: TextIO) -> None:
        if mode == "auto":
            mode = "live" if out.isatty() else "lines"
        self.mode, self.out = mode, out
        self._last_line = ""
        self._last_print = 0.0

    def update(self, line: str) -> None:
        if self.mode == "live":
            self.out.write("\r\x1b[K" + line)
            self.out.flush()
        elif self.mode == "lines":
            now = time.monotonic()
            if line != self._last_line and now - self._last_print >= 1.0:
                self.out.write(line + "\n")
                self.out.flush()
                self._last_line, self._last_print = line, now

    def note(self, line: str) -> None:
        if self.mode == "live":
            self.out.write("\r\x1b[K" + line + "\n")
        elif self.mode == "lines":
            self.out.write(line + "\n")
        self.out.flush()

    def finish(self) -> None:
        if self.mode == "live":
            self.out.write("\r\x1b[K")
            self.out.flush()


def run_demo(options: DemoOptions, out: TextIO | None = None) -> int:
    """Run the demo; returns 0 when every invariant held, 1 otherwise."""
    out = out or sys.stdout
    workdir = Path(tempfile.mkdtemp(prefix="admission-plane-demo-"))
    try:
        return _Demo(options, workdir, out).run()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _Demo:
    def __init__(self, options: DemoOptions, workdir: Path, out: TextIO) -> None:
        from .policy import Policy

        self.options = options
        self.workdir = workdir
        self.out = out
        self.display = _Display(options.progress if not options.json_summary else "none", out)
        self.policy = Policy(
            options.seats, options.starts, options.start_interval_ms, options.queue_timeout_ms, options.cooldown_ms
        )
        self.messages: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.workers: list[_Worker] = []
        self.results: dict[str, dict[str, Any]] = {}
        self.violations: list[str] = []
        self.max_seats = 0
        self.reaper_totals: Counter[str] = Counter()
        self.victim: _Victim | None = None
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
                self.victim = _Victim(spec["request_id"], agent, index)
        return plan

    def _database(self) -> tuple[str, bytes, bytes]:
        from .keys import load_keys

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
                    sys.executable, "-m", "admission_plane._demo_worker",
                    "--db", self.database,
                    "--agent", agent,
                    "--policy", json.dumps(list(self.policy.as_tuple())),
                    "--plan", json.dumps(specs),
                ],
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                text=True,
                env=environment,
            )
        worker = _Worker(agent, process, stderr_path)
        self.workers.append(worker)
        threading.Thread(target=self._read_worker, args=(worker,), daemon=True).start()

    def _read_worker(self, worker: _Worker) -> None:
        assert worker.process.stdout is not None
        for line in worker.process.stdout:
            with contextlib.suppress(ValueError):
                self.messages.put((worker.agent, json.loads(line)))

    # --- the run -----------------------------------------------------------------------------------

    def run(self) -> int:
        from .migrate import upgrade
        from .service import AdmissionPlane

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
            self.database, policy=self.policy, encryption_key=self.encryption_key,
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
            summary = self._summarize()
        finally:
            self.plane.close()
        self._report(summary)
        return 1 if self.violations else 0

    def _supervise(self, started: float) -> None:
        from ._status import read_status
        from .service import wall_clock_ms

        last_reap = 0.0
        while True:
            self._drain_messages()
            now_s = time.monotonic()
            if now_s - last_reap >= _REAP_EVERY_S:
                self._reap(wall_clock_ms())
                last_reap = now_s
            status = read_status(self.plane.engine, wall_clock_ms())
            self.max_seats = max(self.max_seats, status.seats_in_use)
            self.display.update(self._progress_line(status))
            self._advance_victim()
            workers_done = all(worker.process.poll() is not None for worker in self.workers)
            victim_done = self.victim is None or self.victim.released_at is not None or (
                self.victim.killed_at is None and workers_done
            )
            if workers_done and victim_done and self.messages.empty():
                return
            if now_s - started > _DEMO_TIMEOUT_S:
                self.violations.append(f"the demo did not finish within {_DEMO_TIMEOUT_S:.0f} s")
                return
            time.sleep(_TICK_S)

    def _drain_messages(self) -> None:
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

    def _reap(self, now: int) -> None:
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
            if victim is not None and victim.child_killed_at is not None and victim.released_at is None and (
                time.monotonic() - victim.child_killed_at > _RELEASE_TIMEOUT_S
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

    def _progress_line(self, status: Any) -> str:
        states = status.requests_by_state
        starting = sum(states.get(s, 0) for s in ("admitted", "starting", "dispatch_intent"))
        done = sum(states.get(s, 0) for s in _TERMINAL)
        total = self.options.agents * self.options.turns
        cooling = ", ".join(
            f"{model} {max(0, nb - status.now) / 1000:.1f}s" for _p, model, nb in status.cooldowns
        )
        line = (
            f"queued {states.get('queued', 0):>2}  starting {starting:>2}  active {states.get('active', 0):>2}  "
            f"done {done:>3}/{total}  seats {status.seats_in_use}/{self.policy.max_active_turns}"
        )
        if states.get("recovery_required"):
            line += f"  recovery {states['recovery_required']}"
        if cooling:
            line += f"  cooling {cooling}"
        return line

    # --- the verdict ---------------------------------------------------------------------------------

    def _summarize(self) -> dict[str, Any]:
        from ._status import read_status
        from .crypto import SecretKey, event_correlation
        from .service import wall_clock_ms

        self._drain_messages()
        self._reap(wall_clock_ms())
        status = read_status(self.plane.engine, wall_clock_ms())
        events = self._all_events()
        key = SecretKey(self.content_key, "content fingerprint")
        planned = [spec for specs in self.plan.values() for spec in specs]
        correlation = {event_correlation(key, spec["request_id"]): spec["request_id"] for spec in planned}
        key.wipe()
        admissions = Counter(correlation.get(e.correlation_hmac) for e in events if e.kind == "request_admitted")
        activations = Counter(correlation.get(e.correlation_hmac) for e in events if e.kind == "request_active")
        outcomes: Counter[str] = Counter()
        final_state: dict[str, str] = {}
        for spec in planned:
            stored = self.plane.get_request(spec["request_id"])
            state = "not submitted" if stored is None else str(stored.state)
            final_state[spec["request_id"]] = state
            outcomes[state] += 1

        self._check_basics(status, final_state, admissions, events, correlation)
        capacity = self._check_capacity(final_state)
        killed = self._check_victim(final_state, admissions, activations)

        waits: dict[str, list[int]] = defaultdict(list)
        for result in self.results.values():
            if result.get("waited_ms") is not None:
                waits[result["agent"]].append(int(result["waited_ms"]))
        return {
            "turns": len(planned),
            "elapsed_s": round(self.elapsed_s, 1),
            "outcomes": dict(sorted(outcomes.items())),
            "max_seats_observed": self.max_seats,
            "policy": dict(zip(("max_active_turns", "max_concurrent_starts", "min_start_interval_ms",
                                "queue_timeout_ms", "capacity_cooldown_ms"), self.policy.as_tuple(), strict=True)),
            "wait_ms_per_agent": {
                agent: {"turns": len(values), "mean": round(sum(values) / len(values)), "max": max(values)}
                for agent, values in sorted(waits.items())
            },
            "events_by_kind": dict(sorted(Counter(e.kind for e in events).items())),
            "reaper": dict(self.reaper_totals),
            "capacity_fault": capacity,
            "kill_fault": killed,
            "violations": list(self.violations),
        }

    def _all_events(self) -> list[Any]:
        events: list[Any] = []
        after = 0
        while True:
            page = self.plane.read_sanitized_events(after_event_seq=after, limit=1000)
            events.extend(page)
            if len(page) < 1000:
                return events
            after = page[-1].event_seq

    def _check_basics(
        self, status: Any, final_state: dict[str, str], admissions: Counter[Any], events: list[Any],
        correlation: dict[str, str],
    ) -> None:
        if self.max_seats > self.policy.max_active_turns:
            self.violations.append(
                f"{self.max_seats} seats were in use; the policy allows {self.policy.max_active_turns}"
            )
        if status.seats_in_use or status.leases_by_phase:
            self.violations.append(f"leases remain at the end: {status.leases_by_phase}")
        if status.queue_depth:
            self.violations.append(f"{status.queue_depth} requests are still queued at the end")
        replayed = [rid for rid, count in admissions.items() if rid is not None and count > 1]
        if replayed:
            self.violations.append(f"{len(replayed)} request(s) were admitted more than once")
        if any(e.correlation_hmac not in correlation for e in events if e.kind != "policy_drain_completed"):
            self.violations.append("the journal holds events of requests this demo never planned")
        expected_other = {self.capacity_request, self.victim.request_id if self.victim else None}
        unexpected = sorted({state for rid, state in final_state.items()
                             if rid not in expected_other and state != "completed"})
        if unexpected:
            self.violations.append(f"turns without a fault ended {', '.join(unexpected)}")
        for worker in self.workers:
            code = worker.process.returncode
            if not worker.killed and code != 0:
                tail = worker.stderr_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
                self.violations.append(f"worker {worker.agent} exited with status {code}: {tail[0]}")

    def _check_capacity(self, final_state: dict[str, str]) -> dict[str, Any] | None:
        request_id = self.capacity_request
        if request_id is None:
            return None
        result = self.results.get(request_id)
        model = self.options.models[0]
        if final_state.get(request_id) != "failed" or result is None:
            self.violations.append("the injected capacity failure did not end its turn failed")
            return {"model": model, "observed": False}
        not_before = self._cooldown_end(model)
        if not_before is None:
            self.violations.append("the injected capacity failure left no cooldown")
            return {"model": model, "observed": False}
        window = (not_before - self.policy.capacity_cooldown_ms, not_before)
        same_model, other_models, held_back = 0, 0, 0
        for other in self.results.values():
            admitted = other.get("admitted_at")
            if other["request_id"] == request_id or admitted is None:
                continue
            # The cooldown holds while not_before > now, so an admission at not_before is allowed.
            inside = window[0] <= admitted < window[1]
            if other["model"] == model:
                same_model += inside
            else:
                other_models += inside
                held_back += other["enqueued_at"] < window[0] and admitted > window[1] + 1_000
        if same_model:
            self.violations.append(f"{same_model} turn(s) of the cooling model were admitted during its cooldown")
        if held_back and not other_models:
            self.violations.append("other models did not keep flowing during the cooldown")
        return {
            "model": model,
            "observed": True,
            "cooldown_ms": self.policy.capacity_cooldown_ms,
            "same_model_admitted_during_cooldown": same_model,
            "other_models_admitted_during_cooldown": other_models,
        }

    def _cooldown_end(self, model: str) -> int | None:
        from sqlalchemy import select

        from ._demo_worker import PROVIDER
        from .model import Cooldown

        with self.plane.engine.connect() as connection:
            value = connection.execute(
                select(Cooldown.not_before).where(Cooldown.provider == PROVIDER, Cooldown.model == model)
            ).scalar()
            connection.rollback()
        return None if value is None else int(value)

    def _check_victim(
        self, final_state: dict[str, str], admissions: Counter[Any], activations: Counter[Any]
    ) -> dict[str, Any] | None:
        victim = self.victim
        if victim is None:
            return None
        report: dict[str, Any] = {
            "agent": victim.agent,
            "killed": victim.killed_at is not None,
            "final_state": final_state.get(victim.request_id),
            "admissions": admissions.get(victim.request_id, 0),
            "passes_retained_while_child_alive": victim.passes_retained_while_child_alive,
            "phases_seen": sorted(victim.phases_seen),
            "seat_held_s": None if victim.released_at is None or victim.killed_at is None
            else round(victim.released_at - victim.killed_at, 1),
        }
        if victim.killed_at is None:
            self.violations.append("the worker chosen to be killed never reached its dispatch intent")
            return report
        if victim.passes_retained_while_child_alive < 1:
            self.violations.append("no reaper pass was seen retaining the killed worker's seat while its child lived")
        if victim.released_at is None:
            self.violations.append("the killed worker's seat was never released")
        if report["final_state"] != "recovery_required":
            self.violations.append(f"the killed worker's turn ended {report['final_state']}, not recovery_required")
        if report["admissions"] != 1 or activations.get(victim.request_id):
            self.violations.append("the killed worker's turn was replayed")
        return report

    def _report(self, summary: dict[str, Any]) -> None:
        if self.options.json_summary:
            self.out.write(json.dumps(summary, sort_keys=True) + "\n")
            self.out.flush()
            return
        rows: list[tuple[str, str]] = []
        outcome_notes = {"failed": " (provider capacity, injected)", "recovery_required": " (worker killed, injected)"}
        for state, count in summary["outcomes"].items():
            rows.append(("turns " + state, f"{count}{outcome_notes.get(state, '')}"))
        policy = summary["policy"]
        rows.append(("max seats observed", f"{summary['max_seats_observed']} of {policy['max_active_turns']} "
                                           "(policy max_active_turns)"))
        for agent, wait in summary["wait_ms_per_agent"].items():
            rows.append((f"wait {agent}", f"{wait['turns']} turns, mean {wait['mean']} ms, max {wait['max']} ms"))
        for kind, count in summary["events_by_kind"].items():
            rows.append((f"events {kind}", str(count)))
        reaper = summary["reaper"]
        rows.append(("reaper", ", ".join(f"{name.replace('_', ' ')} {reaper.get(name, 0)}" for name in
                                         ("released", "marked_recovery_required", "suspected", "retained"))))
        capacity = summary["capacity_fault"]
        if capacity is not None and capacity.get("observed"):
            rows.append(("capacity failure", f"{capacity['model']} cooled down {capacity['cooldown_ms']} ms: "
                                             f"{capacity['same_model_admitted_during_cooldown']} of its turns and "
                                             f"{capacity['other_models_admitted_during_cooldown']} of other models "
                                             "admitted meanwhile"))
        killed = summary["kill_fault"]
        if killed is not None:
            rows.append(("killed worker", f"{killed['agent']}: seat held {killed['seat_held_s']} s "
                                          f"({killed['passes_retained_while_child_alive']} reaper passes while its "
                                          f"child lived), turn ended {killed['final_state']}, admitted "
                                          f"{killed['admissions']}x (never replayed)"))
        width = max(len(label) for label, _ in rows)
        lines = [f"\nsummary ({summary['turns']} turns in {summary['elapsed_s']} s)"]
        lines += [f"  {label:<{width}}  {value}" for label, value in rows]
        if summary["violations"]:
            lines.append("INVARIANTS VIOLATED:")
            lines += [f"  - {violation}" for violation in summary["violations"]]
        else:
            lines.append("all invariants held")
        self.out.write("\n".join(lines) + "\n")
        self.out.flush()


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

