"""Policy v2 under contention: eight OS processes on one database (an SQLite file or PostgreSQL) with mixed lanes,
provider/model keys and shared sessions never exceed a limit, and a policy set with the command line while eight
connectors run is applied by every one of them without a restart. Both judged by replaying the journal, whose
correlations the test maps back to requests with the content key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dbutil import query, scalar
from journal_replay import most_at_once, read_journal, replay, timeline
from planes import CONTENT_KEY, ENCRYPTION_KEY
from workers import WorkerProcess

from admission_plane import AdmissionPlane, KeyLimit, Lane, Policy
from admission_plane.states import EventKind

pytestmark = pytest.mark.slow

WORKERS = 8
#: What every worker runs with (its own policy: no durable policy is claimed, so it is in force as it is).
RACE_POLICY = Policy(
    4,
    3,
    0,
    1_800_000,
    200,
    lanes=(Lane("interactive", weight=3), Lane("batch")),
    key_limits=(
        KeyLimit("p1", "m1", max_active_turns=2),
        KeyLimit("p1", max_active_turns=3),
        KeyLimit("p2", max_concurrent_starts=1),
    ),
    max_turns_per_session=1,
)
ADMIN = Path(sys.executable).with_name("admission-plane")


def requests_by_correlation(plane: AdmissionPlane, database: str) -> dict[str, dict[str, str]]:
    """Every request's lane, provider, model and session, keyed by its journal correlation (computed with the
    content key, as only a holder of the key can)."""
    rows = query(database, "SELECT request_id, lane, provider, model, session_id FROM turn_requests")
    return {
        plane._ctx.keys.correlation(request_id): {
            "lane": lane,
            "provider": provider,
            "model": model,
            "session": session,
        }
        for request_id, lane, provider, model, session in rows
    }


def finish_all(workers: list[WorkerProcess]) -> list[dict[str, Any]]:
    reports = [worker.finish(timeout=120) for worker in workers]
    for report in reports:
        assert report["raw"] == [], report["raw"]
        assert report["violations"] == [], report["violations"]
    return reports


def test_eight_processes_with_lanes_keys_and_sessions_never_exceed_any_limit(
    database_url: str, make_plane: Callable[..., AdmissionPlane], spawn: Callable[..., WorkerProcess]
) -> None:
    """Eight processes racing whole turns in two lanes, three provider/model keys and six shared sessions never hold
    more seats than the global, per provider/model, per provider and per session limits allow, nor more start-window
    leases than the global and per-provider start limits; no request is admitted twice or requeued."""
    plane = make_plane(policy=RACE_POLICY)
    policy_json = json.dumps(RACE_POLICY.to_json())
    workers = [
        spawn("race-v2", database_url, str(index), "3.0", policy_json, str(2_000 + index)) for index in range(WORKERS)
    ]
    reports = finish_all(workers)
    totals: Counter[str] = Counter()
    for report in reports:
        totals.update(report["counts"])
    assert totals["admitted"] >= 8, totals
    events = list(read_journal(plane))
    journal = replay(events)
    assert journal.admitted_twice == ()
    assert journal.requeued == ()
    assert journal.discontinuities == ()
    assert sum(journal.admissions.values()) == totals["admitted"]
    requests = requests_by_correlation(plane, database_url)
    moments = list(timeline(events))

    def most(group_of: Callable[[dict[str, str]], Any], *, starts: bool = False) -> Counter[Any]:
        return most_at_once(moments, lambda c: group_of(requests[c]), starts=starts)

    assert 2 <= most(lambda r: "all")["all"] <= RACE_POLICY.max_active_turns
    assert most(lambda r: "all", starts=True)["all"] <= RACE_POLICY.max_concurrent_starts
    assert most(lambda r: (r["provider"], r["model"]))[("p1", "m1")] <= 2
    assert most(lambda r: r["provider"])["p1"] <= 3
    assert most(lambda r: r["provider"], starts=True)["p2"] <= 1
    by_session = most(lambda r: r["session"])
    assert by_session, "sessions held seats"
    assert max(by_session.values()) <= 1, by_session
    lanes = Counter(requests[c]["lane"] for c in journal.admissions)
    assert set(lanes) == {"interactive", "batch"}, f"both lanes were admitted: {lanes}"
    assert scalar(database_url, "SELECT COUNT(*) FROM leases") == 0


#: What the connectors start with: four seats, no start interval, no durable policy.
BEFORE = Policy(4, 4, 0, 1_800_000, 30_000, lanes=(Lane("interactive", weight=2), Lane("batch")))
#: What the operator puts in force with the command line: one seat (a durable revision needs a 2 s start interval).
AFTER = Policy(1, 4, 2_000, 1_800_000, 30_000, lanes=(Lane("interactive", weight=2), Lane("batch")))


def test_a_policy_set_with_the_command_line_while_eight_connectors_run_is_applied_by_all_without_restart(
    database_url: str,
    make_plane: Callable[..., AdmissionPlane],
    spawn: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    """While eight connector processes run turns on four seats, `admission-plane policy set` lowers the limit to one
    seat: every connector sees revision 1 without reopening its plane, turns running at the change end normally,
    and by journal replay no admission after the revision event leaves more than one seat held (admissions go on)."""
    plane = make_plane(policy=BEFORE)
    workers = [
        spawn(
            "race-v2",
            database_url,
            str(index),
            # Every worker still runs when the command line's revision commits, on a loaded machine too (the
            # command starts a Python process; under load that took over 5 s, and once, with the whole suite
            # running on a slower machine, longer than the workers' 14 s): past its deadline a worker goes on
            # until its plane has seen a revision and admitted once more.
            "14.0",
            json.dumps(BEFORE.to_json()),
            str(3_000 + index),
            "no-capacity-failures",
            "until-revision",
        )
        for index in range(WORKERS)
    ]
    deadline = time.monotonic() + 60
    # The change must find several seats in use: on a loaded machine the connectors start one by one, and the
    # first admissions can each end before the next connector is up, so wait until two seats are held at once.
    several = False
    while not several or scalar(database_url, "SELECT COUNT(*) FROM events WHERE kind = 'request_admitted'") < 8:
        assert time.monotonic() < deadline, "the connectors never got going"
        several = several or scalar(database_url, "SELECT COUNT(*) FROM leases") >= 2
        time.sleep(0.01)
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(AFTER.to_json()))
    environment = {
        **os.environ,
        "ADMISSION_PLANE_ENCRYPTION_KEY": ENCRYPTION_KEY.hex(),
        "ADMISSION_PLANE_CONTENT_KEY": CONTENT_KEY.hex(),
    }
    result = subprocess.run(
        [str(ADMIN), "policy", "set", "--file", str(policy_file), "--db", database_url, "--json"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert plane.current_policy().revision == 1
    assert plane.current_policy().policy == AFTER
    reports = finish_all(workers)
    assert [report["revision"] for report in reports] == [1] * WORKERS, "every connector sees the revision"
    events = list(read_journal(plane))
    journal = replay(events)
    assert journal.admitted_twice == ()
    assert journal.discontinuities == ()
    moments = list(timeline(events))
    [revised_at] = [n for n, moment in enumerate(moments) if moment.event.kind == EventKind.POLICY_REVISED]
    before = [len(m.holding) for m in moments[:revised_at] if m.event.kind == EventKind.REQUEST_ADMITTED]
    after = [len(m.holding) for m in moments[revised_at:] if m.event.kind == EventKind.REQUEST_ADMITTED]
    assert max(before) >= 2, "several seats were in use before the change"
    assert after, "admission went on under the new revision"
    assert max(after) <= 1, f"seats held at each admission after the revision: {after}"
    assert scalar(database_url, "SELECT COUNT(*) FROM leases") == 0
