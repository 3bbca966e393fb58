"""Every public call of a plane as the fuzz tests see it: its arguments (``hostile.Arg``) and what it returns.

:func:`operations` maps each call's name to a :class:`Call` built on a :class:`PlaneState`
(the planted plane of ``test_fuzz_entry_points``); its valid values name that state's
leases and requests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from hostile import (
    ANY_TEXT,
    BAD_IDENTIFIER_TEXT,
    HUGE,
    MAX_SAFE,
    NOT_A_COMMAND,
    NOT_AN_INT,
    NOT_AN_INT_AT_ALL,
    NOT_CALLABLE,
    NOT_TEXT,
    ODD_TEXT,
    OTHER_TYPES,
    OUT_OF_RANGE,
    UUID4,
    Arg,
    Opaque,
    callable_arg,
    identifier,
    one_of_values,
    timestamp,
)
from hypothesis import strategies as st
from planes import CONTENT_KEY, ENCRYPTION_KEY, dispatch_record

from admission_plane import (
    AdmissionPlane,
    AdmittedLease,
    Budget,
    ConnectorIdentity,
    DispatchIntentResult,
    DispatchRecord,
    EnqueueResult,
    FaultInjection,
    LeaseFence,
    LiveTurnCompletion,
    LiveTurnFailure,
    Policy,
    PromptChannel,
    QueueSnapshot,
    ReaperSummary,
    ReleasedLease,
    Remaining,
    StoredRequest,
    SuspectReason,
    Turn,
)
from admission_plane.errors import PayloadExpiredError
from admission_plane.evidence import LIVE_READERS
from admission_plane.turns import Backoff
from admission_plane.values import MAX_TOKENS

FIXED_NOW = 5_000
#: A token budget of the fuzzed key: an estimate beyond it is refused (BudgetError), one within it is not.
FUZZ_MAX_TOKENS = 1_000_000
#: The fuzzed plane's policy: room for one more admission and one more start, and budgets of the planted key
#: (a provider-wide minute and a model hour) generous enough never to hold an admission back.
FUZZ_POLICY = Policy(
    5,
    2,
    0,
    1_800_000,
    30_000,
    budgets=(
        Budget("antigravity", window_ms=60_000, max_requests=1_000, max_tokens=FUZZ_MAX_TOKENS),
        Budget("antigravity", "model-test", window_ms=3_600_000, max_tokens=10 * FUZZ_MAX_TOKENS),
    ),
)
#: The durable policy the valid claims record (the durable bounds are stricter).
DURABLE_POLICY = Policy(5, 2, 2_000, 1_800_000, 30_000)
NOW = st.sampled_from([FIXED_NOW, 6_000])
VALID_IDENTIFIER = st.from_regex(r"[!-~]{1,40}", fullmatch=True)
#: Text no request-metadata rule accepts (fingerprints take long, padded and control-laden text).
BAD_METADATA_TEXT = st.sampled_from(["", " ", "\t\n", "a\0b", "\0", "\ud800", "x\udfffy"])
NOT_NONE = OTHER_TYPES.filter(lambda value: value is not None)


@attrs.frozen
class PlaneState:
    """The planted plane: its database, the plane and its three leases."""

    database: str
    plane: Any
    active: AdmittedLease
    admitted: AdmittedLease
    starting: AdmittedLease

    @property
    def owner(self) -> str:
        return str(self.active.owner_instance_id)

    @classmethod
    def placeholder(cls) -> PlaneState:
        """A state with made-up leases, for listing the calls and their arguments."""
        lease = AdmittedLease("lease", "request", 1, "00000000-0000-4000-8000-000000000000")
        return cls("", None, lease, lease, lease)


def _nothing_written(_result: object) -> bool:
    return False


@attrs.frozen
class Call:
    """One public call: its arguments, how to run it, what it returns, and when it may write."""

    args: dict[str, Arg]
    run: Callable[[Any, dict[str, Any]], Any]
    returns: type | tuple[type, ...] = object
    #: ``False``: the call never writes, even when it succeeds.
    writes: bool = True
    #: Refusals that are documented to write first (an expired payload is deleted, then refused).
    writes_when: tuple[type[BaseException], ...] = ()
    #: Results that mean nothing was written (a dispatch intent that was not committed).
    unchanged_when: Callable[[Any], bool] = _nothing_written
    #: Whether a value the argument must refuse is answered by a result rather than an exception.
    refuses_by_result: bool = False


def method(name: str) -> Callable[[Any, dict[str, Any]], Any]:
    """Call the plane's method ``name`` with the arguments by keyword."""
    return lambda plane, arguments: getattr(plane, name)(**arguments)


# --- argument kinds ---------------------------------------------------------------------------------------


def now() -> Arg:
    return timestamp(NOW)


def owner(state: PlaneState) -> Arg:
    return identifier(st.just(state.owner))


def fence(state: PlaneState) -> Arg:
    """A lease fence: a ``LeaseFence`` or an ``AdmittedLease`` (which is not validated until used)."""
    leases = [state.active, state.admitted, state.starting]
    bad_id = st.one_of(NOT_TEXT, BAD_IDENTIFIER_TEXT)
    bad_generation = st.one_of(NOT_AN_INT_AT_ALL, OUT_OF_RANGE, st.just(0))
    lease = st.sampled_from(leases)
    broken = st.one_of(
        st.builds(lambda found, bad: attrs.evolve(found, lease_id=bad), lease, bad_id),
        st.builds(lambda found, bad: attrs.evolve(found, generation=bad), lease, bad_generation),
        st.builds(lambda found, bad: attrs.evolve(found, owner_instance_id=bad), lease, bad_id),
    )
    wrong = st.one_of(
        OTHER_TYPES,
        NOT_AN_INT_AT_ALL,
        ANY_TEXT,
        broken,
        lease.map(attrs.asdict),
        lease.map(attrs.astuple),
        lease.map(lambda found: found.lease_id),
    )
    odd = st.one_of(
        st.builds(LeaseFence, VALID_IDENTIFIER, st.integers(1, MAX_SAFE), VALID_IDENTIFIER),
        st.builds(lambda found, generation: attrs.evolve(found, generation=generation), lease, st.integers(1, 9)),
        st.builds(lambda found, other: attrs.evolve(found, owner_instance_id=other), lease, UUID4),
    )
    return Arg(st.sampled_from([*leases, *(found.fence for found in leases)]), wrong=wrong, odd=odd)


def metadata_text(valid: str) -> Arg:
    """A fingerprint: any text that is not blank and holds no NUL or lone surrogate."""
    return Arg(st.just(valid), wrong=st.one_of(NOT_TEXT, BAD_METADATA_TEXT), odd=st.one_of(ODD_TEXT, st.just(HUGE)))


def prompt(valid: str = "a prompt") -> Arg:
    """A prompt: any UTF-8 encodable text."""
    surrogate = st.sampled_from(["\ud800", "x\udcff", "\udfff\ud800"])
    return Arg(st.just(valid), wrong=st.one_of(NOT_TEXT, surrogate), odd=st.sampled_from(["", "a\0b", HUGE, " "]))


def connector(state: PlaneState, *, optional: bool) -> Arg:
    """A ``ConnectorIdentity`` (or ``None`` where the plane's own is the default)."""
    identity = state.plane.owner_identity if state.plane is not None else None
    valid = [None, identity] if optional else [identity]
    wrong = st.one_of(NOT_NONE, NOT_AN_INT_AT_ALL, ANY_TEXT, st.just(identity).map(_mapping_of))
    fresh = st.builds(lambda other: attrs.evolve(identity, owner_instance_id=other), UUID4) if identity else st.none()
    return Arg(st.sampled_from(valid), wrong=wrong.filter(lambda value: value is not None), odd=fresh)


def _mapping_of(identity: ConnectorIdentity | None) -> object:
    return None if identity is None else identity.to_mapping()


def policy(valid: Policy) -> Arg:
    """A ``Policy`` (its own constructor refuses bad fields); anything else must be refused."""
    policies = st.builds(
        Policy,
        st.integers(1, 9),
        st.integers(1, 9),
        st.integers(0, 40_000),
        st.integers(0, 2_000_000),
        st.integers(0, 40_000),
    )
    wrong = st.one_of(NOT_NONE, st.integers(), ANY_TEXT, st.just(valid.as_tuple()), st.just(attrs.asdict(valid)))
    return Arg(st.just(valid), wrong=wrong, odd=policies)


def record(state: PlaneState) -> Arg:
    """A dispatch record, or the original's camelCase mapping of one."""
    valid = dispatch_record(state.plane, state.starting) if state.plane is not None else None
    mapping = _record_mapping(valid)
    spoil = st.one_of(BAD_IDENTIFIER_TEXT, NOT_NONE, st.none(), st.floats(), st.booleans(), OUT_OF_RANGE)
    corrupted = st.builds(_corrupt, st.just(mapping), st.sampled_from(_paths(mapping)), spoil)
    odd = st.builds(lambda generation: attrs.evolve(valid, generation=generation), st.integers(1, MAX_SAFE))
    wrong = st.one_of(NOT_NONE, st.none(), NOT_AN_INT_AT_ALL, ANY_TEXT, corrupted)
    return Arg(st.just(valid), wrong=wrong, odd=odd if valid is not None else st.nothing())


def _record_mapping(found: DispatchRecord | None) -> dict[str, Any]:
    if found is None:
        return {}
    return {
        "requestId": found.request_id,
        "leaseId": found.lease_id,
        "generation": found.generation,
        "ownerInstanceId": found.owner_instance_id,
        "promptChannel": str(found.prompt_channel),
        "processIdentity": {"connector": found.connector.to_mapping(), "child": found.child.to_mapping()},
    }


def _paths(mapping: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []
    for key, value in mapping.items():
        paths.append((*prefix, key))
        if isinstance(value, dict):
            paths.extend(_paths(value, (*prefix, key)))
    return paths or [("requestId",)]


def _corrupt(mapping: dict[str, Any], path: tuple[str, ...], value: object) -> dict[str, Any]:
    """``mapping`` with the entry at ``path`` replaced by ``value`` (copied along the path, never changed)."""
    head, *rest = path
    return {**mapping, head: _corrupt(mapping[head], tuple(rest), value) if rest else value}


# --- the calls ------------------------------------------------------------------------------------------------


def operations(state: PlaneState) -> dict[str, Call]:
    """Every public call of the planted plane, by name."""
    queued = identifier(st.sampled_from(["q-1", "q-2"]))
    lease_call = {"fence": fence(state), "now": now()}
    calls: dict[str, Call] = {
        "enqueue": Call(_enqueue_args(state), method("enqueue"), EnqueueResult),
        "enqueue_with_payload": Call(
            {**_enqueue_args(state), "plaintext": prompt(), "expires_at": timestamp(st.just(10_000_000))},
            method("enqueue_with_payload"),
            EnqueueResult,
        ),
        "persist_payload": Call(
            {
                "request_id": identifier(st.just("q-bare")),
                "plaintext": prompt(),
                "now": now(),
                "expires_at": timestamp(st.just(10_000_000)),
            },
            method("persist_payload"),
            type(None),
        ),
        "read_payload": Call(
            {"request_id": queued, "now": now()}, method("read_payload"), str, writes_when=(PayloadExpiredError,)
        ),
        "cancel_queued": Call({"request_id": identifier(st.just("q-2")), "now": now()}, method("cancel_queued")),
        "get_queue_snapshot": Call(
            {"request_id": queued, "now": now()}, method("get_queue_snapshot"), (QueueSnapshot, type(None))
        ),
        "admit_next": Call(
            {"now": now(), "owner_instance_id": owner(state)}, method("admit_next"), (AdmittedLease, type(None))
        ),
        "admit_request": Call(
            {"request_id": queued, "now": now(), "owner_instance_id": owner(state)},
            method("admit_request"),
            (AdmittedLease, type(None)),
        ),
        "wait_for_admission": Call(_wait_args(state), method("wait_for_admission"), (AdmittedLease, type(None))),
        **{
            name: Call(lease_call, method(name), type(None))
            for name in (
                "mark_starting",
                "mark_dispatch_intent",
                "mark_active",
                "mark_dispatch_ambiguous",
                "mark_execution_recovery_required",
                "release_exited_recovery_seat",
                "heartbeat",
                "settle_lease_owner_death",
            )
        },
        "abandon_before_prompt": Call(
            {**lease_call, "outcome": one_of_values(["failed", "cancelled"], NOT_TEXT)},
            method("abandon_before_prompt"),
            type(None),
        ),
        "complete_live_turn": Call(
            {**lease_call, "completion": _completion()}, method("complete_live_turn"), type(None)
        ),
        "mark_suspect": Call(
            {**lease_call, "reason": one_of_values([*SuspectReason, *map(str, SuspectReason)], NOT_TEXT)},
            method("mark_suspect"),
            bool,
        ),
        "set_capacity_cooldown": Call(
            {
                "provider": identifier(st.just("antigravity")),
                "model": identifier(st.just("model-test")),
                "not_before": timestamp(st.just(60_000)),
                "now": now(),
            },
            method("set_capacity_cooldown"),
            type(None),
        ),
        **{
            name: Call(
                {"record": record(state)},
                method(name),
                DispatchIntentResult,
                unchanged_when=lambda result: not result.ok,
                refuses_by_result=True,
            )
            for name in ("record_process_identity", "commit_dispatch_intent")
        },
        "read_sanitized_events": Call(
            {"after_event_seq": timestamp(st.sampled_from([0, 3])), "limit": _limit(1_000)},
            method("read_sanitized_events"),
            tuple,
            writes=False,
        ),
        "get_request": Call({"request_id": queued}, method("get_request"), (StoredRequest, type(None)), writes=False),
        "settle_queued_owner_death": Call(
            {"request_id": queued, "owner_instance_id": owner(state), "now": now()},
            method("settle_queued_owner_death"),
            bool,
        ),
        **{
            name: Call(
                {"policy": policy(DURABLE_POLICY), "owner_instance_id": owner(state), "now": now()},
                method(name),
                type(None),
            )
            for name in ("claim_durable_policy", "assert_durable_policy_match")
        },
        "begin_soft_drain_to_1": Call(
            {"owner_instance_id": owner(state), "now": now()}, method("begin_soft_drain_to_1"), type(None)
        ),
        "release_lease": Call(
            {"lease_id": identifier(st.just(state.admitted.lease_id)), "now": now()},
            method("release_lease"),
            ReleasedLease,
        ),
        "reap_suspects": Call({"now": now(), "readers": _readers()}, method("reap_suspects"), ReaperSummary),
        "record_untrusted_recovery_rows": Call(
            {"count": _limit(2), "now": now()}, method("record_untrusted_recovery_rows"), type(None)
        ),
        "record_external_usage": Call(_external_usage_args(), method("record_external_usage"), type(None)),
        "correct_budget": Call(_correction_args(), method("correct_budget"), tuple),
        "budget_status": Call({"now": _optional_now()}, method("budget_status"), tuple, writes=False),
        "turn": Call(_turn_args(), method("turn"), Turn, writes=False),
        "AdmissionPlane": Call(_plane_args(state), _open_plane, AdmissionPlane, writes=False),
    }
    return calls


def _enqueue_args(state: PlaneState) -> dict[str, Arg]:
    return {
        "request_id": identifier(st.just("fz-new")),
        "session_id": identifier(st.just("session-1")),
        "agent_id": identifier(st.just("agent-z")),
        "fingerprint": metadata_text("fingerprint-1"),
        "provider": identifier(st.just("antigravity")),
        "model": identifier(st.just("model-test")),
        "now": now(),
        "owner_identity": connector(state, optional=True),
        "estimated_tokens": _estimate(),
    }


def _estimate() -> Arg:
    """An enqueue's estimated tokens: ``None`` or 0..MAX_TOKENS (beyond the key's token budget: BudgetError)."""
    wrong = st.one_of(
        NOT_NONE, NOT_AN_INT.filter(lambda value: value is not None), OUT_OF_RANGE, st.integers(MAX_TOKENS + 1)
    )
    odd = st.one_of(st.integers(0, MAX_SAFE), st.sampled_from([FUZZ_MAX_TOKENS, FUZZ_MAX_TOKENS + 1, MAX_TOKENS]))
    return Arg(st.sampled_from([None, 1_000]), wrong=wrong, odd=odd)


def _optional_now() -> Arg:
    """A time that defaults to the plane's clock: ``None`` or a timestamp."""
    found = timestamp(NOW)
    return Arg(st.one_of(st.none(), NOW), wrong=found.wrong.filter(lambda value: value is not None), odd=found.odd)


def _token_count(valid: list[int]) -> Arg:
    """A count of requests or tokens: 0..MAX_TOKENS."""
    wrong = st.one_of(NOT_AN_INT_AT_ALL, OUT_OF_RANGE, st.integers(MAX_TOKENS + 1, MAX_SAFE))
    return Arg(st.sampled_from(valid), wrong=wrong, odd=st.integers(0, MAX_SAFE))


def _optional_model() -> Arg:
    """A model, or ``None`` for the provider as a whole."""
    return Arg(
        st.sampled_from([None, "model-test"]),
        wrong=st.one_of(NOT_TEXT.filter(lambda value: value is not None), BAD_IDENTIFIER_TEXT),
        odd=ODD_TEXT,
    )


def _external_usage_args() -> dict[str, Arg]:
    """``record_external_usage``: valid counts never both zero (which it refuses)."""
    return {
        "provider": identifier(st.just("antigravity")),
        "model": _optional_model(),
        "requests": _token_count([1, 2]),
        "tokens": _token_count([0, 500]),
        "now": _optional_now(),
    }


#: Response headers as the providers send them (OpenAI's, Anthropic's, and none that say what remains).
HEADERS = [
    {"x-ratelimit-remaining-requests": "999", "x-ratelimit-remaining-tokens": "999000"},
    {"anthropic-ratelimit-requests-remaining": "998", "anthropic-ratelimit-output-tokens-remaining": "990000"},
    {"content-type": "application/json"},
]
REMAINING_NAMES = st.sampled_from(
    ["x-ratelimit-remaining-requests", "X-RateLimit-Remaining-Tokens", "anthropic-ratelimit-tokens-remaining"]
)


def _remaining() -> Arg:
    """What the provider says remains: a ``Remaining`` or a mapping of response headers."""
    count = st.one_of(st.none(), st.integers(0, MAX_SAFE))
    wrong = st.one_of(
        NOT_NONE.filter(lambda value: not isinstance(value, dict)),
        st.none(),
        NOT_AN_INT,
        ANY_TEXT,
        st.sampled_from(
            [
                [("x-ratelimit-remaining-requests", "5")],  # pairs, not a mapping
                {"requests": 5, "tokens": 5},
                {5: "5"},
                {b"x-ratelimit-remaining-requests": b"5"},
            ]
        ),
        st.dictionaries(REMAINING_NAMES, st.sampled_from(["-1", "1.5", "", "１", str(2**53), "x" * 100]), min_size=1),
        st.dictionaries(REMAINING_NAMES, st.one_of(NOT_TEXT, st.none()), min_size=1),
    )
    odd = st.one_of(
        st.builds(Remaining, count, count),
        st.dictionaries(st.one_of(REMAINING_NAMES, ANY_TEXT), ANY_TEXT, max_size=4),
        st.dictionaries(REMAINING_NAMES, st.integers(0, 2**60).map(str), max_size=3),
    )
    return Arg(st.sampled_from([Remaining(999, 999_000), Remaining(tokens=10), *HEADERS]), wrong=wrong, odd=odd)


def _correction_args() -> dict[str, Arg]:
    """``correct_budget`` for the planted key (its windows: the provider's minute, the model's hour)."""
    window_wrong = st.one_of(NOT_AN_INT, OUT_OF_RANGE, st.just(0), NOT_NONE)
    return {
        "provider": identifier(st.just("antigravity")),
        "model": identifier(st.just("model-test")),
        "remaining": _remaining(),
        "window_ms": Arg(st.sampled_from([60_000, 3_600_000]), wrong=window_wrong, odd=st.integers(1, MAX_SAFE)),
        "now": _optional_now(),
    }


def _limit(maximum: int) -> Arg:
    wrong = st.one_of(NOT_AN_INT_AT_ALL, OUT_OF_RANGE, st.just(0))
    return Arg(st.integers(1, min(maximum, 3)), wrong=wrong, odd=st.integers(1, MAX_SAFE))


def _delay() -> Arg:
    wrong = st.one_of(
        NOT_NONE,
        st.none(),
        ANY_TEXT,
        st.booleans(),
        st.sampled_from([0, -1, 0.0, -0.5, float("nan"), float("inf"), -float("inf"), MAX_SAFE + 1, 2**64, 10**400]),
    )
    odd = st.one_of(st.floats(min_value=1e-300, max_value=MAX_SAFE), st.integers(1, MAX_SAFE))
    return Arg(st.sampled_from([1.0, 4.0]), wrong=wrong, odd=odd)


def _wait_args(state: PlaneState) -> dict[str, Arg]:
    """``wait_for_admission`` on a request that is not queued, so that every valid call returns at once."""
    no_timeout = st.one_of(NOT_NONE, NOT_AN_INT_AT_ALL.filter(lambda value: value is not None), OUT_OF_RANGE)
    return {
        "request_id": identifier(st.just("fz-absent")),
        "owner_instance_id": owner(state),
        "timeout_ms": Arg(st.sampled_from([None, 0, 10]), wrong=no_timeout, odd=st.integers(0, MAX_SAFE)),
        "initial_delay_ms": _delay(),
        "max_delay_ms": _delay(),
        "sleep": callable_arg(time.sleep),
        "on_wait": callable_arg(print, optional=True),
        "fallback_ms": _limit(250),
    }


def _completion() -> Arg:
    valid = [LiveTurnCompletion("completed"), LiveTurnCompletion("failed", LiveTurnFailure("provider_capacity"))]
    wrong = st.one_of(OTHER_TYPES, ANY_TEXT, st.sampled_from(["completed", LiveTurnFailure("unknown"), {"outcome": 1}]))
    return Arg(st.sampled_from(valid), wrong=wrong)


def _readers() -> Arg:
    class OnlyListing:
        def list_process_ids(self) -> list[int]:
            return [1]

    wrong = st.one_of(
        NOT_NONE,
        NOT_AN_INT_AT_ALL.filter(lambda value: value is not None),
        ANY_TEXT,
        st.sampled_from([OnlyListing(), Opaque(), object]),
    )
    return Arg(st.sampled_from([None, LIVE_READERS]), wrong=wrong)


def _turn_args() -> dict[str, Arg]:
    command_odd = st.lists(ODD_TEXT, min_size=1, max_size=3)
    interval_wrong = st.one_of(NOT_AN_INT_AT_ALL, OUT_OF_RANGE, st.just(0))
    return {
        "request_id": identifier(st.just("t-1")),
        "session_id": identifier(st.just("session-1")),
        "agent_id": identifier(st.just("agent-t")),
        "provider": identifier(st.just("antigravity")),
        "model": identifier(st.just("model-test")),
        "prompt": prompt(),
        "command": Arg(st.sampled_from([["true"], ("true", "-x")]), wrong=NOT_A_COMMAND, odd=command_odd),
        "fingerprint": metadata_text("fingerprint-1"),
        "prompt_channel": one_of_values(["stdin", "pty", PromptChannel.STDIN], NOT_TEXT),
        "wait_timeout_ms": Arg(
            st.sampled_from([None, 1_000]),
            wrong=st.one_of(NOT_NONE, NOT_AN_INT, OUT_OF_RANGE),
            odd=st.integers(0, MAX_SAFE),
        ),
        "start_timeout_ms": timestamp(st.just(60_000)),
        "backoff": Arg(
            st.sampled_from([None, Backoff()]),
            wrong=st.one_of(NOT_NONE, ANY_TEXT, st.just({})),
            odd=st.builds(Backoff, st.integers(1, 100), st.floats(1, 4), st.integers(1, 1_000)),
        ),
        "heartbeat_interval_ms": Arg(st.just(1_000), wrong=interval_wrong, odd=st.integers(1, MAX_SAFE)),
        "payload_grace_ms": Arg(st.just(300_000), wrong=interval_wrong, odd=st.integers(1, MAX_SAFE)),
        "clock": callable_arg(lambda: FIXED_NOW),
        "sleep": callable_arg(time.sleep),
        "progress": callable_arg(print, optional=True),
        "write_prompt": callable_arg(print, optional=True),
    }


def _plane_args(state: PlaneState) -> dict[str, Arg]:
    database = state.database
    valid = (
        [database]
        if database.startswith("postgresql") or not database
        else [database, Path(database), f"sqlite:///{database}"]
    )
    wrong_text = st.sampled_from(
        [
            "",
            ":memory:",
            "sqlite://",
            "sqlite:///:memory:",
            "a\0b",
            "\ud800",
            "x\udcff.sqlite",
            f"{database}\0",
            "sqlite:///a\0b",
            "sqlite:///\ud800",
            "postgresql://\ud800/x",
            "postgresql+psycopg://u@h/db?x=\ud800",
            "postgresql+psycopg://u@h\0/db",
            "postgresql+psycopg://u@h:port/db",
            "mysql://u@h/db",
            "://",
            "x://y",
            "postgresql+nosuchdriver://h/db",
        ]
    )
    wrong_database = st.one_of(
        OTHER_TYPES.filter(lambda value: not isinstance(value, os.PathLike)),
        # A path object is a valid way to name a database: never a wrong value here.
        NOT_AN_INT_AT_ALL.filter(lambda value: not isinstance(value, str | os.PathLike)),
        st.integers(),
        wrong_text,
        st.sampled_from([database.encode(), b"x.sqlite", Path("a\0b")]),
    )
    odd_database = st.one_of(
        ODD_TEXT.filter(lambda text: not text.startswith("/dev")),
        st.sampled_from(
            [
                "missing.sqlite",
                "/nonexistent-dir/x.sqlite",
                "/",
                "sqlite:////nonexistent/x.sqlite",
                HUGE,
                "postgresql+psycopg://postgres@127.0.0.1:1/test",
                Path("missing.sqlite"),
                f"sqlite:///{database}?timeout=abc",
                "sqlite+nosuchdriver:///x.sqlite",
            ]
        ),
    )
    key_wrong = st.one_of(
        NOT_NONE.filter(lambda value: not _is_key(value)),
        ANY_TEXT,
        NOT_AN_INT,
        st.sampled_from([b"", b"k" * 31, b"k" * 33, b"ab" * 32, "k" * 32]),
    )
    any_value = st.one_of(OTHER_TYPES, NOT_AN_INT_AT_ALL, ANY_TEXT)
    hostile_clock = st.builds(lambda value: lambda: value, st.one_of(any_value, OUT_OF_RANGE))
    return {
        "database": Arg(st.sampled_from(valid), wrong=wrong_database, odd=odd_database),
        "policy": Arg(
            st.sampled_from([None, FUZZ_POLICY]), wrong=policy(FUZZ_POLICY).wrong, odd=policy(FUZZ_POLICY).odd
        ),
        "encryption_key": Arg(st.just(ENCRYPTION_KEY), wrong=key_wrong, odd=st.binary(min_size=32, max_size=32)),
        "content_fingerprint_key": Arg(st.just(CONTENT_KEY), wrong=key_wrong, odd=st.binary(min_size=32, max_size=32)),
        "owner_identity": connector(state, optional=True),
        "fault_injection": Arg(st.sampled_from([None, FaultInjection()]), wrong=st.one_of(NOT_NONE, ANY_TEXT)),
        "migrate": Arg(st.just(False), odd=any_value),
        "clock": Arg(st.just(lambda: FIXED_NOW), wrong=NOT_CALLABLE, odd=hostile_clock),
        "host_id": Arg(
            st.sampled_from([None, "host-a"]),
            wrong=st.one_of(NOT_TEXT.filter(lambda value: value is not None), BAD_IDENTIFIER_TEXT),
            odd=ODD_TEXT,
        ),
        "allow_foreign_tables": Arg(st.just(False), odd=any_value),
    }


def _is_key(value: object) -> bool:
    return isinstance(value, bytes | bytearray | memoryview) and len(value) == 32


def _open_plane(_plane: Any, arguments: dict[str, Any]) -> AdmissionPlane:
    """Open a plane, use its clock once (a wait that returns at once) and close it."""
    opened = AdmissionPlane(**arguments)
    try:
        opened.wait_for_admission("fz-absent", opened.owner_identity.owner_instance_id, timeout_ms=0)
    finally:
        opened.close()
    return opened


__all__ = ["DURABLE_POLICY", "FIXED_NOW", "FUZZ_MAX_TOKENS", "FUZZ_POLICY", "Call", "PlaneState", "operations"]
