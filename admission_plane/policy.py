r"""The admission policy value object.

Defaults are the 2.2.0 connector's: 8 seats, 8 concurrent starts, 2 s between starts,
a 30 min queue timeout and a 30 s capacity cooldown. Seats and starts accept any
integer >= 1; the other fields any non-negative integer in memory. The durable
``policy_state`` row is stricter (see :data:`DURABLE_BOUNDS`).

Beyond the original (policy v2): priority :class:`Lane`\ s with weights, :class:`KeyLimit`\ s
per provider and per provider/model, a per-session limit, and request/token
:class:`Budget`\ s over sliding windows. With their defaults (one
``default`` lane, no keyed limit, no session limit) a policy is *seed-shaped* and behaves
exactly as the original's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import attrs

from ._validate import is_identifier, is_safe_integer
from .errors import InvalidInputError

DEFAULT_MAX_ACTIVE_TURNS = 8
DEFAULT_MAX_CONCURRENT_STARTS = 8
DEFAULT_MIN_START_INTERVAL_MS = 2_000
DEFAULT_QUEUE_TIMEOUT_MS = 1_800_000
DEFAULT_CAPACITY_COOLDOWN_MS = 30_000
#: The longest cooldown a provider's own signal may set (ms): six hours.
DEFAULT_MAX_COOLDOWN_MS = 6 * 3_600_000


def _non_negative(instance: Any, attribute: attrs.Attribute[int], value: Any) -> None:
    if not is_safe_integer(value) or value < 0:
        raise InvalidInputError(f"invalid admission policy {attribute.name}")


def _at_least_one(instance: Any, attribute: attrs.Attribute[int], value: Any) -> None:
    if not is_safe_integer(value) or value < 1:
        raise InvalidInputError(f"invalid admission policy {attribute.name}")


# --- policy v2: lanes, keyed limits, the per-session limit ----------------------------------------

#: The lane a request joins when it names none (the only lane of a seed-shaped policy).
DEFAULT_LANE = "default"
#: The most lanes and keyed limits one policy may name (each admission looks at every lane).
MAX_LANES = 16
MAX_KEY_LIMITS = 256
#: What happens to a request beyond its session's limit: it waits in the queue, or enqueue refuses it.
SessionOverflow = Literal["wait", "refuse"]


def _name(label: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not is_identifier(value):
            raise InvalidInputError(f"{label} must be a non-empty single-line identifier")

    return check


def _optional_limit(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (not is_safe_integer(value) or value < 1):
        raise InvalidInputError(f"invalid admission policy {attribute.name}: a positive integer or None")


@attrs.frozen
class Lane:
    """A priority lane. Lanes are listed in priority order in :attr:`Policy.lanes`.

    ``weight`` is the lane's share when several lanes have eligible work: in every round
    of admissions each lane may take up to ``weight`` seats before a lane after it must
    be served (see :mod:`admission_plane.service._selection`).
    """

    name: str = attrs.field(validator=_name("lane name"))
    weight: int = attrs.field(default=1, validator=_at_least_one)


@attrs.frozen
class KeyLimit:
    """Limits for one provider (``model=None``) or one provider/model pair.

    ``max_active_turns`` bounds the seats its requests hold; ``max_concurrent_starts``
    (provider limits only) bounds its leases in the start window. ``None``: no limit.
    """

    provider: str = attrs.field(validator=_name("key limit provider"))
    model: str | None = attrs.field(default=None)
    max_active_turns: int | None = attrs.field(default=None, validator=_optional_limit)
    max_concurrent_starts: int | None = attrs.field(default=None, validator=_optional_limit)

    @model.validator
    def _check_model(self, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not is_identifier(value):
            raise InvalidInputError("key limit model must be a non-empty single-line identifier or None")

    def __attrs_post_init__(self) -> None:
        if self.model is not None and self.max_concurrent_starts is not None:
            raise InvalidInputError("max_concurrent_starts is a per-provider limit (give no model)")
        if self.max_active_turns is None and self.max_concurrent_starts is None:
            raise InvalidInputError("a key limit must set max_active_turns or max_concurrent_starts")


#: The most budget windows one policy may name.
MAX_BUDGETS = 256
#: The longest budget window (ms): a week, beyond the longest window of a coding plan.
MAX_BUDGET_WINDOW_MS = 7 * 24 * 3_600_000


def _window(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not is_safe_integer(value) or not 1 <= value <= MAX_BUDGET_WINDOW_MS:
        raise InvalidInputError(f"budget window_ms must be an integer from 1 to {MAX_BUDGET_WINDOW_MS}")


@attrs.frozen
class Budget:
    """A provider's (``model=None``) or a provider/model's budget over a sliding window.

    In any ``window_ms`` milliseconds ending at an admission, the requests admitted under the
    key (``max_requests``) and their tokens (``max_tokens``) stay within the budget; usage
    recorded outside the plane and corrections from the provider count too. A request's
    tokens are its estimate (``estimated_tokens`` at enqueue) until its turn reports what it
    used. ``None``: no budget of that kind. See :mod:`admission_plane.service._budgets`
    for the exact rules.
    """

    provider: str = attrs.field(validator=_name("budget provider"))
    model: str | None = attrs.field(default=None)
    window_ms: int = attrs.field(default=60_000, validator=_window)
    max_requests: int | None = attrs.field(default=None, validator=_optional_limit)
    max_tokens: int | None = attrs.field(default=None, validator=_optional_limit)

    @model.validator
    def _check_model(self, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not is_identifier(value):
            raise InvalidInputError("budget model must be a non-empty single-line identifier or None")

    def __attrs_post_init__(self) -> None:
        if self.max_requests is None and self.max_tokens is None:
            raise InvalidInputError("a budget must set max_requests or max_tokens")

    def covers(self, provider: str, model: str) -> bool:
        """Whether a request for ``provider``/``model`` counts against this budget."""
        return self.provider == provider and (self.model is None or self.model == model)


def _budgets(value: Any) -> tuple[Budget, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidInputError("admission policy budgets must be a sequence of Budget")
    budgets = tuple(value)
    if len(budgets) > MAX_BUDGETS or not all(isinstance(budget, Budget) for budget in budgets):
        raise InvalidInputError(f"admission policy budgets must be at most {MAX_BUDGETS} Budget values")
    if len({(budget.provider, budget.model, budget.window_ms) for budget in budgets}) != len(budgets):
        raise InvalidInputError("admission policy budgets must name each provider/model window once")
    return budgets


def _lanes(value: Any) -> tuple[Lane, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidInputError("admission policy lanes must be a sequence of Lane")
    lanes = tuple(value)
    if not lanes or len(lanes) > MAX_LANES or not all(isinstance(lane, Lane) for lane in lanes):
        raise InvalidInputError(f"admission policy lanes must be 1 to {MAX_LANES} Lane values")
    if len({lane.name for lane in lanes}) != len(lanes):
        raise InvalidInputError("admission policy lane names must be distinct")
    return lanes


def _key_limits(value: Any) -> tuple[KeyLimit, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidInputError("admission policy key_limits must be a sequence of KeyLimit")
    limits = tuple(value)
    if len(limits) > MAX_KEY_LIMITS or not all(isinstance(limit, KeyLimit) for limit in limits):
        raise InvalidInputError(f"admission policy key_limits must be at most {MAX_KEY_LIMITS} KeyLimit values")
    if len({(limit.provider, limit.model) for limit in limits}) != len(limits):
        raise InvalidInputError("admission policy key_limits must name each provider or provider/model once")
    return limits


def _session_overflow(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value not in ("wait", "refuse"):
        raise InvalidInputError("admission policy session_overflow must be 'wait' or 'refuse'")


@attrs.frozen
class Policy:
    """How many turns may be in flight, how fast they may start, and how long they may wait.

    Raises :class:`~admission_plane.errors.InvalidInputError` on construction when a
    field is not a (non-negative, or for the two limits positive) integer.
    """

    max_active_turns: int = attrs.field(default=DEFAULT_MAX_ACTIVE_TURNS, validator=_at_least_one)
    max_concurrent_starts: int = attrs.field(default=DEFAULT_MAX_CONCURRENT_STARTS, validator=_at_least_one)
    min_start_interval_ms: int = attrs.field(default=DEFAULT_MIN_START_INTERVAL_MS, validator=_non_negative)
    queue_timeout_ms: int = attrs.field(default=DEFAULT_QUEUE_TIMEOUT_MS, validator=_non_negative)
    capacity_cooldown_ms: int = attrs.field(default=DEFAULT_CAPACITY_COOLDOWN_MS, validator=_non_negative)
    #: Priority lanes, highest first; a request names its lane at enqueue (default: the first lane).
    lanes: tuple[Lane, ...] = attrs.field(default=(Lane(DEFAULT_LANE),), converter=_lanes)
    #: Limits per provider and per provider/model, beside the global ones.
    key_limits: tuple[KeyLimit, ...] = attrs.field(default=(), converter=_key_limits)
    #: At most this many turns in flight (holding a seat) per session; ``None``: no limit.
    max_turns_per_session: int | None = attrs.field(default=None, validator=_optional_limit)
    #: A request beyond its session's limit ``"wait"``\ s in the queue, or enqueue ``"refuse"``\ s it
    #: (:class:`~admission_plane.errors.SessionLimitError`).
    session_overflow: SessionOverflow = attrs.field(default="wait", validator=_session_overflow)
    #: The longest cooldown a provider's ``retry_after`` signal may set (the fixed
    #: ``capacity_cooldown_ms`` applies when a capacity failure carries no signal).
    max_cooldown_ms: int = attrs.field(default=DEFAULT_MAX_COOLDOWN_MS, validator=_non_negative)
    #: Request and token budgets per provider and per provider/model over sliding windows.
    budgets: tuple[Budget, ...] = attrs.field(default=(), converter=_budgets)

    def as_tuple(self) -> tuple[int, int, int, int, int]:  # the order of SEED_FIELDS
        """The seed's normalized policy tuple (the order the fingerprint hashes)."""
        return (
            self.max_active_turns,
            self.max_concurrent_starts,
            self.min_start_interval_ms,
            self.queue_timeout_ms,
            self.capacity_cooldown_ms,
        )

    @property
    def default_lane(self) -> str:
        """The lane of a request that names none: the first lane."""
        return self.lanes[0].name

    @property
    def seed_shaped(self) -> bool:
        """Whether only the original's five fields are set (one ``default`` lane, no other limit,
        the default cooldown cap)."""
        return (
            self.lanes == (Lane(DEFAULT_LANE),)
            and not self.key_limits
            and self.max_turns_per_session is None
            and self.session_overflow == "wait"
            and self.max_cooldown_ms == DEFAULT_MAX_COOLDOWN_MS
            and not self.budgets
        )

    def budgets_for(self, provider: str, model: str) -> tuple[Budget, ...]:
        """The budgets a request for ``provider``/``model`` counts against (model-level ones first)."""
        return tuple(
            sorted(
                (budget for budget in self.budgets if budget.covers(provider, model)),
                key=lambda budget: (budget.model is None, budget.window_ms),
            )
        )

    def capacity_cooldown_for(self, signal_ms: int | None) -> int:
        """How long a capacity failure cools its key down: the provider's signal (``signal_ms``),
        capped by :attr:`max_cooldown_ms`, else the fixed :attr:`capacity_cooldown_ms`."""
        if signal_ms is None:
            return self.capacity_cooldown_ms
        return min(max(0, signal_ms), self.max_cooldown_ms)

    def to_json(self) -> dict[str, Any]:
        """The policy as a JSON-ready mapping (what ``admission-plane policy show --json`` prints)."""
        return {
            "max_active_turns": self.max_active_turns,
            "max_concurrent_starts": self.max_concurrent_starts,
            "min_start_interval_ms": self.min_start_interval_ms,
            "queue_timeout_ms": self.queue_timeout_ms,
            "capacity_cooldown_ms": self.capacity_cooldown_ms,
            "lanes": [{"name": lane.name, "weight": lane.weight} for lane in self.lanes],
            "key_limits": [
                {key: value for key, value in attrs.asdict(limit).items() if value is not None}
                for limit in self.key_limits
            ],
            "max_turns_per_session": self.max_turns_per_session,
            "session_overflow": self.session_overflow,
            "max_cooldown_ms": self.max_cooldown_ms,
            "budgets": [
                {key: value for key, value in attrs.asdict(budget).items() if value is not None}
                for budget in self.budgets
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> Policy:
        """A policy from :meth:`to_json`'s shape (a mapping or its JSON text); absent fields take defaults.

        Unknown fields, wrong types and out-of-range values raise
        :class:`~admission_plane.errors.InvalidInputError`.
        """
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except (ValueError, RecursionError):
                raise InvalidInputError("admission policy JSON is not valid JSON") from None
        if not isinstance(data, Mapping):
            raise InvalidInputError("admission policy JSON must be an object")
        unknown = set(data) - set(_JSON_FIELDS)
        if unknown:
            raise InvalidInputError(f"admission policy JSON has unknown fields: {', '.join(sorted(map(str, unknown)))}")
        values = dict(data)
        if "lanes" in values:
            values["lanes"] = tuple(_from_json_items(values["lanes"], Lane, "lanes"))
        if "key_limits" in values:
            values["key_limits"] = tuple(_from_json_items(values["key_limits"], KeyLimit, "key_limits"))
        if "budgets" in values:
            values["budgets"] = tuple(_from_json_items(values["budgets"], Budget, "budgets"))
        return cls(**values)

    def check_durable(self) -> None:
        """Refuse a policy the durable ``policy_state`` row's CHECK constraints would reject.

        The seed lets the database raise a raw constraint error here; we refuse first,
        with a clear message, and write nothing.
        """
        for name, (low, high) in DURABLE_BOUNDS.items():
            value = getattr(self, name)
            if value < low or (high is not None and value > high):
                bound = f">= {low}" if high is None else f"in {low}..{high}"
                raise InvalidInputError(f"durable admission policy {name} must be {bound}")


#: Bounds enforced by the ``policy_state`` CHECK constraints: name -> (minimum, maximum or None).
DURABLE_BOUNDS: dict[str, tuple[int, int | None]] = {
    "max_active_turns": (1, None),
    "max_concurrent_starts": (1, None),
    "min_start_interval_ms": (2_000, None),
    "queue_timeout_ms": (1, 1_800_000),
    "capacity_cooldown_ms": (30_000, None),
}

_JSON_FIELDS = tuple(field.name for field in attrs.fields(Policy))


def _from_json_items(items: Any, kind: type[Any], label: str) -> Iterable[Any]:
    if not isinstance(items, list):
        raise InvalidInputError(f"admission policy {label} must be a JSON array")
    allowed = {field.name for field in attrs.fields(kind)}
    for item in items:
        if not isinstance(item, Mapping) or not set(item) <= allowed:
            raise InvalidInputError(f"admission policy {label} entries must be objects with fields {sorted(allowed)}")
        try:
            yield kind(**item)
        except TypeError:  # a required field missing (the names were checked above)
            raise InvalidInputError(f"admission policy {label} entries miss a required field") from None


#: The original's five policy fields, in the order of :meth:`Policy.as_tuple` (the durable row's columns).
SEED_FIELDS = _JSON_FIELDS[:5]
