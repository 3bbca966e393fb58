"""Shared fixtures: external-service gates that skip on a laptop and fail in CI."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from gates import IN_CI, require

__all__ = ["IN_CI", "require"]


@pytest.fixture
def tmux_binary() -> str:
    """Path of the tmux binary; skips (fails in CI) when tmux is not installed."""
    path = shutil.which("tmux")
    require(path is not None, "tmux is not installed")
    assert path is not None
    return path


POSTGRES_URL_VARIABLE = "ADMISSION_PLANE_TEST_POSTGRES_URL"


@contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """Create an empty PostgreSQL database on the server of ``ADMISSION_PLANE_TEST_POSTGRES_URL``,
    yield its URL, and drop it (closing any connection still open) afterwards.

    Without the variable, or with the server unreachable, the caller skips (fails in CI).
    """
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = os.environ.get(POSTGRES_URL_VARIABLE)
    require(bool(base), f"{POSTGRES_URL_VARIABLE} is not set")
    assert base is not None
    admin_url = make_url(base)
    if admin_url.drivername == "postgresql":
        admin_url = admin_url.set(drivername="postgresql+psycopg")
    name = f"ap_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as error:  # any failure to reach the server is the same verdict
        admin.dispose()
        require(False, f"PostgreSQL at {admin_url.render_as_string(hide_password=True)} is unreachable: {error}")
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped after the test (for tests that change the schema)."""
    with fresh_postgres_database() as url:
        yield url


@pytest.fixture(scope="session")
def postgres_session_url() -> Iterator[str]:
    """URL of one empty PostgreSQL database for the whole test run, dropped at its end.

    Whoever uses it resets it between tests (see ``tests/admission/conftest.py``).
    """
    with fresh_postgres_database() as url:
        yield url
