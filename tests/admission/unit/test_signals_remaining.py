"""What a provider says is left of its window: ``remaining_from_headers`` on the providers' documented headers,
and malformed or hostile values and arguments, which are refused (never a negative, fractional or huge count)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission_plane import InvalidInputError, Remaining, remaining_from_headers
from admission_plane.signals import MAX_REMAINING

MAX_SAFE = 2**53 - 1
REQUEST_HEADERS = ("x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining")
TOKEN_HEADERS = (
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-output-tokens-remaining",
)

#: OpenAI's rate-limit headers as its documentation shows them (limits, remaining, reset durations).
OPENAI = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-reset-tokens": "6m0s",
}
#: Anthropic's rate-limit headers as its documentation names them (limit, remaining and RFC 3339 reset of each kind).
ANTHROPIC = {
    "anthropic-ratelimit-requests-limit": "50",
    "anthropic-ratelimit-requests-remaining": "49",
    "anthropic-ratelimit-requests-reset": "2024-06-01T12:00:30Z",
    "anthropic-ratelimit-tokens-limit": "90000",
    "anthropic-ratelimit-tokens-remaining": "89000",
    "anthropic-ratelimit-tokens-reset": "2024-06-01T12:00:40Z",
    "anthropic-ratelimit-input-tokens-limit": "80000",
    "anthropic-ratelimit-input-tokens-remaining": "79000",
    "anthropic-ratelimit-input-tokens-reset": "2024-06-01T12:00:40Z",
    "anthropic-ratelimit-output-tokens-limit": "16000",
    "anthropic-ratelimit-output-tokens-remaining": "15000",
    "anthropic-ratelimit-output-tokens-reset": "2024-06-01T12:00:35Z",
    "retry-after": "10",
}

DOCUMENTED = [
    pytest.param(OPENAI, Remaining(59, 149_984), id="openai"),
    pytest.param({key.title(): value for key, value in OPENAI.items()}, Remaining(59, 149_984), id="openai-title-case"),
    pytest.param({key.upper(): value for key, value in OPENAI.items()}, Remaining(59, 149_984), id="openai-upper-case"),
    pytest.param({"x-ratelimit-remaining-requests": "59"}, Remaining(59, None), id="openai-requests-only"),
    pytest.param({"X-RateLimit-Remaining-Tokens": "149984"}, Remaining(None, 149_984), id="openai-tokens-only"),
    pytest.param(ANTHROPIC, Remaining(49, 15_000), id="anthropic-smallest-token-figure"),
    pytest.param(
        {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-tokens-remaining": "0"},
        Remaining(0, 0),
        id="anthropic-exhausted",
    ),
    pytest.param(
        {"Anthropic-RateLimit-Input-Tokens-Remaining": "79000", "anthropic-ratelimit-tokens-remaining": "89000"},
        Remaining(None, 79_000),
        id="anthropic-input-below-total",
    ),
    pytest.param(
        {"anthropic-ratelimit-output-tokens-remaining": "15000"}, Remaining(None, 15_000), id="anthropic-output-only"
    ),
    pytest.param(
        {"x-ratelimit-remaining-requests": "3", "anthropic-ratelimit-requests-remaining": "7"},
        Remaining(3, None),
        id="both-spellings-smallest-requests",
    ),
    pytest.param({"x-ratelimit-remaining-tokens": " 42\t"}, Remaining(None, 42), id="surrounding-whitespace"),
    pytest.param({"x-ratelimit-remaining-tokens": "007"}, Remaining(None, 7), id="leading-zeros"),
    pytest.param(
        {"x-ratelimit-remaining-tokens": str(MAX_REMAINING)}, Remaining(None, MAX_REMAINING), id="largest-safe"
    ),
]


@pytest.mark.parametrize(("headers", "expected"), DOCUMENTED)
def test_documented_headers_give_what_remains(headers: dict[str, str], expected: Remaining) -> None:
    """Each documented spelling (any letter case) becomes the remaining requests and tokens; of several token
    figures, and of both providers' request figures, the smallest counts."""
    assert remaining_from_headers(headers) == expected


def test_name_value_pairs_are_read_like_a_mapping() -> None:
    """A list of (name, value) pairs, as raw HTTP clients return them, gives what the same mapping gives."""
    pairs = [("X-RateLimit-Remaining-Requests", "59"), ("x-ratelimit-remaining-tokens", "149984"), ("Via", "1.1 a")]
    assert remaining_from_headers(pairs) == Remaining(59, 149_984)
    assert remaining_from_headers(iter(pairs)) == Remaining(59, 149_984)
    assert remaining_from_headers(tuple(pairs)) == remaining_from_headers(dict(pairs))


class ReadOnlyHeaders(Mapping[str, str]):
    """A mapping that is not a dict (as an HTTP client's case-insensitive header object is)."""

    def __init__(self, items: dict[str, str]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def test_any_mapping_is_read() -> None:
    """A Mapping that is not a dict is read through its items."""
    assert remaining_from_headers(ReadOnlyHeaders(ANTHROPIC)) == Remaining(49, 15_000)


def test_a_repeated_name_gives_one_of_its_values() -> None:
    """A name repeated in pairs (any case) gives one of its values, not a sum or an error."""
    pairs = [("x-ratelimit-remaining-requests", "5"), ("X-RATELIMIT-REMAINING-REQUESTS", "9")]
    found = remaining_from_headers(pairs)
    assert found is not None
    assert found.requests in (5, 9)
    assert found.tokens is None


@pytest.mark.parametrize(
    "headers",
    [
        {},
        [],
        {"content-type": "application/json"},
        {"x-ratelimit-limit-requests": "60", "x-ratelimit-reset-requests": "1s"},
        {"anthropic-ratelimit-tokens-limit": "90000", "retry-after": "junk"},  # a malformed header it does not read
        {"x-ratelimit-remaining": "5", "remaining-tokens": "5"},  # near misses
    ],
    ids=["empty-mapping", "empty-pairs", "content-type", "limits-and-resets", "unread-junk", "near-misses"],
)
def test_headers_without_a_remaining_figure_give_none(headers: Any) -> None:
    """Headers that carry no remaining figure give None (and headers it does not read are not parsed)."""
    assert remaining_from_headers(headers) is None


HOSTILE_VALUES = [
    "-1",
    "-0",
    "+5",
    "1.5",
    "59.0",
    ".5",
    "1e3",
    "0x10",
    "1_000",
    "5 000",
    "nan",
    "inf",
    "",
    "   ",
    "\t",
    str(MAX_REMAINING + 1),
    str(2**63),
    "9" * 17,
    "9" * 65,
    "1" * 10_000,
    "１２０",  # fullwidth digits
    "٣",  # Arabic-Indic digit
    "²",  # a superscript: str.isdigit says yes
    "5\x00",
    "\x00",
    "5\n6",
    "fifty",
    "\ud800",
]


@pytest.mark.parametrize("name", [*REQUEST_HEADERS, *TOKEN_HEADERS])
@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=lambda value: repr(value)[:20])
def test_malformed_and_hostile_values_are_refused(name: str, value: str) -> None:
    """A negative, fractional, non-decimal, empty, too long, non-ASCII or beyond-2**53 count raises
    InvalidInputError."""
    with pytest.raises(InvalidInputError):
        remaining_from_headers({name: value})


def test_one_malformed_figure_refuses_the_whole_response() -> None:
    """A malformed token figure beside a good request figure is refused, not half read."""
    with pytest.raises(InvalidInputError):
        remaining_from_headers({"x-ratelimit-remaining-requests": "59", "x-ratelimit-remaining-tokens": "-1"})


@pytest.mark.parametrize(
    "headers",
    [
        {"x-ratelimit-remaining-requests": 59},
        {"x-ratelimit-remaining-tokens": 1.5},
        {"x-ratelimit-remaining-tokens": None},
        {"x-ratelimit-remaining-tokens": b"59"},
        {"x-ratelimit-remaining-tokens": ["59"]},
        {"anthropic-ratelimit-tokens-remaining": True},
        {5: "5"},
        {b"x-ratelimit-remaining-requests": b"59"},
        {None: "59"},
        {("x-ratelimit-remaining-requests",): "59"},
        [("x-ratelimit-remaining-requests",)],
        [("x-ratelimit-remaining-requests", "5", "6")],
        [["x-ratelimit-remaining-requests", "5"]],
        ["x-ratelimit-remaining-requests: 5"],
        [None],
        [5],
        "x-ratelimit-remaining-requests: 59",
        b"x-ratelimit-remaining-requests: 59",
        "",
    ],
    ids=repr,
)
def test_names_values_and_shapes_that_are_not_text_headers_are_refused(headers: Any) -> None:
    """A non-text name or value, a pair that is not a (name, value) tuple, or a string instead of a mapping raises
    InvalidInputError."""
    with pytest.raises(InvalidInputError):
        remaining_from_headers(headers)


@pytest.mark.parametrize("headers", [None, 5, 5.0, True, object()], ids=["None", "5", "5.0", "True", "object"])
def test_an_argument_that_is_neither_a_mapping_nor_pairs_is_refused(headers: Any) -> None:
    """Something that is neither a mapping nor an iterable of pairs (None, a number, a bare object) raises
    InvalidInputError, as a string does, rather than a TypeError from iterating it."""
    with pytest.raises(InvalidInputError):
        remaining_from_headers(headers)


# --- properties ------------------------------------------------------------------------------------------

READ_NAMES = [*REQUEST_HEADERS, *TOKEN_HEADERS]
NAME = st.one_of(
    st.sampled_from(READ_NAMES).flatmap(
        lambda name: st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
            lambda upper: "".join(char.upper() if flag else char for char, flag in zip(name, upper, strict=True))
        )
    ),
    st.text(max_size=30),
)
VALUE_TEXT = st.one_of(
    st.text(max_size=80),
    st.integers().map(str),
    st.integers(min_value=0, max_value=2**64).map(str),
    st.floats().map(str),
    st.sampled_from(HOSTILE_VALUES),
)
ANY_VALUE = st.one_of(VALUE_TEXT, VALUE_TEXT, st.none(), st.integers(), st.binary(max_size=8), st.floats())
HEADERS = st.one_of(
    st.dictionaries(NAME, VALUE_TEXT, max_size=8),
    st.dictionaries(st.one_of(NAME, st.integers(), st.none()), ANY_VALUE, max_size=8),
    st.lists(st.tuples(NAME, VALUE_TEXT), max_size=8),
)


def assert_count(value: object) -> None:
    assert value is None or (type(value) is int and 0 <= value <= MAX_SAFE), value


@given(HEADERS)
def test_any_headers_give_none_safe_counts_or_a_refusal(headers: Any) -> None:
    """Whatever the headers, the reader returns None, a Remaining of non-negative safe integers (at least one set),
    or raises InvalidInputError; never anything else."""
    try:
        found = remaining_from_headers(headers)
    except InvalidInputError:
        return
    if found is None:
        return
    assert isinstance(found, Remaining)
    assert_count(found.requests)
    assert_count(found.tokens)
    assert (found.requests, found.tokens) != (None, None)


@given(st.dictionaries(st.sampled_from(READ_NAMES), st.integers(0, MAX_REMAINING), min_size=1), st.randoms())
def test_valid_figures_give_the_smallest_of_each_kind(figures: dict[str, int], random: Any) -> None:
    """For well-formed figures under any letter case, requests is the smallest request figure and tokens the smallest
    token figure (None where no figure of that kind is given)."""
    headers = {
        "".join(char.upper() if random.random() < 0.5 else char for char in name): str(value)
        for name, value in figures.items()
    }
    requests = [value for name, value in figures.items() if name in REQUEST_HEADERS]
    tokens = [value for name, value in figures.items() if name in TOKEN_HEADERS]
    assert remaining_from_headers(headers) == Remaining(
        min(requests) if requests else None, min(tokens) if tokens else None
    )


# --- the value ----------------------------------------------------------------------------------------------


def test_remaining_takes_non_negative_safe_integers_or_none() -> None:
    """Remaining accepts None, 0 and 2**53 - 1 for either figure, and is a plain comparable value."""
    assert Remaining() == Remaining(None, None)
    assert Remaining(0, MAX_SAFE).tokens == MAX_SAFE
    assert Remaining(requests=5) == Remaining(5, None)


@pytest.mark.parametrize("field", ["requests", "tokens"])
@pytest.mark.parametrize(
    "value", [-1, MAX_SAFE + 1, 2**64, 1.0, 1.5, float("nan"), True, False, "5", b"5", [5]], ids=repr
)
def test_remaining_refuses_anything_else(field: str, value: object) -> None:
    """A negative, unsafe, fractional, boolean or non-number figure raises InvalidInputError."""
    with pytest.raises(InvalidInputError):
        Remaining(**{field: value})
