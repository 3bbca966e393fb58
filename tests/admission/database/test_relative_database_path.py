"""A relative SQLite path names one file for the engine's life, whatever the working directory becomes.

SQLAlchemy's pysqlite dialect opens ``os.path.abspath`` of the path once, when the engine is made;
the writer gate and the doorbell beside the file are found from the engine's URL at every unit. So
the URL is made absolute the same way (``store.engine.parse_url``): after a ``chdir`` (a daemon's
``chdir("/")``) the writers of one database still queue on its gate and ring its doorbell.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from planes import CONTENT_KEY, CONTRACT_POLICY, ENCRYPTION_KEY, enqueue

from admission_plane import AdmissionPlane
from admission_plane.store.doorbell import Doorbell
from admission_plane.store.engine import create_admission_engine, parse_url, writer_lock_path


@pytest.mark.parametrize(
    "given",
    [
        "sqlite:///admission.sqlite",
        "sqlite+pysqlite:///admission.sqlite",
        "admission.sqlite",
        "sqlite:///sub/../admission.sqlite",
    ],
)
def test_a_relative_path_is_made_absolute_as_the_driver_makes_it(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every form of a relative path names the file in the working directory of the call, normalised as
    ``os.path.abspath`` normalises it (what the driver opens)."""
    monkeypatch.chdir(tmp_path)
    assert parse_url(given).database == os.path.join(os.getcwd(), "admission.sqlite")


def test_an_absolute_path_is_normalised_as_the_driver_normalises_it() -> None:
    assert parse_url("sqlite:////var/lib/../admission.sqlite").database == "/var/admission.sqlite"


@pytest.mark.parametrize("given", ["sqlite:///file:admission.sqlite?mode=ro&uri=true", "sqlite:///file:x.db?uri=1"])
def test_a_uri_is_left_as_given(given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``uri=true``: SQLite reads the ``file:`` URI itself, relative parts included."""
    monkeypatch.chdir(tmp_path)
    assert parse_url(given).database == given.removeprefix("sqlite:///").split("?")[0]


def test_the_engine_and_its_gate_name_the_file_the_driver_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_template: Path
) -> None:
    """The engine's URL, the file SQLite opened and the writer gate all sit in the directory of the call."""
    shutil.copyfile(sqlite_template, tmp_path / "admission.sqlite")
    monkeypatch.chdir(tmp_path)
    engine = create_admission_engine("sqlite:///admission.sqlite")
    try:
        monkeypatch.chdir("/")
        with engine.connect() as connection:
            opened = connection.exec_driver_sql("PRAGMA database_list").fetchall()[0][2]
        assert engine.url.database == opened == str(tmp_path / "admission.sqlite")
        assert writer_lock_path(engine) == str(tmp_path / "admission.sqlite-writer.lock")
    finally:
        engine.dispose()


def test_after_a_chdir_units_queue_on_the_databases_own_gate_and_ring_its_doorbell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_template: Path
) -> None:
    """A plane opened by a relative URL, then a ``chdir``: its units still take the gate beside the
    database and ring the doorbell there; nothing is created in the new working directory."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    shutil.copyfile(sqlite_template, home / "admission.sqlite")
    monkeypatch.chdir(home)
    plane = AdmissionPlane(
        "sqlite:///admission.sqlite",
        policy=CONTRACT_POLICY,
        encryption_key=ENCRYPTION_KEY,
        content_fingerprint_key=CONTENT_KEY,
    )
    try:
        doorbell = Doorbell.open(str(home / "admission.sqlite-writer.lock"))
        assert doorbell is not None
        try:
            before = doorbell.read()
            monkeypatch.chdir(elsewhere)
            plane.engine.dispose()  # every later unit opens a new connection, after the chdir
            enqueue(plane, "r1")
            lease = plane.admit_next(2_000, plane.owner_identity.owner_instance_id)
            assert lease is not None
            after = doorbell.read()
        finally:
            doorbell.close()
        assert before is not None
        assert after is not None
        assert after.since(before).queue == 1  # the admission rang the database's own doorbell
        assert list(elsewhere.iterdir()) == []
        assert plane.get_request("r1").state == "admitted"
    finally:
        plane.close()
