"""Shared fixtures: external-service gates that skip on a laptop and fail in CI."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

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


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped after the test.

    The server comes from ``ADMISSION_PLANE_TEST_POSTGRES_URL``; without it the test
    skips (fails in CI, where ``.ci/run`` sets it).
    """
    import uuid

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
