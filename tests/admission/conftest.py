"""Fixtures for the admission plane: real database files (or PostgreSQL), migrated by Alembic."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from planes import CONTENT_KEY, CONTRACT_POLICY, ENCRYPTION_KEY

from admission_plane import AdmissionPlane


@pytest.fixture(params=["sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A migrated (Alembic head) database: a real SQLite file, or a fresh PostgreSQL database."""
    from admission_plane.migrate import upgrade

    if request.param == "sqlite":
        url = str(tmp_path / "admission.sqlite")
    else:
        url = request.getfixturevalue("postgres_url")
    upgrade(url)
    return url


@pytest.fixture
def make_plane(database_url: str) -> Iterator[Callable[..., AdmissionPlane]]:
    """Open planes on the test database (keys set, contract policy by default); all closed afterwards."""
    opened: list[AdmissionPlane] = []

    def factory(**options: Any) -> AdmissionPlane:
        options.setdefault("policy", CONTRACT_POLICY)
        options.setdefault("encryption_key", ENCRYPTION_KEY)
        options.setdefault("content_fingerprint_key", CONTENT_KEY)
        plane = AdmissionPlane(options.pop("database", database_url), **options)
        opened.append(plane)
        return plane

    yield factory
    for plane in opened:
        plane.close()


@pytest.fixture
def plane(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A plane with the contract policy and both keys."""
    return make_plane()
