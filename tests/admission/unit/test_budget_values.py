"""The budget values: ``Budget`` and ``Policy.budgets`` validation, their JSON form (hostile JSON refused), the
order ``budgets_for`` gives, ``Usage``, a live turn's ``usage`` and the enqueue's ``estimated_tokens`` check."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission_plane import (
    Budget,
    BudgetError,
    BudgetWindow,
    InvalidInputError,
    KeyLimit,
    Lane,
    LiveTurnCompletion,
    LiveTurnFailure,
    Policy,
    Usage,
)
from admission_plane.policy import MAX_BUDGET_WINDOW_MS, MAX_BUDGETS
from admission_plane.values import MAX_TOKENS, estimated_tokens

MAX_SAFE = 2**53 - 1
WEEK_MS = 7 * 24 * 3_600_000
#: Identifiers every identifier rule refuses: empty, padded, multi-line, with NUL or a lone surrogate, too long.
BAD_IDENTIFIERS = ["", " ", " openai", "openai ", "open\nai", "a\0b", "\x7f", "\ud800", "y" * 257]
#: What no limit accepts: zero, negative, unsafe, fractional, boolean, text.
BAD_LIMITS = [0, -1, MAX_SAFE + 1, 2**64, 1.0, 1.5, float("nan"), float("inf"), True, False, "5", b"5", [5]]


# --- Budget ---------------------------------------------------------------------------------------------------


def test_a_budget_takes_a_provider_an_optional_model_a_window_and_limits() -> None:
    """A provider budget, a model budget, the shortest and the longest window and the largest limits are accepted;
    the window defaults to one minute."""
    assert Budget("openai", max_requests=60).window_ms == 60_000
    budget = Budget("anthropic", "claude-sonnet-4", window_ms=WEEK_MS, max_requests=MAX_SAFE, max_tokens=MAX_SAFE)
    assert (budget.provider, budget.model, budget.window_ms) == ("anthropic", "claude-sonnet-4", WEEK_MS)
    assert Budget("p", window_ms=1, max_tokens=1).max_requests is None
    assert MAX_BUDGET_WINDOW_MS == WEEK_MS


@pytest.mark.parametrize("provider", [*BAD_IDENTIFIERS, None, 5, b"openai", ["openai"]], ids=repr)
def test_a_budget_provider_must_be_an_identifier(provider: object) -> None:
    """A provider that is not a single-line identifier of 1..256 characters raises InvalidInputError."""
    with pytest.raises(InvalidInputError, match="budget provider"):
        Budget(provider, max_requests=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("model", [*BAD_IDENTIFIERS, 5, b"gpt", ("gpt",)], ids=repr)
def test_a_budget_model_must_be_an_identifier_or_none(model: object) -> None:
    """A model that is neither None nor an identifier raises InvalidInputError."""
    with pytest.raises(InvalidInputError, match="budget model"):
        Budget("openai", model, max_requests=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "window_ms", [0, -1, WEEK_MS + 1, MAX_SAFE, 2**64, 60_000.0, 1.5, True, "60000", None], ids=repr
)
def test_a_budget_window_is_from_one_ms_to_a_week(window_ms: object) -> None:
    """A window outside 1 ms..7 days, or not an integer, raises InvalidInputError."""
    with pytest.raises(InvalidInputError, match="window_ms"):
        Budget("openai", window_ms=window_ms, max_requests=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["max_requests", "max_tokens"])
@pytest.mark.parametrize("value", BAD_LIMITS, ids=repr)
def test_a_budget_limit_is_a_positive_safe_integer_or_none(field: str, value: object) -> None:
    """max_requests and max_tokens refuse zero, negatives, unsafe integers, floats, booleans and text."""
    other = "max_tokens" if field == "max_requests" else "max_requests"
    with pytest.raises(InvalidInputError, match=field):
        Budget("openai", **{field: value, other: 1})


def test_a_budget_sets_at_least_one_limit() -> None:
    """A budget without max_requests and max_tokens raises InvalidInputError."""
    with pytest.raises(InvalidInputError, match="max_requests or max_tokens"):
        Budget("openai")
    with pytest.raises(InvalidInputError, match="max_requests or max_tokens"):
        Budget("openai", "gpt", window_ms=1_000, max_requests=None, max_tokens=None)


def test_a_budget_covers_its_provider_or_its_provider_and_model() -> None:
    """A provider budget covers every model of its provider; a model budget only its own model; neither another
    provider."""
    provider_wide = Budget("openai", max_requests=1)
    model_only = Budget("openai", "gpt-4o", max_requests=1)
    assert provider_wide.covers("openai", "gpt-4o")
    assert provider_wide.covers("openai", "o3")
    assert model_only.covers("openai", "gpt-4o")
    assert not model_only.covers("openai", "o3")
    assert not provider_wide.covers("anthropic", "gpt-4o")
    assert not model_only.covers("anthropic", "gpt-4o")


# --- Policy.budgets -------------------------------------------------------------------------------------------


def test_a_policy_keeps_its_budgets_as_a_tuple() -> None:
    """Policy(budgets=...) takes any iterable of Budget and keeps it as a tuple in the given order; none by default."""
    budgets = [Budget("p", max_requests=1), Budget("p", "m", max_tokens=5), Budget("p", window_ms=1_000, max_tokens=9)]
    assert Policy().budgets == ()
    assert Policy(budgets=budgets).budgets == tuple(budgets)
    assert Policy(budgets=iter(budgets)).budgets == tuple(budgets)


def test_budgets_naming_a_provider_model_window_twice_are_refused() -> None:
    """Two budgets of the same provider, model and window are refused even with different limits; another window,
    another model or the provider-wide budget of the same window are not duplicates."""
    with pytest.raises(InvalidInputError, match="each provider/model window once"):
        Policy(budgets=(Budget("p", max_requests=1), Budget("p", max_tokens=5)))
    with pytest.raises(InvalidInputError, match="each provider/model window once"):
        Policy(budgets=(Budget("p", "m", window_ms=5, max_requests=1), Budget("p", "m", window_ms=5, max_requests=1)))
    distinct = (
        Budget("p", max_requests=1),
        Budget("p", window_ms=3_600_000, max_requests=1),
        Budget("p", "m", max_requests=1),
        Budget("q", max_requests=1),
    )
    assert Policy(budgets=distinct).budgets == distinct


def test_at_most_256_budgets() -> None:
    """256 budgets are accepted; 257 raise InvalidInputError."""
    budgets = [Budget("p", window_ms=window, max_requests=1) for window in range(1, MAX_BUDGETS + 2)]
    assert len(Policy(budgets=budgets[:MAX_BUDGETS]).budgets) == MAX_BUDGETS == 256
    with pytest.raises(InvalidInputError, match="at most 256"):
        Policy(budgets=budgets)


@pytest.mark.parametrize(
    "budgets",
    [
        None,
        5,
        "budgets",
        b"budgets",
        Budget("p", max_requests=1),
        [KeyLimit("p", max_active_turns=1)],
        [Lane("p")],
        [{"provider": "p", "max_requests": 1}],
        [("p", None, 60_000, 1, None)],
        [Budget("p", max_requests=1), None],
    ],
    ids=repr,
)
def test_budgets_that_are_not_a_sequence_of_budget_are_refused(budgets: object) -> None:
    """Policy(budgets=...) refuses anything but an iterable of Budget values with InvalidInputError."""
    with pytest.raises(InvalidInputError, match="budgets"):
        Policy(budgets=budgets)  # type: ignore[arg-type]


def test_a_policy_with_budgets_is_not_seed_shaped() -> None:
    """Budgets are beyond the original's policy: a policy with one is not seed-shaped, the same without is."""
    assert Policy().seed_shaped
    assert not Policy(budgets=(Budget("p", max_requests=1),)).seed_shaped


def test_budgets_for_gives_model_budgets_first_then_by_window() -> None:
    """budgets_for(provider, model) lists the key's model-level budgets, then its provider-wide ones, each by window
    from shortest to longest; other providers' and other models' budgets are left out."""
    provider_minute = Budget("p", window_ms=60_000, max_requests=1)
    model_hour = Budget("p", "m", window_ms=3_600_000, max_tokens=1)
    provider_second = Budget("p", window_ms=1_000, max_requests=1)
    model_minute = Budget("p", "m", window_ms=60_000, max_tokens=1)
    other_model = Budget("p", "other", window_ms=1, max_tokens=1)
    other_provider = Budget("q", window_ms=1, max_requests=1)
    policy = Policy(budgets=(provider_minute, model_hour, provider_second, model_minute, other_model, other_provider))
    assert policy.budgets_for("p", "m") == (model_minute, model_hour, provider_second, provider_minute)
    assert policy.budgets_for("p", "other") == (other_model, provider_second, provider_minute)
    assert policy.budgets_for("q", "m") == (other_provider,)
    assert policy.budgets_for("r", "m") == ()


# --- JSON ----------------------------------------------------------------------------------------------------

BUDGETED = Policy(
    budgets=(
        Budget("openai", window_ms=60_000, max_requests=60, max_tokens=150_000),
        Budget("openai", "gpt-4o", window_ms=86_400_000, max_tokens=10_000_000),
        Budget("anthropic", window_ms=WEEK_MS, max_requests=5_000),
    )
)


def test_budgets_round_trip_through_json() -> None:
    """to_json lists each budget with its set fields only; from_json of that mapping, and of its JSON text, gives the
    same policy back."""
    shown = BUDGETED.to_json()
    assert shown["budgets"] == [
        {"provider": "openai", "window_ms": 60_000, "max_requests": 60, "max_tokens": 150_000},
        {"provider": "openai", "model": "gpt-4o", "window_ms": 86_400_000, "max_tokens": 10_000_000},
        {"provider": "anthropic", "window_ms": WEEK_MS, "max_requests": 5_000},
    ]
    assert Policy.from_json(shown) == BUDGETED
    assert Policy.from_json(json.dumps(shown)) == BUDGETED
    assert Policy.from_json(Policy().to_json()).budgets == ()


def test_a_budget_entry_without_window_takes_the_default() -> None:
    """A JSON budget entry without window_ms is a one-minute budget, as Budget's own default."""
    assert Policy.from_json({"budgets": [{"provider": "p", "max_tokens": 5}]}).budgets == (Budget("p", max_tokens=5),)


HOSTILE_BUDGETS_JSON: list[Any] = [
    {"budgets": {"provider": "p", "max_requests": 1}},
    {"budgets": "p"},
    {"budgets": 5},
    {"budgets": None},
    {"budgets": True},
    {"budgets": [5]},
    {"budgets": ["p"]},
    {"budgets": [None]},
    {"budgets": [[]]},
    {"budgets": [["p", None, 60_000, 1]]},
    {"budgets": [{"provider": "p", "max_requests": 1, "extra": 1}]},
    {"budgets": [{"provider": "p", "max_requests": 1, "name": "p"}]},
    {"budgets": [{"provider": "p", "max_requests": 1, "weight": 1}]},
    {"budgets": [{"provider": "p", "max_requests": 1, 5: 1}]},
    {"budgets": [{"provider": 5, "max_requests": 1}]},
    {"budgets": [{"provider": "", "max_requests": 1}]},
    {"budgets": [{"provider": "p", "model": "", "max_requests": 1}]},
    {"budgets": [{"provider": "p", "model": ["m"], "max_requests": 1}]},
    {"budgets": [{"provider": "p", "max_requests": "1"}]},
    {"budgets": [{"provider": "p", "max_requests": 1.0}]},
    {"budgets": [{"provider": "p", "max_requests": True}]},
    {"budgets": [{"provider": "p", "max_requests": 0}]},
    {"budgets": [{"provider": "p", "max_tokens": -5}]},
    {"budgets": [{"provider": "p", "max_tokens": 2**63}]},
    {"budgets": [{"provider": "p", "window_ms": None, "max_tokens": 1}]},
    {"budgets": [{"provider": "p", "window_ms": "60000", "max_tokens": 1}]},
    {"budgets": [{"provider": "p", "window_ms": WEEK_MS + 1, "max_tokens": 1}]},
    {"budgets": [{"provider": "p"}]},
    {"budgets": [{"provider": "p", "max_requests": None, "max_tokens": None}]},
    {"budgets": [{"provider": {"a": [1, {"b": None}]}, "max_requests": 1}]},
    {"budgets": [{"provider": "p", "max_requests": [[[1]]]}]},
    {"budgets": [{"provider": "p", "max_requests": 1}, {"provider": "p", "max_tokens": 1}]},
    {"budgets": [{"provider": "p", "window_ms": window, "max_requests": 1} for window in range(1, 258)]},
    {"budget": []},
    '{"budgets": [{"provider": "p", "max_requests": 1}',
    '{"budgets": [{"provider": "p", "max_requests": ' + "9" * 5_000 + "}]}",
    '{"budgets": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"budgets": [{"provider": "p", "max_requests": NaN}]}',
    '{"budgets": [{"provider": "p", "max_requests": Infinity}]}',
    '{"budgets": [{"provider": "p", "max_requests": 1e3}]}',
]


@pytest.mark.parametrize("data", HOSTILE_BUDGETS_JSON, ids=lambda data: repr(data)[:60])
def test_hostile_budget_json_is_refused(data: Any) -> None:
    """Budgets that are not an array of objects, entries with unknown fields, wrong types, nested junk, out-of-range
    values, duplicates, too many entries, and JSON text that is broken, huge or deeply nested raise
    InvalidInputError."""
    with pytest.raises(InvalidInputError):
        Policy.from_json(data)


@pytest.mark.parametrize(
    "entry",
    [{}, {"max_requests": 1}, {"model": "m", "window_ms": 60_000, "max_tokens": 1}],
    ids=["empty", "no-provider", "model-without-provider"],
)
def test_a_budget_entry_without_a_provider_is_refused(entry: dict[str, Any]) -> None:
    """A JSON budget entry that names no provider raises InvalidInputError (not a TypeError from the constructor)."""
    with pytest.raises(InvalidInputError):
        Policy.from_json({"budgets": [entry]})


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)
BUDGET_FIELDS = st.sampled_from(["provider", "model", "window_ms", "max_requests", "max_tokens"])
FIELD_VALUES = st.one_of(
    JSON_VALUES,
    st.sampled_from(["p", "m", "openai"]),
    st.integers(-2, WEEK_MS + 2),
    st.sampled_from([1, 60_000, WEEK_MS, MAX_SAFE, MAX_SAFE + 1]),
)
BUDGET_ENTRIES = st.one_of(st.dictionaries(BUDGET_FIELDS, FIELD_VALUES, max_size=5), JSON_VALUES)


@given(st.one_of(st.lists(BUDGET_ENTRIES, max_size=4), JSON_VALUES))
def test_any_json_budgets_give_a_policy_or_a_refusal(budgets: Any) -> None:
    """Whatever JSON stands under "budgets", from_json gives a policy whose budgets are Budget values, or raises
    InvalidInputError; never another exception."""
    try:
        policy = Policy.from_json(json.dumps({"budgets": budgets}))
    except InvalidInputError:
        return
    assert all(isinstance(budget, Budget) for budget in policy.budgets)
    assert Policy.from_json(policy.to_json()) == policy


# --- Usage, a live turn's usage, estimates ---------------------------------------------------------------------


def test_usage_counts_input_plus_output_tokens() -> None:
    """Usage defaults to zero tokens; tokens is input plus output, up to twice MAX_TOKENS."""
    assert Usage() == Usage(0, 0)
    assert Usage().tokens == 0
    assert Usage(input_tokens=1_200, output_tokens=345).tokens == 1_545
    assert Usage(MAX_TOKENS, MAX_TOKENS).tokens == 2 * MAX_TOKENS == 2**41


@pytest.mark.parametrize("field", ["input_tokens", "output_tokens"])
@pytest.mark.parametrize(
    "value", [-1, MAX_TOKENS + 1, MAX_SAFE, 2**64, 1.0, 0.5, float("nan"), True, None, "5", b"5"], ids=repr
)
def test_usage_refuses_what_is_not_a_token_count(field: str, value: object) -> None:
    """A token count that is negative, beyond MAX_TOKENS, fractional, boolean, None or text raises InvalidInputError."""
    with pytest.raises(InvalidInputError, match=field):
        Usage(**{field: value})


def test_a_live_turn_completion_carries_a_usage_or_none() -> None:
    """LiveTurnCompletion takes a Usage (third, or by keyword) or None (the default)."""
    usage = Usage(10, 20)
    assert LiveTurnCompletion("completed").usage is None
    assert LiveTurnCompletion("completed", usage=usage).usage == usage
    assert LiveTurnCompletion("failed", LiveTurnFailure("provider_capacity"), usage).usage == usage


@pytest.mark.parametrize(
    "usage",
    [{"input_tokens": 1, "output_tokens": 2}, (1, 2), 30, 1.5, "30", b"30", True, Usage],
    ids=repr,
)
def test_a_live_turn_completion_refuses_a_usage_that_is_not_a_usage(usage: object) -> None:
    """A usage that is not a Usage value (a mapping, a tuple, a number, text, the class) raises InvalidInputError."""
    with pytest.raises(InvalidInputError, match="usage"):
        LiveTurnCompletion("completed", usage=usage)  # type: ignore[arg-type]


def test_an_estimate_is_a_token_count_or_none() -> None:
    """estimated_tokens accepts None (no estimate), 0 and MAX_TOKENS and gives them back."""
    assert estimated_tokens(None) is None
    assert estimated_tokens(0) == 0
    assert estimated_tokens(4_096) == 4_096
    assert estimated_tokens(MAX_TOKENS) == MAX_TOKENS == 2**40


@pytest.mark.parametrize(
    "value", [-1, MAX_TOKENS + 1, MAX_SAFE, 2**64, 4_096.0, 0.5, float("inf"), True, False, "4096", [1]], ids=repr
)
def test_an_estimate_refuses_what_is_not_a_token_count(value: object) -> None:
    """A negative, too large, fractional, boolean or non-number estimate raises InvalidInputError."""
    with pytest.raises(InvalidInputError, match="estimated_tokens"):
        estimated_tokens(value)


def test_a_budget_error_is_an_invalid_input_naming_the_window() -> None:
    """BudgetError is an InvalidInputError that carries the window and its token limit."""
    error = BudgetError(60_000, 1_000)
    assert isinstance(error, InvalidInputError)
    assert (error.window_ms, error.max_tokens) == (60_000, 1_000)
    assert "1000-token budget of a 60000 ms window" in str(error)


def test_a_budget_window_is_shown_as_json_with_every_field() -> None:
    """BudgetWindow.to_json gives every field by name (None kept), ready for status --json."""
    window = BudgetWindow("p", None, 60_000, 10, None, 3, 100, 50, 7, None, 61_000)
    shown = window.to_json()
    assert shown == {field.name: getattr(window, field.name) for field in attrs.fields(BudgetWindow)}
    assert shown["remaining_tokens"] is None
    assert shown["next_reset_at"] == 61_000
    assert json.loads(json.dumps(shown)) == shown
