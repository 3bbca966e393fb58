"""Fuzz: every public entry point answers hostile arguments as documented and writes nothing when it refuses.

Each example makes one argument of one call hostile (``hostile.Arg``: a value it must refuse,
or an odd one it may take) and keeps the others valid, on a plane that already holds state
(queued requests with and without a payload, an admitted, a starting and an active lease).
A call either succeeds and returns what its docstring says, or raises an
:class:`~admission_plane.errors.AdmissionError` (an ``InvalidInputError`` for a value the
argument must refuse); never a raw ``TypeError``/``ValueError``/``OverflowError``/
``UnicodeEncodeError`` or driver error, and never a hang. A refused call leaves every table
exactly as it was. The migration entry points and the command line are fuzzed the same way.
"""

from __future__ import annotations

import io
import os
import sqlite3
from contextlib import closing, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from dbutil import TableDump, is_postgres, pg_engine, table_dump
from entry_points import FIXED_NOW, FUZZ_POLICY, Call, PlaneState, operations
from hostile import (
    BAD_IDENTIFIER_TEXT,
    HUGE,
    MAX_SAFE,
    NOT_TEXT,
    ODD_TEXT,
    OTHER_TYPES,
    Arg,
    assert_documented,
    attempt,
    draw_arguments,
    hostile_targets,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planes import PlaneFactory, enqueue, lease_in_phase

from admission_plane import AdmissionPlane, migrate
from admission_plane.cli import main
from admission_plane.errors import AdmissionError, AdmissionMigrationError, InvalidInputError
from admission_plane.keys import CONTENT_KEY_VARIABLE, ENCRYPTION_KEY_VARIABLE
from admission_plane.store.engine import DATABASE_URL_VARIABLE

_SQLITE_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_stat%' ORDER BY name"
_PG_TABLES = (
    "SELECT table_name FROM information_schema.tables "
    "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name"
)
SQLITE_EXAMPLES = 100
POSTGRES_EXAMPLES = 30
#: The calls fuzzed on PostgreSQL too (one of each kind: enqueue, payload, lease, reads, policy, operator, opening).
POSTGRES_CALLS = (
    "enqueue_with_payload",
    "record_external_usage",
    "correct_budget",
    "budget_status",
    "persist_payload",
    "mark_suspect",
    "complete_live_turn",
    "admit_next",
    "wait_for_admission",
    "get_queue_snapshot",
    "record_process_identity",
    "set_capacity_cooldown",
    "read_sanitized_events",
    "claim_durable_policy",
    "release_lease",
    "AdmissionPlane",
)


def snapshot(database: str) -> TableDump:
    """Every row of every table, as ``dbutil.table_dump`` reads them, but in one transaction (several times faster)."""
    if is_postgres(database):
        with pg_engine(database).begin() as connection:
            names = [name for (name,) in connection.exec_driver_sql(_PG_TABLES)]
            rows = {name: connection.exec_driver_sql(f'SELECT * FROM "{name}"').fetchall() for name in names}
        return {name: sorted((tuple(map(_plain, row)) for row in found), key=repr) for name, found in rows.items()}
    with closing(sqlite3.connect(database, isolation_level=None, timeout=5)) as connection:
        names = [name for (name,) in connection.execute(_SQLITE_TABLES)]
        return {name: sorted(connection.execute(f'SELECT * FROM "{name}"'), key=repr) for name in names}


def _plain(value: object) -> object:
    return bytes(value) if isinstance(value, memoryview) else value


def planted(make_plane: PlaneFactory, database: str) -> PlaneState:
    """A plane holding an active, an admitted and a starting lease, and three queued requests (one without payload)."""
    plane = make_plane(policy=FUZZ_POLICY, clock=lambda: FIXED_NOW)
    active = lease_in_phase(plane, "active", "r-active", now=1_000, agent_id="agent-a")
    admitted = lease_in_phase(plane, "admitted", "r-admitted", now=1_100, agent_id="agent-b")
    starting = lease_in_phase(plane, "starting", "r-starting", now=1_200, agent_id="agent-f")
    enqueue(plane, "q-1", agent_id="agent-c", now=1_400)
    enqueue(plane, "q-2", agent_id="agent-d", now=1_401)
    plane.enqueue(
        request_id="q-bare",
        session_id="session-1",
        agent_id="agent-e",
        fingerprint="fingerprint-1",
        provider="antigravity",
        model="model-test",
        now=1_402,
    )
    return PlaneState(database, plane, active, admitted, starting)


def judge(state: PlaneState, call: Call, arguments: dict[str, Any], kind: str) -> None:
    """Run ``call`` once and hold it to the contract (see the module docstring)."""
    before = snapshot(state.database)
    result, error = attempt(call.run, state.plane, arguments)
    if error is not None:
        assert_documented(error, kind)
        if not isinstance(error, call.writes_when):
            assert snapshot(state.database) == before, f"refused with {type(error).__name__} after writing: {error}"
        return
    assert isinstance(result, call.returns), f"returned {type(result).__name__}, not {call.returns}"
    if kind == "wrong":
        assert call.refuses_by_result, f"a value the argument must refuse was accepted (returned {result!r:.200})"
        assert result.reason == "invalid_process_identity", result
    if not call.writes or call.unchanged_when(result):
        assert snapshot(state.database) == before, f"the database changed although the call returned {result!r:.200}"


def fuzz(state: PlaneState, call: Call, max_examples: int) -> None:
    """``max_examples`` calls, each with one argument (drawn in turn) hostile and every other one valid."""

    @settings(max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(hostile_targets(call.args)), label="hostile argument")
        arguments, kind = draw_arguments(data, call.args, target)
        judge(state, call, arguments, kind)

    check()


CALLS = sorted(operations(PlaneState.placeholder()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("name", CALLS)
def test_a_hostile_argument_gets_a_documented_answer_and_a_refusal_writes_nothing(
    make_plane: PlaneFactory, database_url: str, name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With one argument hostile and the others valid, every call on SQLite succeeds as documented or raises an
    AdmissionError (InvalidInputError for a value it must refuse), and a refused call leaves every table unchanged."""
    monkeypatch.chdir(tmp_path)  # relative paths a call may create land here
    state = planted(make_plane, database_url)
    fuzz(state, operations(state)[name], SQLITE_EXAMPLES)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("database_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
@pytest.mark.parametrize("name", POSTGRES_CALLS)
def test_on_postgresql_too_a_hostile_argument_gets_a_documented_answer(
    make_plane: PlaneFactory, database_url: str, name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same contract holds on PostgreSQL for one call of each kind (fewer examples)."""
    monkeypatch.chdir(tmp_path)
    state = planted(make_plane, database_url)
    fuzz(state, operations(state)[name], POSTGRES_EXAMPLES)


def test_the_planted_state_is_what_the_fuzz_expects(make_plane: PlaneFactory, database_url: str) -> None:
    """The fuzzed plane holds an active, an admitted and a starting lease and three queued requests, one without a
    payload, and the fuzz's snapshot of it is dbutil.table_dump's."""
    state = planted(make_plane, database_url)
    assert snapshot(database_url) == table_dump(database_url)
    phases = sorted(str(dispatch.phase) for dispatch in state.plane.list_recoverable_dispatches())
    assert phases == ["active", "admitted", "starting"]
    assert sorted(owner.request_id for owner in state.plane.list_recoverable_queued_owners()) == [
        "q-1",
        "q-2",
        "q-bare",
    ]


# --- migrations ---------------------------------------------------------------------------------------------------

NOT_A_TARGET = st.one_of(
    OTHER_TYPES.filter(lambda value: not isinstance(value, os.PathLike)),
    NOT_TEXT.filter(lambda value: not isinstance(value, os.PathLike)),
    st.sampled_from(
        [
            "",
            ":memory:",
            "a\0b",
            "\ud800",
            "x\udcff",
            "sqlite:///:memory:",
            "sqlite:///a\0b",
            b"x.sqlite",
            "postgresql://\ud800/x",
            "mysql://u@h/db",
            "://",
        ]
    ),
)
ODD_TARGET = st.one_of(
    ODD_TEXT.filter(lambda text: not text.startswith("/dev")),
    st.sampled_from(
        [
            "missing.sqlite",
            "/nonexistent-dir/x.sqlite",
            "/",
            HUGE,
            Path("other.sqlite"),
            "postgresql+psycopg://postgres@127.0.0.1:1/test",
        ]
    ),
)
NOT_A_REVISION = st.one_of(NOT_TEXT, BAD_IDENTIFIER_TEXT)
ODD_REVISION = st.one_of(ODD_TEXT, st.sampled_from(["@", "head+1", "+1", "-1", "x@y", "base", "heads", "ffff"]))


def migration_calls(database: str) -> dict[str, Call]:
    """``migrate.upgrade`` (target and revision), ``current_revision`` and ``downgrade`` (a revision it refuses)."""
    target = Arg(st.just(database), wrong=NOT_A_TARGET, odd=ODD_TARGET)
    return {
        "upgrade": Call(
            {"target": target, "revision": Arg(st.just("head"), wrong=NOT_A_REVISION, odd=ODD_REVISION)},
            lambda _plane, arguments: migrate.upgrade(**arguments),
            type(None),
            writes=False,  # the planted database is at head already
        ),
        "current_revision": Call(
            {"target": target},
            lambda _plane, arguments: migrate.current_revision(**arguments),
            (str, type(None)),
            writes=False,
        ),
        "downgrade": Call(
            {"target": Arg(st.just(database)), "revision": Arg(st.just("head"), wrong=NOT_A_REVISION)},
            lambda _plane, arguments: migrate.downgrade(**arguments),
            type(None),
            writes=False,
        ),
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("name", ["upgrade", "current_revision", "downgrade"])
def test_migration_entry_points_refuse_hostile_targets_and_revisions(
    make_plane: PlaneFactory, database_url: str, name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """migrate.upgrade, current_revision and downgrade answer a hostile target or revision with an AdmissionError
    (InvalidInputError for one that is not a path or identifier), leaving the migrated database as it was."""
    monkeypatch.chdir(tmp_path)
    state = planted(make_plane, database_url)
    fuzz(state, migration_calls(database_url)[name], SQLITE_EXAMPLES)


# --- the command line -----------------------------------------------------------------------------------------------

SLOT = object()
NUMBER_TEXT = st.sampled_from(
    [
        "-1",
        "0",
        "-0",
        "nan",
        "inf",
        "-inf",
        "1e308",
        str(2**63),
        str(2**64),
        str(MAX_SAFE + 1),
        "０",
        "٣",
        " 5",
        "5 ",
        "0x10",
        "1_000",
        "65",
        "1001",
        "3",
    ]
)
#: Tokens that would make a valid command run for good (``events --follow``) or print help instead.
_ENDLESS = ("-f", "--f", "-h", "--h")
TOKEN = st.one_of(BAD_IDENTIFIER_TEXT, ODD_TEXT, NUMBER_TEXT).filter(lambda text: not text.startswith(_ENDLESS))
NOT_A_TOKEN = st.sampled_from([None, b"status", 5, 1.5, ["status"], Path("x")])


def command_lines(database: str, missing: str) -> list[list[Any]]:
    """Argument vectors of every command with one slot for a hostile token."""
    return [
        ["status", "--db", SLOT],
        ["status", "--json", "--db", database, SLOT],
        ["events", "--db", database, "--after", SLOT],
        ["events", "--db", database, "--limit", SLOT],
        ["events", "--db", database, "--interval", SLOT],
        ["db", "current", "--db", SLOT],
        ["db", "upgrade", SLOT, "--db", database],
        ["db", "downgrade", SLOT, "--db", missing],
        ["release", SLOT, "--yes", "--db", database],
        ["reap", "--db", database, "--key-file", SLOT],
        ["keys", "init", "--key-file", SLOT],
        [SLOT],
        ["db", SLOT],
        ["keys", SLOT],
        ["demo", "--agents", SLOT, "--db", missing],
        ["demo", "--turns", SLOT, "--db", missing],
        ["demo", "--models", SLOT, "--db", missing],
        ["demo", "--seats", SLOT, "--db", missing],
    ]


def run_cli(argv: list[Any]) -> tuple[object, str]:
    """``main(argv)``'s exit status (argparse's ``SystemExit`` code included) and what it wrote on stderr."""
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        try:
            status: object = main(argv)
        except SystemExit as exited:
            status = exited.code
    return status, err.getvalue()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_command_line_answers_hostile_arguments_in_one_line(
    make_plane: PlaneFactory, database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """admission-plane with one hostile argument exits 0, or 1 or 2 with exactly one `admission-plane: error:` line on
    stderr and no traceback, and a failed command leaves the database unchanged."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv(DATABASE_URL_VARIABLE, raising=False)
    monkeypatch.setenv(ENCRYPTION_KEY_VARIABLE, "11" * 32)
    monkeypatch.setenv(CONTENT_KEY_VARIABLE, "22" * 32)
    state = planted(make_plane, database_url)
    lines = command_lines(database_url, str(tmp_path / "missing-dir" / "plane.sqlite"))

    @settings(max_examples=SQLITE_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(line=st.sampled_from(lines), token=st.one_of(TOKEN, NOT_A_TOKEN))
    def check(line: list[Any], token: Any) -> None:
        argv = [token if part is SLOT else part for part in line]
        before = snapshot(database_url)
        status, err = run_cli(argv)
        assert "Traceback" not in err, err
        if not isinstance(token, str):
            assert (status, err) == (2, "admission-plane: error: arguments must be a sequence of strings\n")
        if status == 0:
            return
        assert status in (1, 2), (status, err)
        assert len(err.splitlines()) == 1, err
        assert err.startswith("admission-plane: error: "), err
        assert snapshot(database_url) == before

    check()
    assert state.plane.get_request("q-1") is not None


# --- regressions: one concrete example per defect the fuzz found ------------------------------------------------


def test_a_negative_persistence_time_is_refused_before_the_payload_is_written(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """persist_payload with a negative now raises InvalidInputError and stores no payload (it used to store one)."""
    state = planted(make_plane, database_url)
    before = snapshot(database_url)
    with pytest.raises(InvalidInputError, match="payload persistence timestamp"):
        state.plane.persist_payload("q-bare", "prompt", -5, 10)
    assert snapshot(database_url) == before


def test_a_negative_cooldown_time_is_refused_before_the_cooldown_is_written(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """set_capacity_cooldown with a negative now raises InvalidInputError and writes no cooldown (it used to)."""
    state = planted(make_plane, database_url)
    before = snapshot(database_url)
    with pytest.raises(InvalidInputError, match="capacity cooldown timestamp"):
        state.plane.set_capacity_cooldown("antigravity", "model-test", -1, -5)
    assert snapshot(database_url) == before


@pytest.mark.timeout(30)
@pytest.mark.parametrize("count", [1_001, MAX_SAFE, 2**40])
def test_a_huge_untrusted_row_count_is_refused_at_once(make_plane: PlaneFactory, database_url: str, count: int) -> None:
    """record_untrusted_recovery_rows refuses a count above 1000 with InvalidInputError instead of journalling events
    in one transaction for ever."""
    state = planted(make_plane, database_url)
    before = snapshot(database_url)
    with pytest.raises(InvalidInputError, match="untrusted recovery row count"):
        state.plane.record_untrusted_recovery_rows(count, FIXED_NOW)
    assert snapshot(database_url) == before


@pytest.mark.parametrize(
    "readers",
    [b"readers", "readers", 5, object()],
    # Stable ids (an object's repr names its address, which differs between pytest-xdist workers).
    ids=lambda value: type(value).__name__ if type(value) is object else repr(value),
)
def test_readers_that_are_not_readers_are_refused_before_the_reaper_reads(
    make_plane: PlaneFactory, database_url: str, readers: object
) -> None:
    """reap_suspects with readers lacking read_file and read_link raises InvalidInputError (it raised AttributeError)
    and marks nothing suspect."""
    state = planted(make_plane, database_url)
    before = snapshot(database_url)
    with pytest.raises(InvalidInputError, match="process readers"):
        state.plane.reap_suspects(FIXED_NOW, readers)  # type: ignore[arg-type]
    assert snapshot(database_url) == before


@pytest.mark.parametrize(
    "database",
    [
        None,
        5,
        b"plane.sqlite",
        ["plane.sqlite"],
        "a\0b",
        "\ud800",
        "x\udcff.sqlite",
        "postgresql://\ud800/db",
        "postgresql+psycopg://u@h/db?application_name=\ud800",
    ],
    ids=repr,
)
def test_a_database_that_is_no_path_or_url_is_an_invalid_input(
    database: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AdmissionPlane, migrate.upgrade and current_revision refuse a database argument that is not a str, PathLike or
    URL, or holds a NUL or lone surrogate, with InvalidInputError (they raised TypeError, ValueError, UnicodeError)."""
    monkeypatch.chdir(tmp_path)
    for call in (
        lambda: AdmissionPlane(database, migrate=True),
        lambda: migrate.upgrade(database),
        lambda: migrate.current_revision(database),
    ):
        with pytest.raises(InvalidInputError, match="database"):
            call()
    assert list(tmp_path.iterdir()) == []


def test_a_query_parameter_the_driver_cannot_convert_is_an_invalid_url(database_url: str) -> None:
    """An SQLite URL whose ?timeout= is not a number raises InvalidInputError on open (it raised ValueError)."""
    if is_postgres(database_url):
        pytest.skip("an SQLite URL parameter")
    with pytest.raises(InvalidInputError, match="invalid database URL"):
        AdmissionPlane(f"sqlite:///{database_url}?timeout=soon")


@pytest.mark.parametrize(
    ("revision", "error"),
    [
        (None, InvalidInputError),
        (1, InvalidInputError),
        (b"head", InvalidInputError),
        ("", InvalidInputError),
        (" head", InvalidInputError),
        ("@", AdmissionMigrationError),
        ("head+1", AdmissionMigrationError),
        ("no-such-revision", AdmissionMigrationError),
    ],
    ids=repr,
)
def test_a_revision_alembic_cannot_take_is_a_documented_error(
    database_url: str, revision: object, error: type[AdmissionError]
) -> None:
    """upgrade and downgrade with a non-identifier revision raise InvalidInputError, and with one Alembic cannot
    resolve AdmissionMigrationError (they raised TypeError, AssertionError or CommandError), changing nothing."""
    before = snapshot(database_url)
    for call in (migrate.upgrade, migrate.downgrade):
        with pytest.raises(error):
            call(database_url, revision)  # type: ignore[arg-type]
    assert snapshot(database_url) == before


def test_a_plane_clock_that_is_not_callable_or_returns_no_timestamp_is_refused(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """AdmissionPlane refuses a clock that cannot be called, and waiting on one that returns NaN raises
    InvalidInputError (both raised TypeError the first time the plane waited)."""
    with pytest.raises(InvalidInputError, match="plane clock"):
        make_plane(clock=None)
    plane = make_plane(clock=lambda: float("nan"))
    with pytest.raises(InvalidInputError, match="plane clock reading"):
        plane.wait_for_admission("absent", plane.owner_identity.owner_instance_id, timeout_ms=0)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("request_id", None),
        ("session_id", " padded"),
        ("agent_id", "x" * 257),
        ("provider", "a\0b"),
        ("model", "\ud800"),
        ("fingerprint", ""),
        ("prompt", "\ud800"),
        ("command", "echo hi"),
        ("command", [1]),
        ("command", ["a\0b"]),
        ("command", []),
        ("heartbeat_interval_ms", 2**31),
        ("payload_grace_ms", 2**53),
    ],
    ids=repr,
)
def test_a_turn_refuses_bad_metadata_and_commands_on_construction(
    make_plane: PlaneFactory, database_url: str, option: str, value: object
) -> None:
    """plane.turn() refuses request metadata enqueue would refuse, a prompt with a lone surrogate, a command that is
    not a list of strings and an interval a timer cannot wait, with InvalidInputError before anything is enqueued (a
    bad command used to fail with TypeError only after admission)."""
    plane = make_plane()
    before = snapshot(database_url)
    options: dict[str, Any] = {
        "request_id": "t-1",
        "session_id": "s",
        "agent_id": "a",
        "provider": "p",
        "model": "m",
        "prompt": "hello",
        "command": ["true"],
        option: value,
    }
    with pytest.raises(InvalidInputError):
        plane.turn(**options)
    assert snapshot(database_url) == before


@pytest.mark.parametrize("argv", [[None], ["status", b"x"], "status", [5]], ids=repr)
def test_arguments_that_are_not_strings_fail_in_one_line(argv: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """main() with arguments that are not strings returns 2 with one error line (it raised TypeError)."""
    assert main(argv) == 2
    assert capsys.readouterr().err == "admission-plane: error: arguments must be a sequence of strings\n"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("flag", "value"), [("--agents", str(2**63)), ("--agents", "65"), ("--turns", "1001")])
def test_the_demo_refuses_sizes_it_cannot_plan(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """demo --agents 2**63 exits 2 with one error line at once (it built its plan for ever)."""
    with pytest.raises(SystemExit) as exited:
        main(["demo", flag, value, "--db", "/nonexistent-dir/plane.sqlite"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"admission-plane: error: argument {flag}: must be at most")
    assert err.count("\n") == 1


def test_argparse_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """An argument argparse refuses exits 2 with one `admission-plane: error:` line instead of a usage block."""
    with pytest.raises(SystemExit) as exited:
        main(["events", "--limit", "many"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "admission-plane: error: argument --limit: 'many' is not an integer (see `admission-plane events --help`)\n"
    )
