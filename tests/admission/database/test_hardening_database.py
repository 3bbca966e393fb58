"""The database boundary under abuse: unusable files and URLs, corrupt pages, other applications' tables,
concurrent migrations and a PostgreSQL connection killed mid-operation (real files, servers and processes)."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
from dbutil import table_names
from gates import require
from planes import CONTENT_KEY, ENCRYPTION_KEY
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from admission_plane import AdmissionPlane, migrate
from admission_plane.cli import main
from admission_plane.errors import (
    AdmissionDatabaseError,
    AdmissionMigrationError,
    InvalidInputError,
    SchemaIntegrityError,
)
from admission_plane.keys import CONTENT_KEY_VARIABLE, ENCRYPTION_KEY_VARIABLE
from admission_plane.store.advisory import ADVISORY_LOCK_KEY
from admission_plane.store.engine import create_admission_engine
from admission_plane.store.schema_check import check_schema

KEYED = {ENCRYPTION_KEY_VARIABLE: ENCRYPTION_KEY.hex(), CONTENT_KEY_VARIABLE: CONTENT_KEY.hex()}


def open_plane(database: str, *, allow_foreign_tables: bool = False) -> None:
    """Open a plane with both keys on ``database`` and close it again."""
    AdmissionPlane(
        database,
        encryption_key=ENCRYPTION_KEY,
        content_fingerprint_key=CONTENT_KEY,
        allow_foreign_tables=allow_foreign_tables,
    ).close()


OPENERS: dict[str, Callable[[str], object]] = {
    "AdmissionPlane": open_plane,
    "migrate.upgrade": migrate.upgrade,
    "migrate.current_revision": migrate.current_revision,
}


def assert_one_line(message: str, *fragments: str) -> None:
    """``message`` is one line of our own words (no driver traceback text) holding every fragment."""
    assert "\n" not in message, message
    for driver_text in ("Background on this error", "[SQL", "sqlite3.", "psycopg.", "Traceback"):
        assert driver_text not in message, message
    for fragment in fragments:
        assert fragment in message, message


def files_under(directory: Path) -> list[str]:
    """Every path below ``directory``, relative and sorted."""
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


def cli_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The one ``admission-plane: error:`` line the last in-process command printed."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("admission-plane: error: "), lines
    return lines[0]


# --- 7: unusable files and URLs ------------------------------------------------------------------

UNUSABLE = {
    "directory": "is a directory",
    "missing directory": "does not exist",
    "random bytes": "is not an SQLite database",
    "truncated": "is corrupt",
}


def unusable_database(kind: str, directory: Path, template: Path) -> Path:
    """A path of ``kind`` in ``directory``: a directory, in a missing directory, random bytes, or half a database."""
    path = directory / "plane.sqlite"
    if kind == "directory":
        path.mkdir()
    elif kind == "missing directory":
        path = directory / "absent" / "plane.sqlite"
    elif kind == "random bytes":
        path.write_bytes(random.Random(7).randbytes(64 * 1024))
    else:
        data = template.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize("opener", sorted(OPENERS))
@pytest.mark.parametrize("kind", sorted(UNUSABLE))
def test_unusable_sqlite_path_is_a_one_line_database_error(
    kind: str, opener: str, tmp_path: Path, sqlite_template: Path
) -> None:
    """An unusable SQLite path raises AdmissionDatabaseError with a one-line reason and creates no file."""
    database = unusable_database(kind, tmp_path, sqlite_template)
    before = files_under(tmp_path)
    with pytest.raises(AdmissionDatabaseError) as raised:
        OPENERS[opener](str(database))
    assert_one_line(str(raised.value), UNUSABLE[kind], str(database))
    assert files_under(tmp_path) == before


def test_missing_sqlite_file_is_refused_without_creating_it(tmp_path: Path) -> None:
    """Opening or downgrading a missing SQLite file refuses in one line, reading its revision says None, and
    none of them creates the file or its writer lock, while upgrading it creates the database."""
    database = str(tmp_path / "absent.sqlite")
    for opener in (open_plane, lambda path: migrate.downgrade(path, "base")):
        with pytest.raises(AdmissionDatabaseError) as raised:
            opener(database)
        assert_one_line(str(raised.value), database, "does not exist")
    assert migrate.current_revision(database) is None
    assert files_under(tmp_path) == []
    migrate.upgrade(database)
    assert migrate.current_revision(database) == migrate.HEAD_REVISION


MALFORMED_URLS = [
    "postgresql://user@host:notaport/db",
    "postgresql://[::1/db",
    "postgresql+nosuchdriver://user@host/db",
    "://nothing",
]


@pytest.mark.parametrize("opener", sorted(OPENERS))
@pytest.mark.parametrize("url", MALFORMED_URLS)
def test_malformed_url_is_a_one_line_invalid_input_error(url: str, opener: str) -> None:
    """A malformed database URL raises InvalidInputError with a one-line message."""
    with pytest.raises(InvalidInputError) as raised:
        OPENERS[opener](url)
    assert_one_line(str(raised.value), "database URL")


@pytest.mark.postgres
@pytest.mark.parametrize("opener", sorted(OPENERS))
def test_absent_postgres_database_is_a_one_line_database_error(opener: str) -> None:
    """A PostgreSQL database that does not exist raises AdmissionDatabaseError in one line without the password."""
    base = os.environ.get("ADMISSION_PLANE_TEST_POSTGRES_URL")
    require(bool(base), "ADMISSION_PLANE_TEST_POSTGRES_URL is not set")
    assert base is not None
    name = f"ap_absent_{uuid.uuid4().hex[:12]}"
    url = make_url(base).set(password="s3cret-pw", database=name).render_as_string(hide_password=False)
    with pytest.raises(AdmissionDatabaseError) as raised:
        OPENERS[opener](url)
    assert_one_line(str(raised.value), "cannot connect", f'database "{name}" does not exist')
    assert "s3cret-pw" not in str(raised.value)


# --- 8: db check runs SQLite's integrity check ---------------------------------------------------


def test_db_check_fails_on_corrupt_pages(
    tmp_path: Path, sqlite_template: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`db check` exits 1 with one line when a page in the middle of a migrated SQLite file is overwritten."""
    database = tmp_path / "corrupt.sqlite"
    database.write_bytes(sqlite_template.read_bytes())
    assert main(["db", "check", "--db", str(database)]) == 0
    with closing(sqlite3.connect(database)) as connection:
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        root = connection.execute("SELECT rootpage FROM sqlite_master WHERE name = 'events'").fetchone()[0]
    assert 1 < root < pages  # a page in the middle of the file
    with database.open("r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(random.Random(8).randbytes(page_size))
    capsys.readouterr()
    assert main(["db", "check", "--db", str(database)]) == 1
    assert_one_line(cli_error(capsys), "SQLite integrity check failed")


# --- 9: upgrades refuse other applications' tables -----------------------------------------------


def test_upgrade_refuses_an_sqlite_database_with_foreign_tables_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Upgrading an SQLite file that holds another application's table is refused with every byte unchanged,
    and allowed with the sharing option, after which the schema check accepts the table only when told to."""
    for name, value in KEYED.items():
        monkeypatch.setenv(name, value)
    database = tmp_path / "shared.sqlite"
    with closing(sqlite3.connect(database)) as connection:
        connection.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)")
        connection.execute("CREATE INDEX invoices_total ON invoices (total)")
        connection.execute("CREATE VIEW big_invoices AS SELECT id FROM invoices WHERE total > 100")
        connection.execute("INSERT INTO invoices VALUES (1, 100)")
        connection.commit()
    before = (database.read_bytes(), files_under(tmp_path))
    with pytest.raises(AdmissionMigrationError, match="tables it does not own: big_invoices, invoices") as raised:
        migrate.upgrade(str(database))
    assert "allow_foreign_tables=True" in str(raised.value)
    assert main(["db", "upgrade", "--db", str(database)]) == 2
    assert_one_line(cli_error(capsys), "invoices", "--allow-foreign-tables")
    assert (database.read_bytes(), files_under(tmp_path)) == before

    assert main(["db", "upgrade", "--allow-foreign-tables", "--db", str(database)]) == 0
    assert main(["db", "check", "--allow-foreign-tables", "--db", str(database)]) == 0
    capsys.readouterr()
    assert main(["db", "check", "--db", str(database)]) == 1
    assert_one_line(cli_error(capsys), "does not own: big_invoices, invoices", "--allow-foreign-tables")
    open_plane(str(database), allow_foreign_tables=True)
    with pytest.raises(SchemaIntegrityError, match="unexpected"):
        open_plane(str(database))
    with closing(sqlite3.connect(database)) as connection:
        assert connection.execute("SELECT * FROM invoices").fetchall() == [(1, 100)]


FOREIGN_POSTGRES_SCHEMA = (
    "CREATE TABLE invoices (id BIGINT PRIMARY KEY, total BIGINT NOT NULL CHECK (total >= 0), "
    "code TEXT UNIQUE, parent BIGINT REFERENCES invoices (id) ON DELETE CASCADE)",
    "CREATE INDEX invoices_total ON invoices (total)",
    "CREATE FUNCTION invoices_touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$",
    "CREATE TRIGGER invoices_touch BEFORE INSERT ON invoices FOR EACH ROW EXECUTE FUNCTION invoices_touch()",
    "INSERT INTO invoices (id, total, code) VALUES (1, 100, 'A-1')",
)


@pytest.mark.postgres
def test_upgrade_refuses_a_postgres_database_with_foreign_tables_before_writing(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upgrading a PostgreSQL database that holds another application's table is refused without writing,
    and allowed with the sharing option, after which the schema check accepts the table only when told to."""
    for name, value in KEYED.items():
        monkeypatch.setenv(name, value)
    engine = create_admission_engine(postgres_url)
    try:
        with engine.begin() as connection:
            for statement in FOREIGN_POSTGRES_SCHEMA:
                connection.exec_driver_sql(statement)
        with pytest.raises(AdmissionMigrationError, match="tables it does not own: invoices"):
            migrate.upgrade(postgres_url)
        assert main(["db", "upgrade", "--db", postgres_url]) == 2
        assert table_names(postgres_url) == ["invoices"]

        assert main(["db", "upgrade", "--allow-foreign-tables", "--db", postgres_url]) == 0
        check_schema(engine, allow_foreign_tables=True)
        assert main(["db", "check", "--allow-foreign-tables", "--db", postgres_url]) == 0
        with pytest.raises(SchemaIntegrityError, match="unexpected table invoices is present"):
            check_schema(engine)
        open_plane(postgres_url, allow_foreign_tables=True)
        assert migrate.current_revision(postgres_url) == migrate.HEAD_REVISION
    finally:
        engine.dispose()


# --- 15: concurrent migrations are serialised ----------------------------------------------------

_AFTER_GO = (
    "import os, sys, time\n"
    "from admission_plane.cli import main\n"
    "print('ready', flush=True)\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    time.sleep(0.005)\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def fresh_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database nobody has migrated: a new SQLite path, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "fresh.sqlite")
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.mark.slow
def test_eight_concurrent_db_upgrades_all_succeed(fresh_database: str, tmp_path: Path) -> None:
    """Eight `admission-plane db upgrade` processes released at once on a fresh database all exit 0 at head."""
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADMISSION_PLANE_") or k.endswith("POSTGRES_URL")}
    command = ["db", "upgrade", "--db", fresh_database, "--key-file", str(tmp_path / "keys")]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _AFTER_GO, str(go), *command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline() == "ready\n"
        go.touch()
        outcomes = [(process.communicate(timeout=120)[1], process.returncode) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert outcomes == [("", 0)] * 8
    assert migrate.current_revision(fresh_database) == migrate.HEAD_REVISION


# --- 16: a PostgreSQL connection killed mid-operation -------------------------------------------

_ENQUEUE_UNTIL_KILLED = (
    "import json, sys\n"
    "from admission_plane import AdmissionPlane\n"
    f"plane = AdmissionPlane(sys.argv[1], encryption_key=bytes.fromhex('{ENCRYPTION_KEY.hex()}'),\n"
    f"                       content_fingerprint_key=bytes.fromhex('{CONTENT_KEY.hex()}'))\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "try:\n"
    "    plane.enqueue(request_id='r-1', session_id='s-1', agent_id='a-1', fingerprint='f' * 64,\n"
    "                  provider='p', model='m', now=1000)\n"
    "    print(json.dumps(['no error', '']))\n"
    "except Exception as error:\n"
    "    print(json.dumps([type(error).__name__, str(error)]))\n"
    "plane.close()\n"
)
#: What the test holds so the subprocess's operation blocks: the writers' advisory lock, or the queue table.
BLOCKERS = {
    "advisory lock": f"SELECT pg_advisory_lock({ADVISORY_LOCK_KEY})",
    "table lock": "LOCK TABLE turn_requests IN ACCESS EXCLUSIVE MODE",
}


@pytest.fixture
def migrated_postgres(postgres_url: str) -> str:
    """A fresh PostgreSQL database at head."""
    migrate.upgrade(postgres_url)
    return postgres_url


@pytest.mark.postgres
@pytest.mark.parametrize("blocker", sorted(BLOCKERS))
def test_killed_postgres_connection_names_the_lost_connection_without_traceback(
    blocker: str, migrated_postgres: str
) -> None:
    """A backend terminated while the operation waits raises AdmissionDatabaseError naming the lost connection
    first, and nothing is written to stderr."""
    engine = create_engine(make_url(migrated_postgres).set(drivername="postgresql+psycopg"))
    process = subprocess.Popen(
        [sys.executable, "-c", _ENQUEUE_UNTIL_KILLED, migrated_postgres],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        with engine.connect() as holder:
            holder.exec_driver_sql(BLOCKERS[blocker])
            own = holder.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            waiting = (
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> %(own)s"
            )
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
            with engine.connect() as observer:
                deadline = time.monotonic() + 30
                while not (blocked := observer.exec_driver_sql(waiting, {"own": own}).scalars().all()):
                    assert time.monotonic() < deadline, "the operation never blocked"
                    observer.rollback()
                    time.sleep(0.02)
                observer.exec_driver_sql("SELECT pg_terminate_backend(%(pid)s)", {"pid": blocked[0]})
            out, err = process.communicate(timeout=60)
            holder.rollback()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        engine.dispose()
    kind, message = json.loads(out.strip().splitlines()[-1])
    assert kind == "AdmissionDatabaseError"
    assert message.startswith("database connection was lost: terminating connection due to administrator command")
    assert_one_line(message)
    assert err == ""
