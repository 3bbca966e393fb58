"""Fuzz: the value constructors callers build, process evidence and the key loader answer hostile values as documented.

Each case makes one field hostile and keeps the others valid (see ``hostile.Arg``). A value
the field must refuse raises ``InvalidInputError`` (``MissingKeyError`` for a key source
that holds no usable key); an odd value of the right type is accepted (the object keeps it)
or refused with an ``AdmissionError``; nothing raises a raw ``TypeError``, ``ValueError``,
``AttributeError``, ``OverflowError`` or ``UnicodeEncodeError``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from fake_proc import BOOT, CREATED_AT, NS, OWNER_A, PID, START, FakeProc, process, stat_line
from hostile import (
    ANY_TEXT,
    BAD_IDENTIFIER_TEXT,
    MAX_SAFE,
    NOT_A_COMMAND,
    NOT_AN_INT,
    NOT_AN_INT_AT_ALL,
    NOT_TEXT,
    ODD_TEXT,
    OTHER_TYPES,
    OUT_OF_RANGE,
    UUID4,
    Arg,
    Opaque,
    assert_documented,
    attempt,
    draw_arguments,
    identifier,
    timestamp,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from admission_plane import (
    ConnectorIdentity,
    DispatchRecord,
    LeaseFence,
    LiveTurnCompletion,
    LiveTurnFailure,
    Policy,
    ProcessIdentity,
    RequestState,
)
from admission_plane.errors import InvalidInputError, MissingKeyError
from admission_plane.evidence import (
    capture,
    format_created_at,
    inspect_process_group,
    observe,
    parse_stat,
    read_boot_id,
)
from admission_plane.keys import CONTENT_KEY_VARIABLE, ENCRYPTION_KEY_VARIABLE, generate_key_file, load_keys
from admission_plane.turns import Backoff, spawn_child, turn

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
IDENTITY = process(PID, start=START, ppid=1)
CONNECTOR = ConnectorIdentity(owner_instance_id=OWNER_A, created_at=CREATED_AT, process=IDENTITY)
POSITIVE = Arg(st.just(7), wrong=st.one_of(NOT_AN_INT_AT_ALL, OUT_OF_RANGE, st.just(0)), odd=st.integers(1, MAX_SAFE))
NON_NEGATIVE = timestamp(st.just(2_000))
NOT_A_PROCESS = st.one_of(OTHER_TYPES, NOT_AN_INT, ANY_TEXT, st.just(IDENTITY.to_mapping()), st.just(CONNECTOR))
#: Objects with callable read_file and read_link that are not working readers (the class itself: unbound methods).
READER_LIKE = st.sampled_from([FakeProc, FakeProc().add(pid=PID + 1)])
READERS = Arg(
    st.just(FakeProc().add()), wrong=st.one_of(OTHER_TYPES, ANY_TEXT, NOT_AN_INT, st.just(Opaque())), odd=READER_LIKE
)
NOT_A_CONNECTOR = st.one_of(OTHER_TYPES, NOT_AN_INT, ANY_TEXT, st.just(CONNECTOR.to_mapping()), st.just(IDENTITY))


def pid_arg(minimum: int) -> Arg:
    """A pid-like field: an int in ``minimum..2**31 - 1``."""
    wrong = st.one_of(NOT_AN_INT_AT_ALL, st.integers(max_value=minimum - 1), st.integers(min_value=2**31))
    return Arg(st.just(PID), wrong=wrong, odd=st.integers(minimum, 2**31 - 1))


def text_choice(valid: list[Any]) -> Arg:
    """One of a few valid values; every other value (text included) is refused."""
    return Arg(st.sampled_from(valid), wrong=st.one_of(NOT_TEXT, ODD_TEXT.filter(lambda text: text not in valid)))


#: Every value constructor: its arguments and how to call it.
CONSTRUCTORS: dict[str, tuple[dict[str, Arg], Callable[..., Any]]] = {
    "Policy": (
        {
            "max_active_turns": POSITIVE,
            "max_concurrent_starts": POSITIVE,
            "min_start_interval_ms": NON_NEGATIVE,
            "queue_timeout_ms": NON_NEGATIVE,
            "capacity_cooldown_ms": NON_NEGATIVE,
        },
        Policy,
    ),
    "LeaseFence": (
        {
            "lease_id": identifier(st.just("lease-1")),
            "generation": POSITIVE,
            "owner_instance_id": identifier(st.just(OWNER_A)),
        },
        LeaseFence,
    ),
    "ProcessIdentity": (
        {
            "boot_id": Arg(
                st.just(BOOT),
                wrong=st.one_of(
                    NOT_TEXT,
                    BAD_IDENTIFIER_TEXT,
                    st.sampled_from([BOOT.upper(), "00000000-0000-0000-0000-000000000000", BOOT + " "]),
                ),
            ),
            "pid": pid_arg(1),
            "start_time_ticks": Arg(
                st.just(START),
                wrong=st.one_of(
                    NOT_TEXT, st.sampled_from(["", "0", "01", "-1", " 1", "1.0", "٣", str(2**64), "9" * 400])
                ),
                odd=st.integers(1, 2**64 - 1).map(str),
            ),
            "pid_namespace_inode": Arg(
                st.just(NS), wrong=st.one_of(NOT_AN_INT_AT_ALL, st.integers(max_value=0), st.integers(min_value=2**32))
            ),
            "ppid": pid_arg(0),
            "pgrp": pid_arg(0),
            "session": pid_arg(0),
        },
        ProcessIdentity,
    ),
    "ConnectorIdentity": (
        {
            "owner_instance_id": Arg(
                st.just(OWNER_A),
                wrong=st.one_of(NOT_TEXT, BAD_IDENTIFIER_TEXT, st.just(OWNER_A.upper()), st.uuids(version=1).map(str)),
                odd=UUID4,
            ),
            "created_at": Arg(
                st.just(CREATED_AT),
                wrong=st.one_of(
                    NOT_TEXT,
                    BAD_IDENTIFIER_TEXT,
                    st.sampled_from(
                        [
                            "2026-02-30T00:00:00.000Z",
                            "2026-01-01T24:00:00.000Z",
                            "2026-01-01T00:00:60.000Z",
                            "2026-01-01 00:00:00.000Z",
                            "2026-01-01T00:00:00Z",
                            "+2026-01-01T00:00:00.000Z",
                        ]
                    ),
                ),
                odd=st.integers(0, 253_402_300_799_999).map(format_created_at),
            ),
            "process": Arg(st.just(IDENTITY), wrong=NOT_A_PROCESS),
        },
        ConnectorIdentity,
    ),
    "DispatchRecord": (
        {
            "request_id": identifier(st.just("r-1")),
            "lease_id": identifier(st.just("lease-1")),
            "generation": POSITIVE,
            "owner_instance_id": Arg(
                st.just(OWNER_A), wrong=st.one_of(NOT_TEXT, BAD_IDENTIFIER_TEXT, st.just(OWNER_A.upper())), odd=UUID4
            ),
            "connector": Arg(st.just(CONNECTOR), wrong=NOT_A_CONNECTOR),
            "child": Arg(st.just(IDENTITY), wrong=NOT_A_PROCESS),
            "prompt_channel": text_choice(["stdin", "pty"]),
        },
        DispatchRecord,
    ),
    "LiveTurnFailure": (
        {
            "category": text_choice(["provider_capacity", "unknown"]),
            "http_status": Arg(
                st.sampled_from([None, 429]),
                wrong=st.one_of(
                    NOT_AN_INT_AT_ALL.filter(lambda value: value is not None),
                    OUT_OF_RANGE,
                    st.integers(max_value=99),
                    st.integers(min_value=600),
                ),
            ),
            "code": Arg(
                st.sampled_from([None, "rate_limited"]),
                wrong=st.one_of(NOT_TEXT.filter(lambda value: value is not None), BAD_IDENTIFIER_TEXT),
                odd=ODD_TEXT,
            ),
            "reason": Arg(
                st.sampled_from([None, "overloaded"]),
                wrong=st.one_of(NOT_TEXT.filter(lambda value: value is not None), BAD_IDENTIFIER_TEXT),
                odd=ODD_TEXT,
            ),
        },
        LiveTurnFailure,
    ),
    "LiveTurnCompletion": (
        {
            "outcome": Arg(
                st.just("failed"),
                wrong=st.one_of(NOT_TEXT, ODD_TEXT.filter(lambda text: text not in set(RequestState))),
            ),
            "failure": Arg(
                st.sampled_from([None, LiveTurnFailure("unknown")]),
                wrong=st.one_of(
                    OTHER_TYPES.filter(lambda value: value is not None),
                    ANY_TEXT,
                    NOT_AN_INT,
                    st.just(LiveTurnCompletion("completed")),
                ),
            ),
        },
        LiveTurnCompletion,
    ),
    "Backoff": (
        {
            "initial_ms": Arg(
                st.just(10),
                wrong=st.one_of(
                    OTHER_TYPES,
                    ANY_TEXT,
                    st.booleans(),
                    st.sampled_from([0, -1, float("nan"), float("inf"), -0.5, 2**53, 10**400]),
                ),
                odd=st.floats(1e-300, MAX_SAFE),
            ),
            "factor": Arg(
                st.just(1.6),
                wrong=st.one_of(
                    OTHER_TYPES,
                    ANY_TEXT,
                    st.booleans(),
                    st.sampled_from([0.5, float("nan"), float("inf"), 2**53, 10**400]),
                ),
                odd=st.floats(1, MAX_SAFE),
            ),
            "max_ms": Arg(
                st.just(250),
                wrong=st.one_of(
                    OTHER_TYPES, ANY_TEXT, st.booleans(), st.sampled_from([0, -1, float("nan"), float("-inf")])
                ),
                odd=st.integers(1, MAX_SAFE),
            ),
            "jitter": Arg(
                st.just(0.2),
                wrong=st.one_of(
                    OTHER_TYPES, ANY_TEXT, st.booleans(), st.sampled_from([1, 1.0, -0.1, float("nan"), float("inf")])
                ),
                odd=st.floats(0, 0.999),
            ),
        },
        Backoff,
    ),
    "format_created_at": ({"epoch_ms": timestamp(st.just(0))}, format_created_at),
    "ConnectorIdentity.capture": (
        {
            "pid": Arg(
                st.just(PID), wrong=pid_arg(1).wrong.filter(lambda value: value is not None), odd=pid_arg(1).odd
            ),
            "readers": attrs.evolve(READERS, wrong=READERS.wrong.filter(lambda value: value is not None)),
            "owner_instance_id": Arg(
                st.sampled_from([None, OWNER_A]),
                wrong=st.one_of(NOT_TEXT.filter(lambda value: value is not None), BAD_IDENTIFIER_TEXT),
                odd=UUID4,
            ),
            "now": Arg(
                st.sampled_from([None, 0]),
                wrong=st.one_of(NOT_AN_INT_AT_ALL.filter(lambda value: value is not None), st.integers(max_value=-1)),
                odd=st.integers(0, MAX_SAFE),
            ),
        },
        ConnectorIdentity.capture,
    ),
    "capture": (
        {"pid": Arg(st.just(PID), wrong=pid_arg(1).wrong), "readers": READERS},
        capture,
    ),
    "observe": (
        {
            "identity": Arg(
                st.sampled_from([IDENTITY, CONNECTOR]),
                wrong=st.one_of(OTHER_TYPES, ANY_TEXT, NOT_AN_INT, st.just(IDENTITY.to_mapping())),
            ),
            "readers": READERS,
        },
        observe,
    ),
    "inspect_process_group": (
        {
            "child": Arg(st.just(IDENTITY), wrong=st.one_of(OTHER_TYPES, ANY_TEXT, NOT_AN_INT, st.just(CONNECTOR))),
            "pids": Arg(st.just([PID, 1]), odd=st.one_of(OTHER_TYPES, NOT_AN_INT, st.lists(st.integers()))),
            "readers": READERS,
        },
        inspect_process_group,
    ),
    "read_boot_id": ({"readers": READERS}, read_boot_id),
    "parse_stat": (
        {"text": Arg(st.just(stat_line(PID)), odd=st.one_of(OTHER_TYPES, NOT_AN_INT, ANY_TEXT))},
        parse_stat,
    ),
    "spawn_child": ({"command": Arg(st.nothing(), wrong=NOT_A_COMMAND)}, spawn_child),
    "turn": (
        {"plane": Arg(st.nothing(), wrong=st.one_of(OTHER_TYPES, NOT_AN_INT, ANY_TEXT, st.just(FakeProc())))},
        lambda plane: turn(
            plane, request_id="r", session_id="s", agent_id="a", provider="p", model="m", prompt="x", command=["true"]
        ),
    ),
}


def _cases() -> list[Any]:
    return [
        pytest.param(name, target, id=f"{name}-{target}") for name, (args, _) in CONSTRUCTORS.items() for target in args
    ]


@pytest.mark.parametrize(("name", "target"), _cases())
def test_a_hostile_field_is_refused_with_invalid_input_or_kept(name: str, target: str) -> None:
    """With one field hostile and the others valid, a value constructor or evidence function refuses a value the field
    must refuse with InvalidInputError, and either accepts an odd value or refuses it with an AdmissionError."""
    args, build = CONSTRUCTORS[name]

    @FUZZ
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        arguments, kind = draw_arguments(data, args, target)
        built, error = attempt(build, **arguments)
        if error is not None:
            assert_documented(error, kind)
            return
        assert kind != "wrong", f"{name} accepted {arguments[target]!r:.200}"
        if built.__class__ is build and target in attrs.fields_dict(build):
            assert getattr(built, target) == arguments[target]

    check()


# --- keys ------------------------------------------------------------------------------------------------------

KEY_HEX = "ab" * 32
ENVIRONMENT_TEXT = ANY_TEXT.filter(lambda text: "\0" not in text and _fs_encodable(text))


def _fs_encodable(text: str) -> bool:
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return True


@FUZZ
@given(
    encryption=st.one_of(
        st.none(),
        ENVIRONMENT_TEXT,
        st.sampled_from(
            [
                KEY_HEX,
                f" {KEY_HEX}\n",
                KEY_HEX.upper(),
                KEY_HEX[:-1],
                KEY_HEX + "0",
                "٣" * 64,
                "０" * 64,
                "g" * 64,
                "cd" * 32,
                "x" * 100_000,
            ]
        ),
    ),
    content=st.one_of(st.none(), ENVIRONMENT_TEXT, st.sampled_from(["cd" * 32, "\udcff" * 64, "AB" * 32])),
)
@example(encryption=KEY_HEX, content=KEY_HEX.upper())
def test_key_variables_with_hostile_values_give_two_keys_or_a_missing_key_error(
    encryption: str | None, content: str | None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """load_keys with any values in the two key variables returns two different 32-byte keys or raises MissingKeyError,
    never printing the key material."""
    directory = tmp_path_factory.mktemp("keys", numbered=True)
    directory.chmod(0o700)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in ((ENCRYPTION_KEY_VARIABLE, encryption), (CONTENT_KEY_VARIABLE, content)):
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        keys, error = attempt(load_keys, directory / "absent")
    if error is not None:
        assert isinstance(error, MissingKeyError), error
        assert_documented(error, "odd")
        assert KEY_HEX not in str(error).lower()
        return
    assert len(keys.encryption_key) == len(keys.content_fingerprint_key) == 32
    assert keys.encryption_key != keys.content_fingerprint_key


HOSTILE_PATH = st.one_of(
    OTHER_TYPES.filter(lambda value: value is not None and not isinstance(value, os.PathLike)),
    NOT_AN_INT.filter(lambda value: not isinstance(value, str)),
    st.integers(),
    st.sampled_from(["a\0b", "\0", "\ud800", "x/\udfff", b"keys", Path("a\0b")]),
)


@pytest.mark.parametrize("function", [load_keys, generate_key_file], ids=["load_keys", "generate_key_file"])
def test_a_key_file_argument_that_is_not_a_path_is_refused(
    function: Callable[[Any], Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """load_keys and generate_key_file refuse a key file that is not a text path (a non-path, NUL, a lone surrogate,
    bytes) with InvalidInputError, creating nothing."""
    monkeypatch.delenv(ENCRYPTION_KEY_VARIABLE, raising=False)
    monkeypatch.delenv(CONTENT_KEY_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    tmp_path.chmod(0o700)

    @FUZZ
    @given(path=HOSTILE_PATH)
    def check(path: object) -> None:
        with pytest.raises(InvalidInputError, match="key file"):
            function(path)
        assert os.listdir(tmp_path) == []

    check()


ODD_PATH = st.one_of(ODD_TEXT, st.sampled_from(["x" * 5_000, "a\nb", "\x1b[31mred", "file/below", "/", ""]))


@FUZZ
@given(path=ODD_PATH, function=st.sampled_from([load_keys, generate_key_file]))
@example(path="x" * 5_000, function=generate_key_file)
@example(path="a\nb", function=load_keys)
def test_an_odd_key_file_path_gives_keys_or_a_one_line_key_error(
    path: str, function: Callable[[str], object], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """load_keys and generate_key_file on any other text path (relative, padded, very long, with a line break, below
    a file) succeed or raise a one-line MissingKeyError or InvalidInputError, never a raw OSError."""
    directory = tmp_path_factory.mktemp("odd", numbered=True)
    directory.chmod(0o700)
    (directory / "file").write_text("not a directory")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(ENCRYPTION_KEY_VARIABLE, raising=False)
        patch.delenv(CONTENT_KEY_VARIABLE, raising=False)
        patch.chdir(directory)
        _result, error = attempt(function, path)
    if error is not None:
        assert isinstance(error, MissingKeyError | InvalidInputError), error
        assert_documented(error, "odd")
