"""Hardened inputs that need no database: the writer-gate file, key sources, URLs shown, timing options."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from planes import ENCRYPTION_KEY

from admission_plane import AdmissionPlane
from admission_plane.cli import main
from admission_plane.errors import AdmissionDatabaseError, InvalidInputError, MissingKeyError
from admission_plane.keys import (
    CONTENT_KEY_VARIABLE,
    ENCRYPTION_KEY_VARIABLE,
    generate_key_file,
    load_keys,
)
from admission_plane.store.doorbell import Doorbell
from admission_plane.store.engine import redacted_url
from admission_plane.turns import Backoff

SECRET_HEX = "ab" * 32
#: Bytes a writer must never overwrite through a link planted at the gate path.
PRECIOUS = b"do not overwrite these bytes: they belong to someone else\n"
BAD_NUMBERS = [math.nan, math.inf, -math.inf, -1, -0.5]


@pytest.fixture
def no_key_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No keys in the environment, so the key file is what counts."""
    monkeypatch.delenv(ENCRYPTION_KEY_VARIABLE, raising=False)
    monkeypatch.delenv(CONTENT_KEY_VARIABLE, raising=False)


@pytest.fixture
def private(tmp_path: Path) -> Path:
    """A directory only its owner may use (mode 0700)."""
    directory = tmp_path / "private"
    directory.mkdir(mode=0o700)
    directory.chmod(0o700)
    return directory


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single line the command printed on standard error (nothing on standard output)."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


# --- 10: the writer-gate file ----------------------------------------------------------------------


def test_a_symbolic_link_at_the_gate_path_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    """Opening the doorbell through a symbolic link raises AdmissionDatabaseError and leaves the target's bytes as they
    were."""
    target = tmp_path / "victim"
    target.write_bytes(PRECIOUS)
    gate = tmp_path / "db.sqlite-writer.lock"
    gate.symlink_to(target)
    with pytest.raises(AdmissionDatabaseError, match="not a regular file") as raised:
        Doorbell.open(str(gate))
    assert "\n" not in str(raised.value)
    assert target.read_bytes() == PRECIOUS


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling link"])
def test_a_gate_path_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    """A FIFO, a directory or a dangling link at the gate path raises AdmissionDatabaseError instead of being used or
    skipped."""
    gate = tmp_path / "db.sqlite-writer.lock"
    if kind == "fifo":
        os.mkfifo(gate, 0o600)
    elif kind == "directory":
        gate.mkdir()
    else:
        gate.symlink_to(tmp_path / "nowhere")
    with pytest.raises(AdmissionDatabaseError, match="not a regular file"):
        Doorbell.open(str(gate))
    assert not (tmp_path / "nowhere").exists()


# --- 11: keys -------------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.usefixtures("no_key_variables")
def test_a_fifo_key_file_is_refused_without_blocking(private: Path) -> None:
    """load_keys on a FIFO raises MissingKeyError at once instead of waiting for a writer."""
    fifo = private / "keys"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(MissingKeyError, match="not a regular file"):
        load_keys(fifo)


@pytest.mark.timeout(10)
@pytest.mark.usefixtures("no_key_variables")
def test_the_command_line_refuses_a_fifo_key_file_in_one_line(
    private: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``reap --key-file FIFO`` exits 2 with one error line instead of hanging."""
    fifo = private / "keys"
    os.mkfifo(fifo, 0o600)
    database = private / "plane.sqlite"
    database.touch()
    assert main(["reap", "--db", str(database), "--key-file", str(fifo)]) == 2
    assert "not a regular file" in one_error_line(capsys)


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o770, 0o705, 0o702, 0o720])
@pytest.mark.usefixtures("no_key_variables")
def test_a_key_directory_others_may_read_or_write_is_refused(private: Path, mode: int) -> None:
    """A key file in a directory with group or other permissions is neither loaded nor created (MissingKeyError)."""
    key_file = generate_key_file(private / "keys")
    load_keys(key_file)
    private.chmod(mode)
    try:
        with pytest.raises(MissingKeyError, match="chmod 700") as raised:
            load_keys(key_file)
        assert "\n" not in str(raised.value)
        with pytest.raises(MissingKeyError, match="chmod 700"):
            generate_key_file(private / "more-keys")
        assert not (private / "more-keys").exists()
    finally:
        private.chmod(0o700)


def test_the_same_key_from_the_environment_for_both_purposes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal encryption and content keys in the environment raise MissingKeyError, naming no key material."""
    monkeypatch.setenv(ENCRYPTION_KEY_VARIABLE, SECRET_HEX)
    monkeypatch.setenv(CONTENT_KEY_VARIABLE, SECRET_HEX.upper())
    with pytest.raises(MissingKeyError, match="must differ") as raised:
        load_keys()
    assert SECRET_HEX not in str(raised.value).lower()


@pytest.mark.usefixtures("no_key_variables")
def test_the_same_key_in_a_key_file_for_both_purposes_is_refused(private: Path) -> None:
    """A key file whose two keys are equal raises MissingKeyError, naming no key material."""
    key_file = private / "keys"
    key_file.write_text(f"{ENCRYPTION_KEY_VARIABLE}={SECRET_HEX}\n{CONTENT_KEY_VARIABLE}={SECRET_HEX}\n")
    key_file.chmod(0o600)
    with pytest.raises(MissingKeyError, match="must differ") as raised:
        load_keys(key_file)
    assert SECRET_HEX not in str(raised.value)


@pytest.mark.parametrize("content_key", [ENCRYPTION_KEY, bytearray(ENCRYPTION_KEY), memoryview(ENCRYPTION_KEY)])
def test_a_plane_refuses_the_same_key_for_both_purposes(tmp_path: Path, content_key: object) -> None:
    """AdmissionPlane with equal encryption and content-fingerprint keys raises InvalidInputError before opening
    anything."""
    database = tmp_path / "never-created.sqlite"
    with pytest.raises(InvalidInputError, match="must differ"):
        AdmissionPlane(database, encryption_key=ENCRYPTION_KEY, content_fingerprint_key=content_key)  # type: ignore[arg-type]
    assert not database.exists()


# --- 12: URLs shown -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://u:hunter2@db.example/plane", "postgresql+psycopg://u:***@db.example/plane"),
        (
            "postgresql+psycopg://u@db.example/plane?password=hunter2&sslmode=require",
            "postgresql+psycopg://u@db.example/plane?password=***&sslmode=require",
        ),
        (
            "postgresql+psycopg://u@h/db?PassWord=a&passwd=b&PWD=c&client_secret=d&access_token=e&application_name=x",
            "postgresql+psycopg://u@h/db?PWD=***&PassWord=***&access_token=***&application_name=x"
            "&client_secret=***&passwd=***",
        ),
        ("sqlite+pysqlite:////tmp/plane.sqlite?password=hunter2", "sqlite+pysqlite:////tmp/plane.sqlite?password=***"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ],
)
def test_urls_are_shown_with_every_password_masked(url: str, shown: str) -> None:
    """redacted_url hides the userinfo password and every password-, secret- or token-like query value, keeping the
    rest."""
    assert redacted_url(url) == shown


# --- 14: timing options ---------------------------------------------------------------------------


@pytest.mark.parametrize("interval", ["0", "-1", "-0.5", "nan", "inf", "-inf", "1e300", "soon"])
def test_events_follow_refuses_an_interval_that_is_not_a_positive_finite_number(
    interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``events --interval`` rejects 0, negatives, NaN, infinities and text with an argparse error (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        main(["events", "--follow", "--interval", interval, "--db", "/nonexistent/plane.sqlite"])
    assert exited.value.code == 2
    assert "--interval" in capsys.readouterr().err


@pytest.mark.parametrize("field", ["initial_ms", "max_ms"])
@pytest.mark.parametrize("value", [*BAD_NUMBERS, 0, True, "10"])
def test_backoff_refuses_delays_that_are_not_positive_finite_numbers(field: str, value: object) -> None:
    """Backoff's initial and maximum delays must be positive finite numbers (InvalidInputError)."""
    with pytest.raises(InvalidInputError, match=field):
        Backoff(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [("factor", math.nan), ("factor", math.inf), ("factor", 0.5), ("jitter", math.nan), ("jitter", -0.1),
     ("jitter", 1.0), ("jitter", math.inf)],
)  # fmt: skip
def test_backoff_refuses_a_bad_factor_or_jitter(field: str, value: float) -> None:
    """Backoff's factor must be a finite number of at least 1 and its jitter a fraction in [0, 1)
    (InvalidInputError)."""
    with pytest.raises(InvalidInputError, match=field):
        Backoff(**{field: value})  # type: ignore[arg-type]
