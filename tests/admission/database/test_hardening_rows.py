"""Hardening against an untrusted database and bad options: the writer-gate file, URLs shown, rows that
cannot be trusted, and timing arguments, on real databases."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dbutil import execute, is_postgres
from planes import admit, enqueue
from sqlalchemy.engine import make_url

from admission_plane import AdmissionPlane, Lane, Policy, RequestState
from admission_plane.cli import main
from admission_plane.errors import (
    AdmissionDatabaseError,
    AdmissionError,
    AdmissionRuntimeError,
    InvalidInputError,
    PayloadIntegrityError,
    RecoverableDispatchInventoryError,
    SchemaIntegrityError,
)
from admission_plane.keys import CONTENT_KEY_VARIABLE, ENCRYPTION_KEY_VARIABLE

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
PRECIOUS = b"do not overwrite these bytes: they belong to someone else\n"
PASSWORD = "hunter2-never-shown"
OWNER = "owner-1"


# --- 10: the writer-gate file ----------------------------------------------------------------------


@SQLITE_ONLY
def test_a_plane_refuses_a_writer_lock_that_is_a_symbolic_link(
    make_plane: Callable[..., AdmissionPlane], database_url: str, tmp_path: Path
) -> None:
    """Opening a plane whose ``-writer.lock`` is a symbolic link raises AdmissionDatabaseError and never writes the
    target."""
    target = tmp_path / "victim"
    target.write_bytes(PRECIOUS)
    Path(f"{database_url}-writer.lock").symlink_to(target)
    with pytest.raises(AdmissionDatabaseError, match="not a regular file"):
        make_plane()
    assert target.read_bytes() == PRECIOUS


@SQLITE_ONLY
def test_a_writer_refuses_a_lock_file_swapped_for_a_symbolic_link(
    plane: AdmissionPlane, database_url: str, tmp_path: Path
) -> None:
    """A write after the lock file was replaced by a link raises AdmissionDatabaseError, commits nothing and leaves the
    target's bytes unchanged."""
    target = tmp_path / "victim"
    target.write_bytes(PRECIOUS)
    lock = Path(f"{database_url}-writer.lock")
    lock.unlink()
    lock.symlink_to(target)
    with pytest.raises(AdmissionDatabaseError, match="not a regular file"):
        enqueue(plane, "r1")
    assert plane.get_request("r1") is None
    assert target.read_bytes() == PRECIOUS


# --- 12: URLs shown -------------------------------------------------------------------------------


def url_with_passwords(database_url: str) -> str:
    """``database_url`` carrying a password in its query string (and, for a server, in its userinfo too)."""
    if not is_postgres(database_url):
        return f"sqlite:///{database_url}?password={PASSWORD}"
    url = make_url(database_url).set(password=PASSWORD).update_query_dict({"password": PASSWORD})
    return url.render_as_string(hide_password=False)


@pytest.mark.filterwarnings("ignore:Query string argument:sqlalchemy.exc.SAWarning")
def test_the_repr_of_a_plane_masks_every_password(make_plane: Callable[..., AdmissionPlane], database_url: str) -> None:
    """repr(AdmissionPlane) shows the database URL with its userinfo and query-string passwords masked."""
    plane = make_plane(database=url_with_passwords(database_url))
    shown = repr(plane)
    assert PASSWORD not in shown
    assert "password=***" in shown


@pytest.mark.filterwarnings("ignore:Query string argument:sqlalchemy.exc.SAWarning")
@pytest.mark.parametrize("command", [["db", "upgrade"], ["db", "current"], ["db", "check"]], ids=" ".join)
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_db_commands_never_print_a_password(
    database_url: str,
    command: list[str],
    as_json: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The ``db`` commands name the database without any password, in text and in JSON."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(ENCRYPTION_KEY_VARIABLE, "11" * 32)
    monkeypatch.setenv(CONTENT_KEY_VARIABLE, "22" * 32)
    status = main([*command, "--db", url_with_passwords(database_url), *(["--json"] if as_json else [])])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert PASSWORD not in captured.out + captured.err
    if as_json and command != ["db", "current"]:
        assert PASSWORD not in json.loads(captured.out)["database"]


# --- 13: rows that cannot be trusted ----------------------------------------------------------------


def read_payload(plane: AdmissionPlane, _lease: Any) -> object:
    return plane.read_payload("r1", 1_002)


def get_request(plane: AdmissionPlane, _lease: Any) -> object:
    return plane.get_request("r1")


def admit_next(plane: AdmissionPlane, _lease: Any) -> object:
    return plane.admit_next(1_001, OWNER)


def queue_snapshot(plane: AdmissionPlane, _lease: Any) -> object:
    return plane.get_queue_snapshot("r1", 1_001)


def mark_starting(plane: AdmissionPlane, lease: Any) -> object:
    return plane.mark_starting(lease, 1_002)


def list_recoverable_dispatches(plane: AdmissionPlane, _lease: Any) -> object:
    return plane.list_recoverable_dispatches()


#: name -> (admit before corrupting?, the corruption, the public call, the error it must raise)
CORRUPT_ROWS: dict[str, tuple[bool, str, Callable[[AdmissionPlane, Any], object], type[AdmissionError]]] = {
    "nonce as text": (False, "UPDATE turn_payloads SET nonce = 'abc'", read_payload, PayloadIntegrityError),
    "ciphertext as text": (False, "UPDATE turn_payloads SET ciphertext = 'abc'", read_payload, PayloadIntegrityError),
    "auth tag as text": (False, "UPDATE turn_payloads SET auth_tag = 'abc'", read_payload, PayloadIntegrityError),
    "payload expiry as text": (False, "UPDATE turn_payloads SET expires_at = 'later'", read_payload,
                               PayloadIntegrityError),
    "unknown request state": (False, "UPDATE turn_requests SET state = 'paused'", get_request, SchemaIntegrityError),
    "enqueue time as text": (False, "UPDATE turn_requests SET enqueued_at = 'noon'", get_request,
                             SchemaIntegrityError),
    "generation as text, admitting": (False, "UPDATE turn_requests SET lease_generation = 'one'", admit_next,
                                      SchemaIntegrityError),
    "fractional generation, admitting": (False, "UPDATE turn_requests SET lease_generation = 1.5", admit_next,
                                         SchemaIntegrityError),
    "enqueue time as text, snapshot": (False, "UPDATE turn_requests SET enqueued_at = 'noon'", queue_snapshot,
                                       SchemaIntegrityError),
    "lease generation as text, starting": (True, "UPDATE leases SET generation = 'one'", mark_starting,
                                           SchemaIntegrityError),
    "unknown lease phase, starting": (True, "UPDATE leases SET phase = 'paused'", mark_starting,
                                      SchemaIntegrityError),
    "lease generation as text, inventory": (True, "UPDATE leases SET generation = 'one'",
                                            list_recoverable_dispatches, RecoverableDispatchInventoryError),
}  # fmt: skip


@SQLITE_ONLY
@pytest.mark.parametrize("case", CORRUPT_ROWS)
def test_a_row_with_the_wrong_storage_type_raises_the_documented_error(
    plane: AdmissionPlane, database_url: str, case: str
) -> None:
    """A stored value of the wrong type or an unknown state makes the public call raise its documented error, never a
    raw TypeError or ValueError."""
    admit_first, corruption, call, error = CORRUPT_ROWS[case]
    enqueue(plane, "r1", now=1_000)
    lease = admit(plane, 1_001) if admit_first else None
    execute(database_url, corruption, foreign_keys=False)
    with pytest.raises(error) as raised:
        call(plane, lease)
    assert "r1" not in str(raised.value)


#: Policy v2 rows (revision 0006): name -> (the corruption, the public call, the error it must raise).
CORRUPT_POLICY_V2_ROWS: dict[str, tuple[str, Callable[[AdmissionPlane], object], type[AdmissionError]]] = {
    "index key head as text": ("UPDATE queue_keys SET head_enqueued_at = 'noon'", lambda p: p.admit_next(20_000, OWNER),
                               SchemaIntegrityError),
    "index agent head as text": ("UPDATE queue_agents SET head_enqueued_at = 'noon'",
                                 lambda p: p.admit_next(20_000, OWNER), SchemaIntegrityError),
    "index entry lane as a blob": ("UPDATE queue_entries SET lane = x'00'", lambda p: p.admit_next(20_000, OWNER),
                                   SchemaIntegrityError),
    "lane credits as text": ("UPDATE lane_credits SET credits = 'many'", lambda p: p.admit_next(20_000, OWNER),
                             SchemaIntegrityError),
    "revision document not a policy": ("UPDATE policy_revisions SET document = 'garbage'",
                                       lambda p: p.admit_next(20_000, OWNER), AdmissionRuntimeError),
    "revision document not a policy, shown": ("UPDATE policy_revisions SET document = '{}x'",
                                              lambda p: p.current_policy(), AdmissionRuntimeError),
    "revision number as text": ("UPDATE policy_state SET revision = 'one'", lambda p: p.current_policy(),
                                AdmissionRuntimeError),
    "pause time as text": ("INSERT INTO admission_pauses VALUES ('', 'p', 'm', 'x')", lambda p: p.pauses(),
                           SchemaIntegrityError),
    "pause time as text, admitting": ("INSERT INTO admission_pauses VALUES ('', 'p', 'm', 'x')",
                                      lambda p: p.admit_next(20_000, OWNER), SchemaIntegrityError),
}  # fmt: skip


@SQLITE_ONLY
@pytest.mark.parametrize("case", CORRUPT_POLICY_V2_ROWS)
def test_a_policy_v2_row_with_the_wrong_storage_type_raises_the_documented_error(
    plane: AdmissionPlane, database_url: str, case: str
) -> None:
    """A corrupted admission index, lane credit, policy revision or pause row makes admission (or the reading call)
    raise its documented error, never a raw TypeError or ValueError, and names no request."""
    corruption, call, error = CORRUPT_POLICY_V2_ROWS[case]
    lanes = (Lane("a"), Lane("b"))
    plane.set_policy(Policy(8, 8, 2_000, 1_800_000, 30_000, lanes=lanes), now=1)
    for n, lane in enumerate("abab"):
        enqueue(plane, f"r{n}", agent_id=f"agent-{n}", now=10 + n, lane=lane)
    plane.abandon_before_prompt(admit(plane, 5_000), 5_001, "cancelled")  # lanes competed: credits are stored
    admit(plane, 10_000)
    execute(database_url, corruption, foreign_keys=False)
    with pytest.raises(error) as raised:
        call(plane)
    assert not any(f"r{n}" in str(raised.value) for n in range(4))


# --- 14: timing arguments ---------------------------------------------------------------------------

BAD_WAITS: list[tuple[str, object]] = [
    *((name, value) for name in ("initial_delay_ms", "max_delay_ms")
      for value in (math.nan, math.inf, -math.inf, -1, 0, True, "4")),
    *(("timeout_ms", value) for value in (math.nan, math.inf, -1, 1.5)),
    *(("fallback_ms", value) for value in (math.nan, math.inf, -1, 0)),
    ("sleep", None), ("sleep", "time.sleep"), ("on_wait", 5),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), BAD_WAITS, ids=repr)
def test_wait_for_admission_refuses_bad_timing_arguments_before_looking(
    plane: AdmissionPlane, name: str, value: object
) -> None:
    """A NaN, infinite, negative or zero delay, or a sleep/on_wait that cannot be called, raises InvalidInputError and
    admits nothing."""
    enqueue(plane, "r1", now=1_000)
    options: dict[str, Any] = {"sleep": lambda _seconds: None, name: value}
    with pytest.raises(InvalidInputError):
        plane.wait_for_admission("r1", OWNER, **options)
    stored = plane.get_request("r1")
    assert stored is not None
    assert stored.state is RequestState.QUEUED


BAD_TURN_OPTIONS: list[tuple[str, object]] = [
    *(("wait_timeout_ms", value) for value in (math.nan, math.inf, -1, 1.5, True)),
    *(("start_timeout_ms", value) for value in (math.nan, math.inf, -math.inf, -1, 1.5, True)),
    *(("heartbeat_interval_ms", value) for value in (math.nan, math.inf, 0)),
    ("clock", 5), ("sleep", "later"), ("progress", 5),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), BAD_TURN_OPTIONS, ids=repr)
def test_a_turn_refuses_bad_duration_and_callable_options_before_enqueueing(
    plane: AdmissionPlane, name: str, value: object
) -> None:
    """plane.turn(...) with a NaN, infinite, negative or fractional duration, or a non-callable hook, raises
    InvalidInputError and enqueues nothing."""
    options: dict[str, Any] = {
        "request_id": "r1",
        "session_id": "session-1",
        "agent_id": "agent-a",
        "provider": "p",
        "model": "m",
        "prompt": "hello",
        "command": ["true"],
        name: value,
    }
    with pytest.raises(InvalidInputError):
        plane.turn(**options)
    assert plane.get_request("r1") is None
