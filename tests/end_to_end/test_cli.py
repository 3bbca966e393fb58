"""The ``admission-plane`` command line, run as a subprocess against real databases, from outside the source tree."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from admission_plane import AdmissionPlane, Budget, ConnectorIdentity, DispatchRecord, Policy
from admission_plane.evidence import capture
from admission_plane.keys import CONTENT_KEY_VARIABLE, ENCRYPTION_KEY_VARIABLE
from admission_plane.service import wall_clock_ms

ENCRYPTION_HEX = "11" * 32
CONTENT_HEX = "22" * 32
POLICY = Policy(3, 3, 0, 600_000, 30_000)
#: A live revision with a per-minute budget of one model and a five-hour token budget of its provider.
BUDGETED = Policy(
    3,
    3,
    2_000,
    600_000,
    30_000,
    budgets=(
        Budget("p", "m", window_ms=60_000, max_requests=60, max_tokens=150_000),
        Budget("p", window_ms=5 * 3_600_000, max_tokens=2_000_000),
    ),
)
CLI = [sys.executable, "-m", "admission_plane"]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty directory outside the source tree: commands must not depend on the current directory."""
    directory = tmp_path / "elsewhere"
    directory.mkdir()
    return directory


@pytest.fixture
def environment(tmp_path: Path) -> dict[str, str]:
    """A private state directory and no keys in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADMISSION_PLANE_") or k.endswith("POSTGRES_URL")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return env


def cli(workdir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m admission_plane ARGS`` in ``workdir``."""
    return subprocess.run([*CLI, *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=60, check=False)


def assert_one_line_error(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    """A non-zero exit with exactly one ``admission-plane: error:`` line and no traceback."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("admission-plane: error: ")
    assert fragment in lines[0]


def keyed(env: dict[str, str]) -> dict[str, str]:
    """``env`` with both keys set."""
    return {**env, ENCRYPTION_KEY_VARIABLE: ENCRYPTION_HEX, CONTENT_KEY_VARIABLE: CONTENT_HEX}


@pytest.fixture
def migrated(workdir: Path, environment: dict[str, str]) -> str:
    """An SQLite file upgraded to head through the command line."""
    database = str(workdir / "plane.sqlite")
    result = cli(workdir, keyed(environment), "db", "upgrade", "--db", database)
    assert result.returncode == 0, result.stderr
    return database


@pytest.fixture
def plane(migrated: str) -> Iterator[AdmissionPlane]:
    """An in-process plane on the migrated file, with the same keys the commands use."""
    with AdmissionPlane(
        migrated,
        policy=POLICY,
        encryption_key=bytes.fromhex(ENCRYPTION_HEX),
        content_fingerprint_key=bytes.fromhex(CONTENT_HEX),
    ) as opened:
        yield opened


def enqueue(
    plane: AdmissionPlane, request_id: str, now: int, model: str = "m", estimated_tokens: int | None = None
) -> None:
    """Queue ``request_id`` with a payload (and, if given, its token estimate)."""
    plane.enqueue_with_payload(
        request_id=request_id,
        session_id="s",
        agent_id=f"agent-{request_id}",
        fingerprint="f",
        provider="p",
        model=model,
        now=now,
        plaintext="secret prompt",
        expires_at=now + 700_000,
        estimated_tokens=estimated_tokens,
    )


# --- help and the console script -------------------------------------------------------------------

COMMANDS = [
    [],
    ["db"],
    ["db", "upgrade"],
    ["db", "downgrade"],
    ["db", "current"],
    ["db", "check"],
    ["keys"],
    ["keys", "init"],
    ["status"],
    ["events"],
    ["reap"],
    ["release"],
    ["demo"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "top")
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` works for every command and subcommand and exits 0 (in-process: argparse only)."""
    from admission_plane.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: admission-plane" in capsys.readouterr().out


def test_console_script_is_installed(workdir: Path, environment: dict[str, str]) -> None:
    """The ``admission-plane`` console script runs the same command line."""
    script = Path(sys.executable).parent / "admission-plane"
    assert script.exists()
    result = subprocess.run(
        [str(script), "--help"], cwd=workdir, env=environment, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0
    assert "db" in result.stdout


# --- db ----------------------------------------------------------------------------------------------


def test_db_upgrade_current_check_downgrade_round_trip(workdir: Path, environment: dict[str, str]) -> None:
    """From any directory, upgrade reaches head, check passes, downgrade to base empties, current follows."""
    env = keyed(environment)
    database = str(workdir / "x.sqlite")
    assert cli(workdir, env, "db", "upgrade", "--db", database).returncode == 0
    current = json.loads(cli(workdir, env, "db", "current", "--db", database, "--json").stdout)
    assert current["revision"] == current["head"]
    assert json.loads(cli(workdir, env, "db", "check", "--db", database, "--json").stdout)["ok"] is True
    assert cli(workdir, env, "db", "downgrade", "base", "--db", database).returncode == 0
    assert json.loads(cli(workdir, env, "db", "current", "--db", database, "--json").stdout)["revision"] is None
    assert cli(workdir, env, "db", "upgrade", "--db", database).returncode == 0


def test_db_check_reports_a_database_behind_head_with_status_1(
    migrated: str, workdir: Path, environment: dict[str, str]
) -> None:
    """A database one revision behind head fails ``db check`` with one line and exit status 1."""
    assert cli(workdir, environment, "db", "downgrade", "-1", "--db", migrated).returncode == 0
    result = cli(workdir, environment, "db", "check", "--db", migrated)
    assert_one_line_error(result, "not up to date")
    assert result.returncode == 1


def test_db_upgrade_uses_the_state_directory_and_creates_a_private_key_file(
    workdir: Path, environment: dict[str, str], tmp_path: Path
) -> None:
    """Without --db and keys, upgrade creates the state directory's database and a 0600 key file it never prints."""
    result = cli(workdir, environment, "db", "upgrade")
    assert result.returncode == 0, result.stderr
    state = tmp_path / "state" / "admission-plane"
    assert (state / "admission.sqlite").exists()
    key_file = state / "keys"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    for line in key_file.read_text().splitlines():
        assert line.split("=", 1)[1] not in result.stdout + result.stderr
    assert cli(workdir, environment, "reap").returncode == 0


@pytest.mark.postgres
def test_db_and_status_commands_work_on_postgresql(
    postgres_url: str, workdir: Path, environment: dict[str, str]
) -> None:
    """The same commands migrate, check and inspect a PostgreSQL database."""
    env = keyed(environment)
    assert cli(workdir, env, "db", "upgrade", "--db", postgres_url).returncode == 0
    assert cli(workdir, env, "db", "check", "--db", postgres_url).returncode == 0
    status = json.loads(cli(workdir, env, "status", "--db", postgres_url, "--json").stdout)
    assert status["queue_depth"] == 0
    assert status["budgets"] == []
    with AdmissionPlane(
        postgres_url,
        policy=POLICY,
        encryption_key=bytes.fromhex(ENCRYPTION_HEX),
        content_fingerprint_key=bytes.fromhex(CONTENT_HEX),
    ) as plane:
        plane.set_policy(BUDGETED)
        plane.record_external_usage("p", "m", requests=2, tokens=700)
    status = json.loads(cli(workdir, env, "status", "--db", postgres_url, "--json").stdout)
    assert [(w["model"], w["requests"], w["used_tokens"]) for w in status["budgets"]] == [("m", 2, 700), (None, 2, 700)]
    assert cli(workdir, env, "reap", "--db", postgres_url).returncode == 0
    assert "password" not in cli(workdir, env, "db", "current", "--db", postgres_url).stdout


# --- status, events, reap ----------------------------------------------------------------------------


def test_status_reports_queue_seats_leases_and_cooldowns(
    plane: AdmissionPlane, migrated: str, workdir: Path, environment: dict[str, str]
) -> None:
    """``status --json`` counts queued requests, seats by phase and active cooldowns, without identifiers."""
    now = wall_clock_ms()
    enqueue(plane, "r-1", now - 5_000)
    enqueue(plane, "r-2", now - 4_000)
    plane.admit_next(now - 3_000, plane.owner_identity.owner_instance_id)
    plane.set_capacity_cooldown("p", "cool-model", now + 60_000, now)
    result = cli(workdir, environment, "status", "--db", migrated, "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["queue_depth"] == 1
    assert status["oldest_wait_ms"] >= 4_000
    assert status["seats_in_use"] == 1
    assert status["leases_by_phase"] == {"admitted": 1}
    assert [c["model"] for c in status["cooldowns"]] == ["cool-model"]
    assert status["drain_state"] is None
    text = cli(workdir, environment, "status", "--db", migrated).stdout
    assert "seats in use     1 of 8" in text
    assert "r-1" not in text + result.stdout
    assert "agent-r-1" not in text + result.stdout


def test_status_reports_each_budget_window_of_the_live_policy(
    plane: AdmissionPlane, migrated: str, workdir: Path, environment: dict[str, str]
) -> None:
    """``status`` shows every budget window of the live policy, in text and JSON: its key (a model, or all models
    of the provider), window, requests and tokens (reserved, used) against the limits, what is left and the next
    reset; ``policy show`` lists the budgets. Neither names a request, session or agent."""
    plane.set_policy(BUDGETED)
    now = wall_clock_ms()
    enqueue(plane, "r-budget", now - 2_000, estimated_tokens=2_000)
    assert plane.admit_next(now - 1_000, plane.owner_identity.owner_instance_id) is not None
    plane.record_external_usage("p", "other-model", requests=1, tokens=1_200, now=now - 500)  # the provider's only
    result = cli(workdir, environment, "status", "--db", migrated, "--json")
    assert result.returncode == 0, result.stderr
    model_window, provider_window = json.loads(result.stdout)["budgets"]
    reset_in = model_window.pop("next_reset_in_ms")
    assert 0 < reset_in <= 59_000
    assert model_window == {
        "provider": "p",
        "model": "m",
        "window_ms": 60_000,
        "max_requests": 60,
        "max_tokens": 150_000,
        "requests": 1,
        "reserved_tokens": 2_000,
        "used_tokens": 0,
        "remaining_requests": 59,
        "remaining_tokens": 148_000,
        "next_reset_at": now - 1_000 + 60_000,
    }
    assert provider_window["next_reset_in_ms"] > 5 * 3_600_000 - 60_000
    del provider_window["next_reset_in_ms"]
    assert provider_window == {
        "provider": "p",
        "model": None,
        "window_ms": 18_000_000,
        "max_requests": None,
        "max_tokens": 2_000_000,
        "requests": 2,
        "reserved_tokens": 2_000,
        "used_tokens": 1_200,
        "remaining_requests": None,
        "remaining_tokens": 1_996_800,
        "next_reset_at": now - 1_000 + 18_000_000,
    }
    text = cli(workdir, environment, "status", "--db", migrated).stdout
    lines = text.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("budgets ")))
    assert lines[first].startswith(
        "budgets          p/m per 1 min: requests 1 of 60 (59 left); "
        "tokens 2000 reserved + 0 used of 150000 (148000 left); next reset in "
    )
    assert lines[first + 1] == (
        " " * 17 + "p (all models) per 5 h: requests 2 (no limit); "
        "tokens 2000 reserved + 1200 used of 2000000 (1996800 left); next reset in 5.0 h"
    )
    shown = cli(workdir, environment, "policy", "show", "--db", migrated).stdout
    assert "budget                  p/m: 60 requests, 150000 tokens per 1 min" in shown
    assert "budget                  p (all models): 2000000 tokens per 5 h" in shown
    for output in (text, result.stdout, shown):
        assert "r-budget" not in output
        assert "agent-r-budget" not in output


def test_status_says_when_it_cannot_know_the_budgets(
    plane: AdmissionPlane, migrated: str, workdir: Path, environment: dict[str, str]
) -> None:
    """Without a live revision the budgets are each connector's own: ``status`` says none are known (JSON: an
    empty list); with a revision that sets none, it says the live policy has none."""
    plane.record_external_usage("p", "m", requests=1, tokens=10)
    assert (
        "budgets          none known (no live policy revision"
        in cli(workdir, environment, "status", "--db", migrated).stdout
    )
    assert json.loads(cli(workdir, environment, "status", "--db", migrated, "--json").stdout)["budgets"] == []
    plane.set_policy(Policy(3, 3, 2_000, 600_000, 30_000))
    assert "budgets          none in the live policy" in cli(workdir, environment, "status", "--db", migrated).stdout


def test_events_prints_pages_of_the_sanitized_journal(
    plane: AdmissionPlane, migrated: str, workdir: Path, environment: dict[str, str]
) -> None:
    """``events`` pages the journal with --after/--limit and never prints identifiers or prompts."""
    now = wall_clock_ms()
    for index in range(3):
        enqueue(plane, f"r-{index}", now + index)
    first = cli(workdir, environment, "events", "--db", migrated, "--limit", "2", "--json")
    rows = [json.loads(line) for line in first.stdout.splitlines()]
    assert [row["event_seq"] for row in rows] == [1, 2]
    assert {row["kind"] for row in rows} == {"request_enqueued"}
    rest = cli(workdir, environment, "events", "--db", migrated, "--after", "2")
    assert rest.returncode == 0
    assert len(rest.stdout.splitlines()) == 1
    assert "request_enqueued" in rest.stdout
    assert "secret prompt" not in first.stdout + rest.stdout
    assert "r-0" not in first.stdout + rest.stdout


def test_events_follow_tails_new_events_until_interrupted(
    plane: AdmissionPlane, migrated: str, workdir: Path, environment: dict[str, str]
) -> None:
    """``events --follow`` prints events as they are written and exits 0 on SIGINT."""
    now = wall_clock_ms()
    enqueue(plane, "r-a", now)
    follower = subprocess.Popen(
        [*CLI, "events", "--db", migrated, "--follow", "--interval", "0.05", "--json"],
        cwd=workdir,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        assert json.loads(follower.stdout.readline())["event_seq"] == 1
        enqueue(plane, "r-b", now + 1)
        assert json.loads(follower.stdout.readline())["event_seq"] == 2
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


def test_reap_releases_the_seat_of_a_connector_whose_processes_are_gone(
    migrated: str, workdir: Path, environment: dict[str, str]
) -> None:
    """``reap`` proves a dead connector, child and group gone through /proc and releases the seat."""
    connector_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        connector = ConnectorIdentity.capture(pid=connector_process.pid)
        child = capture(child_process.pid)
        with AdmissionPlane(
            migrated,
            policy=POLICY,
            encryption_key=bytes.fromhex(ENCRYPTION_HEX),
            content_fingerprint_key=bytes.fromhex(CONTENT_HEX),
            owner_identity=connector,
        ) as plane:
            now = wall_clock_ms()
            enqueue(plane, "r-dead", now)
            lease = plane.admit_next(now, connector.owner_instance_id)
            assert lease is not None
            plane.mark_starting(lease, now + 1)
            record = DispatchRecord(
                request_id="r-dead",
                lease_id=lease.lease_id,
                generation=lease.generation,
                owner_instance_id=connector.owner_instance_id,
                connector=connector,
                child=child,
                prompt_channel="stdin",
            )
            assert plane.commit_dispatch_intent(record).ok
            alive = json.loads(cli(workdir, keyed(environment), "reap", "--db", migrated, "--json").stdout)
            assert alive["released"] == 0
            for process in (connector_process, child_process):
                process.kill()
                process.wait()
            result = cli(workdir, keyed(environment), "reap", "--db", migrated, "--json")
            assert result.returncode == 0, result.stderr
            assert json.loads(result.stdout)["released"] == 1
            assert str(plane.get_request("r-dead").state) == "recovery_required"
    finally:
        for process in (connector_process, child_process):
            if process.poll() is None:
                process.kill()
                process.wait()


# --- one-line errors ------------------------------------------------------------------------------------


def test_missing_database_is_a_one_line_error(workdir: Path, environment: dict[str, str]) -> None:
    """A database file that does not exist is reported, not created."""
    for command in (["status"], ["db", "current"]):
        result = cli(workdir, environment, *command, "--db", str(workdir / "absent.sqlite"))
        assert_one_line_error(result, "does not exist")
    assert not (workdir / "absent.sqlite").exists()


def test_unmigrated_database_is_a_one_line_error(workdir: Path, environment: dict[str, str]) -> None:
    """An empty SQLite file is refused with a hint to run ``db upgrade``."""
    (workdir / "empty.sqlite").touch()
    assert_one_line_error(cli(workdir, environment, "status", "--db", str(workdir / "empty.sqlite")), "db upgrade")


def test_foreign_database_is_a_one_line_error(workdir: Path, environment: dict[str, str]) -> None:
    """A database that belongs to something else is refused by status, events, reap and check."""
    import sqlite3

    foreign = workdir / "foreign.sqlite"
    with sqlite3.connect(foreign) as connection:
        connection.execute("CREATE TABLE invoices (id INTEGER)")
    connection.close()
    for command in (["status"], ["db", "check"]):
        assert_one_line_error(cli(workdir, environment, *command, "--db", str(foreign)), "not an admission plane")
    assert_one_line_error(cli(workdir, keyed(environment), "reap", "--db", str(foreign)), "not an admission plane")


def test_drifted_database_fails_the_integrity_check(migrated: str, workdir: Path, environment: dict[str, str]) -> None:
    """An unexpected table in a migrated database makes status and check fail closed, in one line."""
    import sqlite3

    with sqlite3.connect(migrated) as connection:
        connection.execute("CREATE TABLE outbox (id INTEGER)")
    connection.close()
    assert_one_line_error(cli(workdir, environment, "status", "--db", migrated), "outbox")
    result = cli(workdir, environment, "db", "check", "--db", migrated)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr


def test_missing_key_is_a_one_line_error(migrated: str, workdir: Path, environment: dict[str, str]) -> None:
    """``reap`` needs keys: with neither variables nor a key file it fails, naming where keys come from."""
    result = cli(workdir, environment, "reap", "--db", migrated, "--key-file", str(workdir / "no-such-keys"))
    assert_one_line_error(result, ENCRYPTION_KEY_VARIABLE)
    half = {**environment, ENCRYPTION_KEY_VARIABLE: ENCRYPTION_HEX}
    assert_one_line_error(cli(workdir, half, "reap", "--db", migrated), CONTENT_KEY_VARIABLE)
    bad = {**keyed(environment), CONTENT_KEY_VARIABLE: "not-hex-" + "0" * 56}
    result = cli(workdir, bad, "reap", "--db", migrated)
    assert_one_line_error(result, "64 hexadecimal characters")
    assert "not-hex" not in result.stderr


def test_key_file_readable_by_others_is_refused(migrated: str, workdir: Path, environment: dict[str, str]) -> None:
    """A key file with group or other permissions is refused; ``keys init`` writes a 0600 file."""
    key_file = workdir / "private" / "keys"  # keys init creates the directory 0700; workdir may be 0755
    result = cli(workdir, environment, "keys", "init", "--key-file", str(key_file))
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert cli(workdir, environment, "reap", "--db", migrated, "--key-file", str(key_file)).returncode == 0
    key_file.chmod(0o644)
    assert_one_line_error(
        cli(workdir, environment, "reap", "--db", migrated, "--key-file", str(key_file)), "accessible by other users"
    )
    assert_one_line_error(cli(workdir, environment, "keys", "init", "--key-file", str(key_file)), "already exists")


@pytest.mark.parametrize("url", ["mysql://localhost/db", "sqlite://", "postgresql+psycopg://u:hunter2@127.0.0.1:1/x"])
def test_bad_or_unreachable_url_is_a_one_line_error(url: str, workdir: Path, environment: dict[str, str]) -> None:
    """Unsupported, in-memory and unreachable database URLs fail in one line that never shows a password."""
    result = cli(workdir, environment, "status", "--db", url)
    assert_one_line_error(result, "")
    assert "hunter2" not in result.stderr


# --- policy set and pause/resume on bad input: one error line, nothing written -------------------

BAD_DOCUMENTS = [
    ("not json {", "not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
    ('{"bogus": 1}', "unknown fields: bogus"),
    ('{"max_active_turns": 0}', "max_active_turns"),
    ('{"min_start_interval_ms": 5}', "min_start_interval_ms"),
    ('{"lanes": []}', "lanes"),
    ('{"lanes": [{"name": "a"}, {"name": "a"}]}', "distinct"),
    ('{"key_limits": [{"provider": "p", "model": "m", "max_concurrent_starts": 1}]}', "per-provider"),
    ('{"session_overflow": "drop"}', "session_overflow"),
    ("[" * 100_000, "not valid JSON"),
]


def _revisions(workdir: Path, environment: dict[str, str], database: str) -> str:
    """The output of ``policy history`` (which must succeed)."""
    result = cli(workdir, environment, "policy", "history", "--db", database)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(("document", "fragment"), BAD_DOCUMENTS, ids=[fragment for _, fragment in BAD_DOCUMENTS])
def test_a_bad_policy_document_is_one_error_line_and_no_revision(
    workdir: Path, environment: dict[str, str], migrated: str, document: str, fragment: str
) -> None:
    """A malformed, unknown-field or out-of-range policy file fails in one line and writes no revision."""
    path = workdir / "policy.json"
    path.write_text(document, encoding="utf-8")
    result = cli(workdir, keyed(environment), "policy", "set", "--db", migrated, "--file", str(path))
    assert_one_line_error(result, fragment)
    assert _revisions(workdir, environment, migrated).strip() == "no policy revision has been set"


def test_a_policy_file_that_is_missing_a_directory_or_a_fifo_is_refused(
    workdir: Path, environment: dict[str, str], migrated: str
) -> None:
    """A missing file, a directory and a FIFO (which must not hang the command) are each one error line."""
    fifo = workdir / "fifo.json"
    os.mkfifo(fifo)
    for path in (workdir / "absent.json", workdir, fifo):
        result = cli(workdir, keyed(environment), "policy", "set", "--db", migrated, "--file", str(path))
        assert_one_line_error(result, "cannot read the policy file")
    assert _revisions(workdir, environment, migrated).strip() == "no policy revision has been set"


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (("--provider", "openai"), "both its provider and its model"),
        (("--lane", "batch", "--model", "m"), "not both"),
        (("--lane", " padded"), "identifier"),
    ],
)
def test_a_bad_pause_scope_is_refused_and_pauses_nothing(
    workdir: Path, environment: dict[str, str], migrated: str, arguments: tuple[str, ...], fragment: str
) -> None:
    """A half key, a lane with a model or a malformed name is one error line, and nothing is paused."""
    assert_one_line_error(cli(workdir, keyed(environment), "pause", "--db", migrated, *arguments), fragment)
    status = cli(workdir, environment, "status", "--db", migrated)
    assert "paused           nothing" in status.stdout
