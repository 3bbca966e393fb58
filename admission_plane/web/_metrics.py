"""``/metrics``: the Prometheus text exposition of one :class:`~admission_plane.web._readings.Reading`.

Names follow the Prometheus conventions: one ``admission_plane_`` prefix, base units
(seconds), ``_total`` on counters, ``_seconds`` on durations, and labels that name a lane,
a provider, a model, a state or a kind, never a request, session, agent or host. Each
scrape builds its own registry from a fresh reading, so every value is the database's at
scrape time. Budget windows are labelled by provider, model (``""`` for a provider-wide
budget, as a pause's labels leave out what its scope does not name) and ``window_ms``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..states import SEAT_PHASES, EventKind
from ..store.statements.metrics import LIVE_REQUEST_STATES
from ._journal import REAPER_OUTCOMES
from ._readings import Reading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
P = "admission_plane_"


def _gauge(name: str, documentation: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, documentation, labels=list(labels))


def _seconds(ms: float) -> float:
    return max(0.0, ms) / 1000


class _ReadingCollector(Collector):
    def __init__(self, reading: Reading, scrape_seconds: float) -> None:
        self._reading = reading
        self._scrape_seconds = scrape_seconds

    def collect(self) -> Iterator[Metric]:
        r = self._reading
        yield from self._queue(r)
        yield from self._requests_and_leases(r)
        yield from self._limits(r)
        yield from self._cooldowns_and_pauses(r)
        yield from self._budgets(r)
        yield from self._journal(r)
        scrape = _gauge("scrape_duration_seconds", "How long this scrape took to read the database.")
        scrape.add_metric([], self._scrape_seconds)
        yield scrape

    def _queue(self, r: Reading) -> Iterator[Metric]:
        depth = _gauge(
            "queue_depth",
            "Admissible queued requests (holding their payload), by lane and provider/model key.",
            ["lane", "provider", "model"],
        )
        age = _gauge(
            "queue_oldest_age_seconds",
            "Age of the oldest admissible queued request, by lane and provider/model key.",
            ["lane", "provider", "model"],
        )
        for group in r.queue:
            labels = [group.lane, group.provider, group.model]
            depth.add_metric(labels, group.depth)
            age.add_metric(labels, _seconds(r.now - group.oldest_enqueued_at))
        total = _gauge("queue_requests", "Every queued request, with or without its payload.")
        total.add_metric([], r.queue_depth)
        waiting = _gauge(
            "queue_without_payload_requests", "Queued requests whose payload is not stored yet (not admissible)."
        )
        waiting.add_metric([], r.queued_without_payload)
        oldest = _gauge("queue_oldest_request_age_seconds", "Age of the oldest queued request (0 when none).")
        oldest.add_metric([], 0.0 if r.oldest_enqueued_at is None else _seconds(r.now - r.oldest_enqueued_at))
        yield from (depth, age, total, waiting, oldest)

    def _requests_and_leases(self, r: Reading) -> Iterator[Metric]:
        requests = _gauge("requests", "Requests that are not history, by state.", ["state"])
        for state in sorted(LIVE_REQUEST_STATES):
            requests.add_metric([state], r.requests_by_state.get(state, 0))
        recovery = _gauge(
            "recovery_required_requests", "Requests in recovery_required (a turn that may have run; never requeued)."
        )
        recovery.add_metric([], r.recovery_required)
        leases = _gauge("leases", "Seat-holding leases, by phase.", ["phase"])
        suspects = _gauge(
            "suspect_leases", "Leases marked suspect (stale heartbeat or unverifiable), by phase.", ["phase"]
        )
        for phase in sorted(str(p) for p in SEAT_PHASES):
            leases.add_metric([phase], r.leases_by_phase.get(phase, 0))
            suspects.add_metric([phase], r.suspects_by_phase.get(phase, 0))
        yield from (requests, recovery, leases, suspects)

    def _limits(self, r: Reading) -> Iterator[Metric]:
        policy = r.policy
        seats = _gauge("seats_in_use", "Seats held, against max_active_turns.")
        seats.add_metric([], r.seats_in_use)
        starts = _gauge("starts_in_window", "Leases in the start window, against max_concurrent_starts.")
        starts.add_metric([], r.starts_in_window)
        yield from (seats, starts)
        lane_seats = _gauge("lane_seats_in_use", "Seats held, by lane.", ["lane"])
        provider_seats: dict[str, int] = defaultdict(int)
        provider_starts: dict[str, int] = defaultdict(int)
        model_seats: dict[tuple[str, str], int] = defaultdict(int)
        lanes: dict[str, int] = defaultdict(int)
        for group in r.seats:
            lanes[group.lane] += group.seats
            provider_seats[group.provider] += group.seats
            provider_starts[group.provider] += group.starts
            model_seats[(group.provider, group.model)] += group.seats
        for lane, count in sorted(lanes.items()):
            lane_seats.add_metric([lane], count)
        provider_in_use = _gauge("provider_seats_in_use", "Seats held, by provider.", ["provider"])
        provider_window = _gauge("provider_starts_in_window", "Leases in the start window, by provider.", ["provider"])
        model_in_use = _gauge("model_seats_in_use", "Seats held, by provider/model key.", ["provider", "model"])
        provider_limit = _gauge("provider_seats_limit", "A provider's max_active_turns key limit.", ["provider"])
        provider_starts_limit = _gauge(
            "provider_starts_limit", "A provider's max_concurrent_starts key limit.", ["provider"]
        )
        model_limit = _gauge(
            "model_seats_limit", "A provider/model key's max_active_turns limit.", ["provider", "model"]
        )
        for limit in () if policy is None else policy.key_limits:
            if limit.model is None:
                provider_seats.setdefault(limit.provider, 0)
                provider_starts.setdefault(limit.provider, 0)
                if limit.max_active_turns is not None:
                    provider_limit.add_metric([limit.provider], limit.max_active_turns)
                if limit.max_concurrent_starts is not None:
                    provider_starts_limit.add_metric([limit.provider], limit.max_concurrent_starts)
            else:
                model_seats.setdefault((limit.provider, limit.model), 0)
                if limit.max_active_turns is not None:
                    model_limit.add_metric([limit.provider, limit.model], limit.max_active_turns)
        for provider, count in sorted(provider_seats.items()):
            provider_in_use.add_metric([provider], count)
            provider_window.add_metric([provider], provider_starts[provider])
        for (provider, model), count in sorted(model_seats.items()):
            model_in_use.add_metric([provider, model], count)
        yield from (lane_seats, provider_in_use, provider_window, model_in_use)
        yield from (provider_limit, provider_starts_limit, model_limit)
        if policy is None:
            return
        for name, documentation, value in (
            ("seats_limit", "The policy's max_active_turns.", policy.max_active_turns),
            ("starts_limit", "The policy's max_concurrent_starts.", policy.max_concurrent_starts),
            ("min_start_interval_seconds", "The policy's min_start_interval.", _seconds(policy.min_start_interval_ms)),
            ("queue_timeout_seconds", "The policy's queue_timeout.", _seconds(policy.queue_timeout_ms)),
            ("capacity_cooldown_seconds", "The policy's capacity_cooldown.", _seconds(policy.capacity_cooldown_ms)),
        ):
            gauge = _gauge(name, documentation)
            gauge.add_metric([], value)
            yield gauge
        if policy.max_turns_per_session is not None:
            session = _gauge("session_seats_limit", "The policy's max_turns_per_session (seats per session).")
            session.add_metric([], policy.max_turns_per_session)
            yield session
        weights = _gauge("lane_weight", "Each lane's weight in the policy (listed highest priority first).", ["lane"])
        for configured in policy.lanes:
            weights.add_metric([configured.name], configured.weight)
        yield weights
        revision = _gauge("policy_revision", "The live policy revision in force (0: never revised).")
        revision.add_metric([], r.policy_revision or 0)
        yield revision

    def _cooldowns_and_pauses(self, r: Reading) -> Iterator[Metric]:
        cooldowns = _gauge(
            "cooldown_remaining_seconds",
            "Time left on a provider/model's capacity cooldown (only keys cooling down).",
            ["provider", "model"],
        )
        for provider, model, not_before in r.cooldowns:
            cooldowns.add_metric([provider, model], _seconds(not_before - r.now))
        paused = _gauge(
            "paused",
            "1 for every paused scope: all, a lane, or a provider/model key (empty labels: not part of the scope).",
            ["scope", "lane", "provider", "model"],
        )
        for pause in r.pauses:
            paused.add_metric([pause.scope, pause.lane or "", pause.provider or "", pause.model or ""], 1)
        yield from (cooldowns, paused)

    def _budgets(self, r: Reading) -> Iterator[Metric]:
        labels = ["provider", "model", "window_ms"]
        requests = _gauge(
            "budget_requests", "Requests counted in a budget window (admitted, external, corrections).", labels
        )
        requests_limit = _gauge("budget_requests_limit", "A budget window's max_requests.", labels)
        requests_left = _gauge("budget_requests_left", "Requests a budget window has left (max_requests set).", labels)
        tokens = _gauge(
            "budget_tokens",
            "Tokens counted in a budget window: reserved (estimates of unsettled or retained turns) and used.",
            [*labels, "kind"],
        )
        tokens_limit = _gauge("budget_tokens_limit", "A budget window's max_tokens.", labels)
        tokens_left = _gauge("budget_tokens_left", "Tokens a budget window has left (max_tokens set).", labels)
        reset = _gauge(
            "budget_next_reset_seconds",
            "Time until the oldest charge leaves a budget window (0 when nothing counts).",
            labels,
        )
        for window in r.budgets:
            key = [window.provider, window.model or "", str(window.window_ms)]
            requests.add_metric(key, window.requests)
            tokens.add_metric([*key, "reserved"], window.reserved_tokens)
            tokens.add_metric([*key, "used"], window.used_tokens)
            if window.max_requests is not None:
                requests_limit.add_metric(key, window.max_requests)
            if window.remaining_requests is not None:
                requests_left.add_metric(key, window.remaining_requests)
            if window.max_tokens is not None:
                tokens_limit.add_metric(key, window.max_tokens)
            if window.remaining_tokens is not None:
                tokens_left.add_metric(key, window.remaining_tokens)
            reset.add_metric(key, 0.0 if window.next_reset_at is None else _seconds(window.next_reset_at - r.now))
        yield from (requests, requests_limit, requests_left, tokens, tokens_limit, tokens_left, reset)

    def _journal(self, r: Reading) -> Iterator[Metric]:
        figures = r.journal
        wait = figures.admission_wait
        buckets = [(_bound(b), c) for b, c in zip(wait.bounds, wait.cumulative, strict=False)]
        buckets.append(("+Inf", wait.cumulative[-1]))
        histogram = HistogramMetricFamily(
            P + "admission_wait_seconds",
            "Time from enqueue to admission, from the journal.",
            buckets=buckets,
            sum_value=wait.sum_seconds,
        )
        outcomes = CounterMetricFamily(
            P + "reaper_outcomes", "Journal events only the reaper writes, by outcome.", labels=["outcome"]
        )
        for name in sorted(REAPER_OUTCOMES.values()):
            outcomes.add_metric([name], figures.reaper_outcomes.get(name, 0))
        events = CounterMetricFamily(P + "events", "Journal events, by kind.", labels=["kind"])
        for kind in sorted({str(k) for k in EventKind} | set(figures.events_by_kind)):
            events.add_metric([kind], figures.events_by_kind.get(kind, 0))
        last = _gauge("journal_last_sequence", "The newest journal event's sequence number.")
        last.add_metric([], figures.last_seq)
        yield from (histogram, outcomes, events, last)


def _bound(seconds: float) -> str:
    return repr(float(seconds))


def exposition(reading: Reading, scrape_seconds: float) -> bytes:
    """The text exposition of ``reading``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReadingCollector(reading, scrape_seconds))
    return generate_latest(registry)
