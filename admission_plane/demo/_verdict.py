"""The demo's verdict: the invariants checked against the final state and the journal, and the summary."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

from sqlalchemy import select

from ..clock import wall_clock_ms
from ..crypto import SecretKey, event_correlation
from ..states import EventKind, RequestState
from ..store.model import Cooldown
from ..store.status import PlaneStatus, read_status
from ..values import SanitizedEvent
from ._records import DemoRun
from .worker import PROVIDER


def summarize(demo: DemoRun) -> dict[str, Any]:
    """Read the final state and the journal, check every invariant, and sum up the run."""
    demo.drain_messages()
    demo.reap(wall_clock_ms())
    status = read_status(demo.plane.engine, wall_clock_ms())
    events = _all_events(demo)
    key = SecretKey(demo.content_key, "content fingerprint")
    planned = [spec for specs in demo.plan.values() for spec in specs]
    correlation = {event_correlation(key, spec["request_id"]): spec["request_id"] for spec in planned}
    key.wipe()
    admissions = Counter(correlation.get(e.correlation_hmac) for e in events if e.kind == EventKind.REQUEST_ADMITTED)
    activations = Counter(correlation.get(e.correlation_hmac) for e in events if e.kind == EventKind.REQUEST_ACTIVE)
    outcomes: Counter[str] = Counter()
    final_state: dict[str, str] = {}
    for spec in planned:
        stored = demo.plane.get_request(spec["request_id"])
        state = "not submitted" if stored is None else str(stored.state)
        final_state[spec["request_id"]] = state
        outcomes[state] += 1

    _check_basics(demo, status, final_state, admissions, events, correlation)
    capacity = _check_capacity(demo, final_state, events, correlation)
    killed = _check_victim(demo, final_state, admissions, activations)

    waits: dict[str, list[int]] = defaultdict(list)
    for result in demo.results.values():
        if result.get("waited_ms") is not None:
            waits[result["agent"]].append(int(result["waited_ms"]))
    return {
        "turns": len(planned),
        "elapsed_s": round(demo.elapsed_s, 1),
        "outcomes": dict(sorted(outcomes.items())),
        "max_seats_observed": demo.max_seats,
        "policy": dict(
            zip(
                (
                    "max_active_turns",
                    "max_concurrent_starts",
                    "min_start_interval_ms",
                    "queue_timeout_ms",
                    "capacity_cooldown_ms",
                ),
                demo.policy.as_tuple(),
                strict=True,
            )
        ),
        "wait_ms_per_agent": {
            agent: {"turns": len(values), "mean": round(sum(values) / len(values)), "max": max(values)}
            for agent, values in sorted(waits.items())
        },
        "events_by_kind": dict(sorted(Counter(e.kind for e in events).items())),
        "reaper": dict(demo.reaper_totals),
        "capacity_fault": capacity,
        "kill_fault": killed,
        "violations": list(demo.violations),
    }


def _all_events(demo: DemoRun) -> list[SanitizedEvent]:
    events: list[SanitizedEvent] = []
    after = 0
    while True:
        page = demo.plane.read_sanitized_events(after_event_seq=after, limit=1000)
        events.extend(page)
        if len(page) < 1000:
            return events
        after = page[-1].event_seq


def _check_basics(
    demo: DemoRun,
    status: PlaneStatus,
    final_state: dict[str, str],
    admissions: Counter[Any],
    events: list[SanitizedEvent],
    correlation: dict[str, str],
) -> None:
    if demo.max_seats > demo.policy.max_active_turns:
        demo.violations.append(f"{demo.max_seats} seats were in use; the policy allows {demo.policy.max_active_turns}")
    if status.seats_in_use or status.leases_by_phase:
        demo.violations.append(f"leases remain at the end: {status.leases_by_phase}")
    if status.queue_depth:
        demo.violations.append(f"{status.queue_depth} requests are still queued at the end")
    replayed = [rid for rid, count in admissions.items() if rid is not None and count > 1]
    if replayed:
        demo.violations.append(f"{len(replayed)} request(s) were admitted more than once")
    if any(e.correlation_hmac not in correlation for e in events if e.kind != EventKind.POLICY_DRAIN_COMPLETED):
        demo.violations.append("the journal holds events of requests this demo never planned")
    expected_other = {demo.capacity_request, demo.victim.request_id if demo.victim else None}
    unexpected = sorted(
        {state for rid, state in final_state.items() if rid not in expected_other and state != RequestState.COMPLETED}
    )
    if unexpected:
        demo.violations.append(f"turns without a fault ended {', '.join(unexpected)}")
    for worker in demo.workers:
        code = worker.process.returncode
        if not worker.killed and code != 0:
            tail = worker.stderr_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            demo.violations.append(f"worker {worker.agent} exited with status {code}: {tail[0]}")


def _check_capacity(
    demo: DemoRun, final_state: dict[str, str], events: list[SanitizedEvent], correlation: dict[str, str]
) -> dict[str, Any] | None:
    request_id = demo.capacity_request
    if request_id is None:
        return None
    result = demo.results.get(request_id)
    model = demo.options.models[0]
    if final_state.get(request_id) != RequestState.FAILED or result is None:
        demo.violations.append("the injected capacity failure did not end its turn failed")
        return {"model": model, "observed": False}
    not_before = _cooldown_end(demo, model)
    if not_before is None:
        demo.violations.append("the injected capacity failure left no cooldown")
        return {"model": model, "observed": False}
    window = (not_before - demo.policy.capacity_cooldown_ms, not_before)
    # The cooldown was written by the failed turn's completion, in the transaction that journalled its
    # ``request_provider_terminal``: an admission journalled before it committed before the cooldown existed,
    # whatever its connector's clock read (clocks are read before the write lock). One journalled after it,
    # at a time (its ``now``) inside the window, is a violation.
    cooled_at = min(
        (
            event.event_seq
            for event in events
            if event.kind == EventKind.REQUEST_PROVIDER_TERMINAL
            and correlation.get(event.correlation_hmac) == request_id
        ),
        default=0,
    )
    admitted_at = {
        correlation.get(event.correlation_hmac): (event.event_seq, event.occurred_at)
        for event in events
        if event.kind == EventKind.REQUEST_ADMITTED
    }
    same_model, other_models, held_back = 0, 0, 0
    for other in demo.results.values():
        admitted = other.get("admitted_at")
        if other["request_id"] == request_id or admitted is None:
            continue
        if other["model"] == model:
            # The cooldown holds while not_before > now, so an admission at not_before is allowed.
            seq, decided = admitted_at.get(other["request_id"], (0, 0))
            same_model += seq > cooled_at and window[0] <= decided < window[1]
        else:
            other_models += window[0] <= admitted < window[1]
            held_back += other["enqueued_at"] < window[0] and admitted > window[1] + 1_000
    if same_model:
        demo.violations.append(f"{same_model} turn(s) of the cooling model were admitted during its cooldown")
    if held_back and not other_models:
        demo.violations.append("other models did not keep flowing during the cooldown")
    return {
        "model": model,
        "observed": True,
        "cooldown_ms": demo.policy.capacity_cooldown_ms,
        "same_model_admitted_during_cooldown": same_model,
        "other_models_admitted_during_cooldown": other_models,
    }


def _cooldown_end(demo: DemoRun, model: str) -> int | None:
    with demo.plane.engine.connect() as connection:
        value = connection.execute(
            select(Cooldown.not_before).where(Cooldown.provider == PROVIDER, Cooldown.model == model)
        ).scalar()
        connection.rollback()
    return None if value is None else int(value)


def _check_victim(
    demo: DemoRun, final_state: dict[str, str], admissions: Counter[Any], activations: Counter[Any]
) -> dict[str, Any] | None:
    victim = demo.victim
    if victim is None:
        return None
    report: dict[str, Any] = {
        "agent": victim.agent,
        "killed": victim.killed_at is not None,
        "final_state": final_state.get(victim.request_id),
        "admissions": admissions.get(victim.request_id, 0),
        "passes_retained_while_child_alive": victim.passes_retained_while_child_alive,
        "phases_seen": sorted(victim.phases_seen),
        "seat_held_s": None
        if victim.released_at is None or victim.killed_at is None
        else round(victim.released_at - victim.killed_at, 1),
    }
    if victim.killed_at is None:
        demo.violations.append("the worker chosen to be killed never reached its dispatch intent")
        return report
    if victim.passes_retained_while_child_alive < 1:
        demo.violations.append("no reaper pass was seen retaining the killed worker's seat while its child lived")
    if victim.released_at is None:
        demo.violations.append("the killed worker's seat was never released")
    if report["final_state"] != RequestState.RECOVERY_REQUIRED:
        demo.violations.append(f"the killed worker's turn ended {report['final_state']}, not recovery_required")
    if report["admissions"] != 1 or activations.get(victim.request_id):
        demo.violations.append("the killed worker's turn was replayed")
    return report


def report(demo: DemoRun, summary: dict[str, Any]) -> None:
    if demo.options.json_summary:
        demo.out.write(json.dumps(summary, sort_keys=True) + "\n")
        demo.out.flush()
        return
    rows: list[tuple[str, str]] = []
    outcome_notes = {"failed": " (provider capacity, injected)", "recovery_required": " (worker killed, injected)"}
    for state, count in summary["outcomes"].items():
        rows.append(("turns " + state, f"{count}{outcome_notes.get(state, '')}"))
    policy = summary["policy"]
    rows.append(
        (
            "max seats observed",
            f"{summary['max_seats_observed']} of {policy['max_active_turns']} (policy max_active_turns)",
        )
    )
    for agent, wait in summary["wait_ms_per_agent"].items():
        rows.append((f"wait {agent}", f"{wait['turns']} turns, mean {wait['mean']} ms, max {wait['max']} ms"))
    for kind, count in summary["events_by_kind"].items():
        rows.append((f"events {kind}", str(count)))
    reaper = summary["reaper"]
    rows.append(
        (
            "reaper",
            ", ".join(
                f"{name.replace('_', ' ')} {reaper.get(name, 0)}"
                for name in ("released", "marked_recovery_required", "suspected", "retained")
            ),
        )
    )
    capacity = summary["capacity_fault"]
    if capacity is not None and capacity.get("observed"):
        rows.append(
            (
                "capacity failure",
                f"{capacity['model']} cooled down {capacity['cooldown_ms']} ms: "
                f"{capacity['same_model_admitted_during_cooldown']} of its turns and "
                f"{capacity['other_models_admitted_during_cooldown']} of other models "
                "admitted meanwhile",
            )
        )
    killed = summary["kill_fault"]
    if killed is not None:
        rows.append(
            (
                "killed worker",
                f"{killed['agent']}: seat held {killed['seat_held_s']} s "
                f"({killed['passes_retained_while_child_alive']} reaper passes while its "
                f"child lived), turn ended {killed['final_state']}, admitted "
                f"{killed['admissions']}x (never replayed)",
            )
        )
    width = max(len(label) for label, _ in rows)
    lines = [f"\nsummary ({summary['turns']} turns in {summary['elapsed_s']} s)"]
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    if summary["violations"]:
        lines.append("INVARIANTS VIOLATED:")
        lines += [f"  - {violation}" for violation in summary["violations"]]
    else:
        lines.append("all invariants held")
    demo.out.write("\n".join(lines) + "\n")
    demo.out.flush()
