"""Admission cost against queue depth for adversarial queue shapes (issue #13, item 7).

Each shape puts D requests (D = 100, 1 000, 10 000, 100 000) at the head of the queue that
the rule must *not* admit — ineligible, or behind others by priority or fair share — and a
few requests it must admit behind them. Two operations are timed, each on its own:

* ``admit_next``: one admission transaction. It must choose the oldest of the requests
  the shape says are next (checked every round). Between rounds (untimed) the lease is
  abandoned and a request like the admitted one is queued at the tail, so the shape and
  the depth stay the same.
* ``waiting_look``: the look ``wait_for_admission`` runs for the newest of the D requests
  held back: "not now", and what to wait for, which is checked against the reason the
  shape holds it back (a cooldown's end, a freed seat, a resume...).

The queue is loaded with the service's own statements in one transaction
(:mod:`benchmarks._queue`); :func:`test_bulk_queue_matches_the_plane` checks, for every
shape, that it writes exactly what the plane's own enqueue writes (requests, payloads,
journal, the admission index and its group heads). Seats, cooldowns and pauses are set
through the plane's API. SQLite runs on the real disk; PostgreSQL on the session's
database (``ADMISSION_PLANE_TEST_POSTGRES_URL``), by default up to D = 10 000
(``BENCH_ADVERSARIAL_PG_DEPTHS=100,1000,10000,100000`` to go further; ``BENCH_ADVERSARIAL_DEPTHS``
sets SQLite's). The quick mode runs every shape once at D = 50 on both.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from admission_plane import AdmissionPlane, Budget, KeyLimit, Lane, Policy
from admission_plane.evidence import ConnectorIdentity
from admission_plane.service import _admission
from admission_plane.service._wake import Wake

from ._queue import Queued, Spec, activate_queued, bulk_queue, enqueue, index_mismatches, index_tables
from ._support import (
    CONTENT_KEY,
    DEPTH_ROUNDS,
    ENCRYPTION_KEY,
    QUICK,
    RESULTS,
    empty_postgres,
    migrated,
    summary,
    wall_ms,
)


def _depths(variable: str, default: str) -> tuple[int, ...]:
    return (50,) if QUICK else tuple(int(depth) for depth in os.environ.get(variable, default).split(","))


SQLITE_DEPTHS = _depths("BENCH_ADVERSARIAL_DEPTHS", "100,1000,10000,100000")
PG_DEPTHS = _depths("BENCH_ADVERSARIAL_PG_DEPTHS", "100,1000,10000")
#: Requests the rule must admit, queued behind the D it must not.
EXTRA = 4
#: Rounds of the probe shapes, whose cost grows with D (they stop at 10 000 on SQLite, 1 000 on PostgreSQL).
PROBE_ROUNDS = 3 if QUICK else 20
#: A cooldown that outlasts every run.
FAR = 4_000_000_000_000


def _behind(wake: Wake) -> bool:
    """Behind other requests: it waits for departures only (how many: the idle agents ahead, at most 64)."""
    return 1 <= wake.queue <= 64 and not wake.seats and not wake.starts and wake.at is None


P = "antigravity"
#: The longest budget window: a charge made while the queue is built stays in it for the whole run.
WEEK = 7 * 24 * 3_600_000


def _budget_wake(wake: Wake) -> bool:
    """Out of budget: the window's own clock (when the spent charge leaves it), or a freed seat that settles a turn."""
    return wake.queue == 1 and wake.seats and not wake.starts and wake.at is not None


def _policy(**changes: Any) -> Policy:
    return Policy(32, 32, 0, 1_800_000, 30_000, **changes)


def _agents(count: int, *, session: str | None = None, **fields: Any) -> Callable[[int], Spec]:
    """The i-th held-back request: agents in turn, each in its own session unless ``session`` is given."""

    def spec(index: int) -> Spec:
        agent = f"agent-{index % count}"
        return Spec(agent=agent, session=session or f"s-{agent}", **fields)

    return spec


@attrs.frozen
class Shape:
    """A queue shape: D held-back requests, the requests behind them the rule must admit, and the set-up."""

    name: str
    #: The i-th of the D oldest requests.
    held_back: Callable[[int], Spec]
    #: Queued behind them, ``EXTRA`` times (``None``: the admissible ones are among the D).
    admissible: Spec | None
    #: Which queued requests the rule admits first (it must admit the oldest of them).
    first: Callable[[Spec], bool]
    #: Whether the newest held-back request's look answers with the right thing to wait for.
    wake: Callable[[Wake], bool]
    policy: Policy = attrs.field(factory=_policy)
    #: Active turns held before the queue is built.
    seats: tuple[Spec, ...] = ()
    #: Cooldowns and pauses, through the plane's API (the plane, its clock, the depth D).
    prepare: Callable[[AdmissionPlane, int, int], object] = lambda plane, now, depth: None
    extra: int = EXTRA
    #: Not one of the issue's shapes: the D held back are spread over D groups (agents, keys).
    probe: bool = False


def _cool_model(index: int) -> str:
    return f"m-cool-{index:06d}"


def _cool(plane: AdmissionPlane, now: int, depth: int) -> None:
    """A cooldown on each of the D held-back requests' models, one API call each."""
    for index in range(depth):
        plane.set_capacity_cooldown(P, _cool_model(index), FAR, now)


_BUSY = tuple(Spec(agent=f"agent-{index}", session=f"s-agent-{index}") for index in range(3))
_INTERACTIVE, _BATCH = Lane("interactive", 1000), Lane("batch")
SHAPES = {
    shape.name: shape
    for shape in (
        Shape(
            "friendly",
            _agents(16),
            None,
            lambda spec: spec.agent not in {seat.agent for seat in _BUSY},
            _behind,
            seats=_BUSY,
        ),
        Shape(
            "cooling",
            _agents(16, model="m-cool"),
            Spec(agent="agent-w", session="s-w", model="m-warm"),
            lambda spec: spec.model == "m-warm",
            lambda wake: wake == Wake(at=FAR),
            prepare=lambda plane, now, depth: plane.set_capacity_cooldown(P, "m-cool", FAR, now),
        ),
        Shape(
            "busy_agents",
            _agents(4),
            Spec(agent="lean", session="s-lean"),
            lambda spec: spec.agent == "lean",
            lambda wake: wake == Wake(queue=1, seats=True),
            # Two seats for each agent of the queue, one for the agent behind them: fewest seats first.
            seats=(*(_agents(4)(index % 4) for index in range(8)), Spec(agent="lean", session="s-lean")),
        ),
        Shape(
            "busy_agents_idle_newest",
            _agents(4),
            Spec(agent="idle", session="s-idle"),
            lambda spec: spec.agent == "idle",
            lambda wake: wake == Wake(queue=1, seats=True),
            seats=tuple(_agents(4)(index) for index in range(4)),
            extra=1,
        ),
        Shape(
            "key_full",
            _agents(16, model="m-full"),
            Spec(agent="agent-o", session="s-o", model="m-open"),
            lambda spec: spec.model == "m-open",
            lambda wake: wake == Wake(queue=1, seats=True, starts=True),
            policy=_policy(key_limits=(KeyLimit(P, "m-full", max_active_turns=1),)),
            seats=(Spec(agent="holder", session="s-holder", model="m-full"),),
        ),
        Shape(
            "provider_full",
            _agents(16, provider="p-full"),
            Spec(agent="agent-o", session="s-o"),
            lambda spec: spec.provider == P,
            lambda wake: wake == Wake(queue=1, seats=True, starts=True),
            policy=_policy(key_limits=(KeyLimit("p-full", max_active_turns=1),)),
            seats=(Spec(agent="holder", session="s-holder", provider="p-full"),),
        ),
        Shape(
            "paused_key",
            _agents(16, model="m-paused"),
            Spec(agent="agent-o", session="s-o", model="m-open"),
            lambda spec: spec.model == "m-open",
            lambda wake: wake == Wake(),
            prepare=lambda plane, now, depth: plane.pause(provider=P, model="m-paused", now=now),
        ),
        Shape(
            "paused_lane",
            _agents(16, lane="interactive"),
            Spec(agent="agent-o", session="s-o", lane="batch"),
            lambda spec: spec.lane == "batch",
            lambda wake: wake == Wake(),
            policy=_policy(lanes=(_INTERACTIVE, _BATCH)),
            prepare=lambda plane, now, depth: plane.pause(lane="interactive", now=now),
        ),
        Shape(
            "lower_lane",
            _agents(16, lane="batch"),
            Spec(agent="agent-o", session="s-o", lane="interactive"),
            lambda spec: spec.lane == "interactive",
            _behind,
            policy=_policy(lanes=(_INTERACTIVE, _BATCH)),
            extra=1,
        ),
        Shape(
            "session_full",
            _agents(4),
            Spec(agent="agent-0", session="s-open"),
            lambda spec: spec.session == "s-open",
            lambda wake: wake == Wake(queue=1, seats=True),
            policy=_policy(max_turns_per_session=1),
            seats=tuple(_agents(4)(index) for index in range(4)),
        ),
        Shape(
            "session_full_shared",
            _agents(16, session="s-full"),
            Spec(agent="agent-o", session="s-open"),
            lambda spec: spec.session == "s-open",
            lambda wake: wake == Wake(queue=1, seats=True),
            policy=_policy(max_turns_per_session=1),
            seats=(Spec(agent="holder", session="s-full"),),
        ),
        # Beyond the list: shapes whose cost the rule bounds by something other than seats.
        Shape(
            "session_full_many_agents",
            lambda index: Spec(agent=f"agent-{index}", session="s-full"),
            Spec(agent="agent-o", session="s-open"),
            lambda spec: spec.session == "s-open",
            lambda wake: wake == Wake(queue=1, seats=True),
            policy=_policy(max_turns_per_session=1),
            seats=(Spec(agent="holder", session="s-full"),),
            probe=True,
        ),
        Shape(
            "many_models",
            lambda index: Spec(agent=f"agent-{index % 16}", session=f"s-{index % 16}", model=f"m-{index:06d}"),
            None,
            lambda spec: True,
            _behind,
            probe=True,
        ),
        Shape(
            "cooling_keys",
            lambda index: Spec(agent=f"agent-{index % 16}", session=f"s-{index % 16}", model=_cool_model(index)),
            Spec(agent="agent-w", session="s-w", model="m-warm"),
            lambda spec: spec.model == "m-warm",
            lambda wake: wake == Wake(at=FAR),
            prepare=lambda plane, now, depth: _cool(plane, now, depth),
            probe=True,
        ),
        Shape(
            "no_payload",
            _agents(16, payload=False),
            Spec(agent="agent-p", session="s-p"),
            lambda spec: spec.payload,
            lambda wake: wake == Wake(),
        ),
        # Issue 14: the oldest requests' key is out of budget (a request budget spent, so the key is
        # skipped by its head; a token budget spent, so the key's best request does not fit).
        Shape(
            "budget_requests_spent",
            _agents(16, model="m-spent"),
            Spec(agent="agent-o", session="s-o", model="m-open"),
            lambda spec: spec.model == "m-open",
            _budget_wake,
            policy=_policy(budgets=(Budget(P, "m-spent", WEEK, max_requests=2),)),
            prepare=lambda plane, now, depth: plane.record_external_usage(P, "m-spent", requests=2, now=now),
        ),
        Shape(
            "budget_tokens_spent",
            _agents(16, model="m-spent"),
            Spec(agent="agent-o", session="s-o", model="m-open"),
            lambda spec: spec.model == "m-open",
            _budget_wake,
            policy=_policy(budgets=(Budget(P, "m-spent", WEEK, max_tokens=1_000),)),
            prepare=lambda plane, now, depth: plane.record_external_usage(P, "m-spent", tokens=1_000, now=now),
        ),
    )
}


def _probe(shape: Shape) -> Spec:
    """A request that is cancelled at once: its enqueue writes the plane's queued-owner row."""
    return Spec(agent="probe", session="s-probe", lane=shape.policy.default_lane)


def _open(target: str, policy: Policy, owner: ConnectorIdentity | None = None) -> AdmissionPlane:
    return AdmissionPlane(
        target, policy=policy, encryption_key=ENCRYPTION_KEY, content_fingerprint_key=CONTENT_KEY, owner_identity=owner
    )


def _hold_seat(plane: AdmissionPlane, request_id: str, spec: Spec, now: int) -> None:
    """Queue, admit and activate one turn (it keeps its seat)."""
    enqueue(plane, Queued(request_id, spec, now))
    activate_queued(plane, request_id, now)


def _queue(shape: Shape, depth: int, start: int) -> list[Queued]:
    items = [Queued(f"q{index:06d}", shape.held_back(index), start + index) for index in range(depth)]
    if shape.admissible is not None:
        items += [Queued(f"e{index:02d}", shape.admissible, start + depth + index) for index in range(shape.extra)]
    return items


class Scene:
    """A plane over one shape at one depth, the requests the rule must admit next, and the clock."""

    def __init__(self, dialect: str, shape: Shape, depth: int, plane: AdmissionPlane, items: list[Queued]) -> None:
        self.dialect, self.shape, self.depth, self.plane = dialect, shape, depth, plane
        self.owner = plane.owner_identity.owner_instance_id
        self.now = items[-1].enqueued_at + 10
        self.next = deque(item.request_id for item in items if shape.first(item.spec))
        self.specs = {item.request_id: item.spec for item in items}
        self.held_back = items[depth - 1].request_id
        assert not shape.first(items[depth - 1].spec) or shape.admissible is None
        self.lease: Any = None
        self.added = 0

    @property
    def waiter(self) -> str:
        """The newest held-back request (for the friendly shape, where the admissible ones are the queue
        itself, the newest queued: the admission rounds may have admitted the D-th by now)."""
        return self.held_back if self.shape.admissible is not None else self.next[-1]

    def admitted(self, lease: Any) -> None:
        """Check the choice against the shape: the oldest of the requests it says come first."""
        assert lease is not None, (self.shape.name, self.depth)
        assert lease.request_id == self.next[0], (self.shape.name, self.depth, lease.request_id, self.next[0])
        self.lease = lease

    def refill(self) -> None:
        """Untimed: free the last admitted seat and queue a request like it at the tail."""
        self.now += 1
        if self.lease is not None:
            self.plane.abandon_before_prompt(self.lease, self.now, "cancelled")
            admitted = self.next.popleft()
            self.lease = None
            self.added += 1
            request_id = f"r{self.added:05d}"
            enqueue(self.plane, Queued(request_id, self.specs[admitted], self.now))
            self.specs[request_id] = self.specs[admitted]
            self.next.append(request_id)
        self.now += 1


def _cases() -> list[tuple[str, str, int]]:
    return [
        (dialect, name, depth)
        for dialect, depths, probe_cap in (("sqlite", SQLITE_DEPTHS, 10_000), ("postgresql", PG_DEPTHS, 1_000))
        for name, shape in SHAPES.items()
        for depth in depths
        if not shape.probe or depth <= probe_cap
    ]


@pytest.fixture(scope="session")
def template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated, empty SQLite file, copied for every case."""
    base = os.environ.get("BENCH_DISK_DIR")
    folder = Path(base) if base else tmp_path_factory.mktemp("adversarial-template")
    return migrated(folder / f"template-{os.getpid()}.sqlite")


def _build(target: str, shape: Shape, depth: int) -> tuple[AdmissionPlane, list[Queued]]:
    """Seats through the API, then cooldowns and pauses, then the queue in one transaction."""
    start = wall_ms()
    plane = _open(target, shape.policy)
    try:
        for index, spec in enumerate(shape.seats):
            _hold_seat(plane, f"held-{index}", spec, start + 10 * index)
        now = start + 10 * len(shape.seats) + 10
        shape.prepare(plane, now, depth)
        if not shape.seats:  # the queued-owner row the bulk load binds to (``enqueue`` writes it)
            enqueue(plane, Queued("owner-probe", _probe(shape), now))
            plane.cancel_queued("owner-probe", now + 1)
        items = _queue(shape, depth, now + 10)
        bulk_queue(target, items, plane.owner_identity.owner_instance_id)
    except BaseException:
        plane.close()
        raise
    return plane, items


@pytest.fixture(scope="module", params=_cases(), ids=lambda case: f"{case[0]}-{case[1]}-D{case[2]}")
def scene(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    template_file: Path,
    postgres_database: Any,
) -> Iterator[Scene]:
    """A database holding one shape at one depth (SQLite on the real disk, or the session's PostgreSQL)."""
    dialect, name, depth = request.param
    shape = SHAPES[name]
    folder: Path | None = None
    if dialect == "sqlite":
        base = os.environ.get("BENCH_DISK_DIR")
        folder = tmp_path_factory.mktemp(f"adv-{name}-{depth}") if not base else Path(base) / f"adv-{name}-{depth}"
        folder.mkdir(parents=True, exist_ok=True)
        target = str(folder / "depth.sqlite")
        shutil.copyfile(template_file, target)
    else:
        if postgres_database.url is None:
            pytest.skip(postgres_database.unavailable or "PostgreSQL is unavailable")
        target = postgres_database.url
        empty_postgres(target)
    plane, items = _build(target, shape, depth)
    try:
        yield Scene(dialect, shape, depth, plane, items)
    finally:
        plane.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _record(scene: Scene, operation: str, times: list[float], benchmark: Any) -> None:
    stats = summary(times)
    figures = {
        "depth": scene.depth,
        "median_us": stats["median_s"] * 1e6,
        "mean_us": stats["mean_s"] * 1e6,
        "min_us": stats["min_s"] * 1e6,
        "rounds": stats["count"],
    }
    benchmark.extra_info.update(figures)
    shapes = RESULTS.setdefault("depth_adversarial", {}).setdefault(scene.dialect, {})
    shapes.setdefault(scene.shape.name, {}).setdefault(operation, {})[str(scene.depth)] = figures
    if scene.shape.probe:
        probes = RESULTS.setdefault("depth_adversarial_probes", [])
        if scene.shape.name not in probes:
            probes.append(scene.shape.name)


def test_adversarial_admit_next(benchmark, scene: Scene) -> None:
    """One admission transaction picks the shape's next request, at every depth."""
    times: list[float] = []
    rounds = PROBE_ROUNDS if scene.shape.probe else DEPTH_ROUNDS

    def admit() -> None:
        start = time.perf_counter()
        lease = scene.plane.admit_next(scene.now, scene.owner)
        times.append(time.perf_counter() - start)
        scene.admitted(lease)

    for _ in range(3):
        scene.refill()
        admit()
    times.clear()
    benchmark.pedantic(admit, setup=scene.refill, rounds=rounds, iterations=1)
    while len(times) < rounds:
        scene.refill()
        admit()
    scene.refill()
    _record(scene, "admit_next", times, benchmark)


def test_adversarial_waiting_look(benchmark, scene: Scene) -> None:
    """The newest held-back request's look says "not now" and what to wait for, at every depth."""
    times: list[float] = []
    ctx = scene.plane._ctx
    rounds = PROBE_ROUNDS if scene.shape.probe else DEPTH_ROUNDS

    def look() -> None:
        scene.now += 1
        start = time.perf_counter()
        lease, wake = _admission.admit_request(ctx, scene.waiter, scene.now, scene.owner)
        times.append(time.perf_counter() - start)
        assert lease is None
        assert wake is not None
        assert scene.shape.wake(wake), (scene.shape.name, wake)

    for _ in range(3):
        look()
    times.clear()
    benchmark.pedantic(look, rounds=rounds, iterations=1)
    while len(times) < rounds:
        look()
    _record(scene, "waiting_look", times, benchmark)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_bulk_queue_matches_the_plane(name: str, tmp_path: Path, template_file: Path) -> None:
    """For every shape, the bulk load writes exactly what the plane's own enqueue writes (small D, SQLite),
    and both pass ``db check``'s comparison of the admission index with the queue."""
    shape, depth, owner = SHAPES[name], 40, ConnectorIdentity.capture()
    tables = []
    for how in ("api", "bulk"):
        target = str(tmp_path / f"{how}.sqlite")
        shutil.copyfile(template_file, target)
        start = 1_900_000_000_000
        with _open(target, shape.policy, owner) as plane:  # one owner for both, so the bound owner IDs compare
            enqueue(plane, Queued("owner-probe", _probe(shape), start))
            plane.cancel_queued("owner-probe", start + 1)
            items = _queue(shape, depth, start + 10)
            if how == "api":
                for item in items:
                    enqueue(plane, item)
            else:
                bulk_queue(target, items, plane.owner_identity.owner_instance_id)
        tables.append(index_tables(target))
        assert index_mismatches(target) == [], (name, how)
    api, bulk = tables
    assert api["queue_entries"], name
    for table in api:
        assert bulk[table] == api[table], (name, table)
