"""Engine construction: the one place every database connection is configured.

SQLite: ``foreign_keys=ON``, ``journal_mode=WAL``, ``synchronous=FULL`` and a
``busy_timeout`` on every connection; pysqlite's own transaction handling is switched
off (``isolation_level=None``) and transactions are begun explicitly, ``BEGIN IMMEDIATE``
by default, so a writer takes the database's write lock before it reads and waits on
``busy_timeout`` instead of failing mid-transaction (SQLAlchemy's documented pysqlite
recipe). A connection may ask for a deferred ``BEGIN`` with the execution option
``sqlite_begin="DEFERRED"`` (read-only work).

PostgreSQL (``postgresql+psycopg://``): ``READ COMMITTED``; operations that change
seats, starts or the queue serialise on a transaction-level advisory lock (see
:mod:`admission_plane.store.unit_of_work`).

The two ways a transaction begins share :data:`SQLITE_BEGIN`: the unit of work issues it on
the driver connection itself (the hot path never goes through a SQLAlchemy ``Connection``),
and every other reader or writer goes through a ``Connection`` whose ``begin`` hook issues
it (:func:`deferred` asks for the read-only form).
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import quote_plus

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from .. import _validate as v
from ..errors import InvalidInputError

#: The environment variable naming the database when no URL is given (CLI, ``alembic``).
DATABASE_URL_VARIABLE = "ADMISSION_PLANE_DATABASE_URL"
DEFAULT_BUSY_TIMEOUT_MS = 5_000
SQLITE_BEGIN_OPTION = "sqlite_begin"
#: How an SQLite transaction begins: a writer takes the write lock first, a reader does not.
SQLITE_BEGIN = {"IMMEDIATE": "BEGIN IMMEDIATE", "DEFERRED": "BEGIN"}
#: Query-string parameters whose values :func:`redacted_url` masks (matched anywhere in the name).
SECRET_PARAMETER = re.compile("password|passwd|pwd|secret|token", re.IGNORECASE)
MASK = "***"


def parse_url(url: str | URL | os.PathLike[str]) -> URL:
    """Accept a SQLAlchemy URL, or a filesystem path meaning an SQLite file.

    Raises :class:`InvalidInputError` for anything else: another type (bytes included),
    ``:memory:`` (which cannot be shared between connections or processes), and a path or
    URL holding a NUL or a lone surrogate (no driver can be handed one).
    """
    given: object = url  # checked as given: callers without type checking may pass anything
    if isinstance(given, URL):
        parsed = given
    else:
        text = v.path_text(given)
        if not text or text == ":memory:":
            raise InvalidInputError("database must be an SQLite file path or a database URL")
        if "://" not in text:
            return _clean(URL.create("sqlite+pysqlite", database=os.path.abspath(text)))
        try:
            parsed = make_url(text)
        except (ArgumentError, ValueError) as error:  # ValueError: a port that is not a number
            raise InvalidInputError(f"invalid database URL: {' '.join(str(error).split())}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise InvalidInputError("an in-memory SQLite database cannot hold a shared admission plane")
        if parsed.drivername == "sqlite":
            parsed = parsed.set(drivername="sqlite+pysqlite")
    elif backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
    else:
        raise InvalidInputError(f"unsupported database backend {backend!r} (use sqlite or postgresql)")
    return _clean(parsed)


def _clean(url: URL) -> URL:
    """``url`` if every part of it is text a driver can take (no NUL, UTF-8 encodable); else InvalidInputError."""
    values = [value for values in url.query.values() for value in ((values,) if isinstance(values, str) else values)]
    parts = [url.drivername, url.username, url.password, url.host, url.database, *url.query, *values]
    if not all(part is None or v.is_clean_text(part) for part in parts):
        raise InvalidInputError("database path or URL holds a NUL or a character that is not UTF-8 encodable")
    return url


def create_admission_engine(
    url: str | URL | os.PathLike[str],
    *,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    **engine_options: Any,
) -> Engine:
    """Create an engine configured for the admission plane (see the module docstring)."""
    parsed = parse_url(url)
    given: object = busy_timeout_ms  # checked as given: callers without type checking may pass anything
    if isinstance(given, bool) or not isinstance(given, int) or given < 0:
        raise InvalidInputError("busy_timeout_ms must be a non-negative integer")
    if parsed.get_backend_name() == "sqlite":
        connect_args = dict(engine_options.pop("connect_args", {}))
        connect_args.setdefault("check_same_thread", False)
        # The driver's busy handler waits this long for the write lock (seconds).
        connect_args.setdefault("timeout", busy_timeout_ms / 1000)
        engine = _create_engine(parsed, connect_args=connect_args, **engine_options)
        _install_sqlite_hooks(engine, busy_timeout_ms)
        return engine
    engine_options.setdefault("isolation_level", "READ COMMITTED")
    engine_options.setdefault("pool_pre_ping", True)
    return _create_engine(parsed, **engine_options)


def _create_engine(url: URL, **options: Any) -> Engine:
    try:
        return create_engine(url, **options)
    except (NoSuchModuleError, ImportError) as error:  # an unknown dialect, or its driver is not installed
        detail = " ".join(str(error).split())
        raise InvalidInputError(f"invalid database URL: driver {url.drivername} is not available ({detail})") from None
    except (ValueError, TypeError) as error:  # a query parameter the dialect cannot convert (?timeout=soon)
        raise InvalidInputError(f"invalid database URL: {' '.join(str(error).split())}") from None


def _install_sqlite_hooks(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = FULL")
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(SQLITE_BEGIN_OPTION, "IMMEDIATE")
        connection.exec_driver_sql(SQLITE_BEGIN[mode])


def deferred(connection: Connection) -> Connection:
    """``connection``, beginning its transactions read-only (SQLite: a deferred ``BEGIN``)."""
    return connection.execution_options(**{SQLITE_BEGIN_OPTION: "DEFERRED"})


def writer_lock_path(engine: Engine) -> str | None:
    """The sidecar file SQLite writers of this library queue on (``<database>-writer.lock``)."""
    if engine.dialect.name != "sqlite" or not engine.url.database:
        return None
    return f"{engine.url.database}-writer.lock"


def redacted_url(url: str | URL) -> str:
    """``url`` as shown to people (output, ``repr``, messages): every password masked with ``***``.

    The password of the user information and the value of every query parameter whose name
    contains ``password``, ``passwd``, ``pwd``, ``secret`` or ``token`` (any case) are masked;
    the rest is rendered as SQLAlchemy renders it (query parameters sorted by name).
    """
    parsed = url if isinstance(url, URL) else make_url(url)
    text = parsed.set(query={}).render_as_string(hide_password=True)
    if not parsed.query:
        return text
    pairs = [
        f"{quote_plus(name)}={MASK if SECRET_PARAMETER.search(name) else quote_plus(value)}"
        for name, values in sorted(parsed.query.items())
        for value in ((values,) if isinstance(values, str) else values)
    ]
    return f"{text}?{'&'.join(pairs)}"
