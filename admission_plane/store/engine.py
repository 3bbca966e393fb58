"""Engine construction: the one place every database connection is configured.

SQLite: ``foreign_keys=ON``, ``journal_mode=WAL``, ``synchronous=FULL`` and a
``busy_timeout`` on every connection (a unit of work's writing transaction commits with
``synchronous=NORMAL`` and flushes after it leaves the writer gate:
:mod:`admission_plane.store.group_commit`); pysqlite's own transaction handling is switched
off (``isolation_level=None``) and transactions are begun explicitly, ``BEGIN IMMEDIATE``
by default, so a writer takes the database's write lock before it reads and waits on
``busy_timeout`` instead of failing mid-transaction (SQLAlchemy's documented pysqlite
recipe). A connection may ask for a deferred ``BEGIN`` with the execution option
``sqlite_begin="DEFERRED"`` (read-only work).

PostgreSQL (``postgresql+psycopg://``): ``READ COMMITTED``; operations that change
seats, starts or the queue serialise on a transaction-level advisory lock (see
:mod:`admission_plane.store.unit_of_work`). Statements are prepared on the server at
their first use on a connection (psycopg's ``prepare_threshold=0``; pass
``connect_args={"prepare_threshold": None}`` behind a pooler that cannot keep them), and a
pooled connection is checked with a round trip only when it has been idle for
:data:`PING_AFTER_IDLE_S` (a connector's back-to-back units do not pay one each; they do not even
borrow from the pool, but keep their connection for the engine's next unit:
:mod:`admission_plane.store.parking`). Each new
connection creates the admission index's functions in its temporary schema
(:mod:`admission_plane.store.session_functions`), unless ``prepare_threshold`` is ``None``.

The two ways a transaction begins share :data:`SQLITE_BEGIN`: the unit of work issues it on
the driver connection itself (the hot path never goes through a SQLAlchemy ``Connection``),
and every other reader or writer goes through a ``Connection`` whose ``begin`` hook issues
it (:func:`deferred` asks for the read-only form).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any
from urllib.parse import quote_plus

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError, NoSuchModuleError
from sqlalchemy.util import asbool

from .. import _validate as v
from ..errors import InvalidInputError
from . import group_commit, parking, session_functions

#: The environment variable naming the database when no URL is given (CLI, ``alembic``).
DATABASE_URL_VARIABLE = "ADMISSION_PLANE_DATABASE_URL"
DEFAULT_BUSY_TIMEOUT_MS = 5_000
#: A PostgreSQL connection idle in the pool this long is pinged before it is lent out again.
PING_AFTER_IDLE_S = 1.0
SQLITE_BEGIN_OPTION = "sqlite_begin"
#: How an SQLite transaction begins: a writer takes the write lock first, a reader does not.
SQLITE_BEGIN = {"IMMEDIATE": "BEGIN IMMEDIATE", "DEFERRED": "BEGIN"}
#: Query-string parameters whose values :func:`redacted_url` masks (matched anywhere in the name).
SECRET_PARAMETER = re.compile("password|passwd|pwd|secret|token", re.IGNORECASE)
MASK = "***"


def parse_url(url: str | URL | os.PathLike[str]) -> URL:
    """Accept a SQLAlchemy URL, or a filesystem path meaning an SQLite file.

    An SQLite file path, as a path or in a URL, is made absolute against the working directory
    at this call, as the driver makes it (``uri=true`` URLs are left as given).

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
        parsed = _anchored(parsed)
    elif backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
    else:
        raise InvalidInputError(f"unsupported database backend {backend!r} (use sqlite or postgresql)")
    return _clean(parsed)


def _anchored(url: URL) -> URL:
    """An SQLite ``url`` (with a database: :func:`parse_url` refused it otherwise) naming its file by the
    absolute path the driver opens.

    SQLAlchemy's pysqlite dialect opens ``os.path.abspath`` of a file path, taken once, when the engine is
    made; the writer gate and the doorbell beside the file are found from the URL
    (:func:`writer_lock_path`) at every unit. With a relative URL, a later ``chdir`` (a daemon's
    ``chdir("/")``) would put them beside another file while the data stays where it was: writers of
    one database would queue on different gates, and waiters would listen at a doorbell nobody rings
    (SQLite's own lock still serialises the writers, so this is slow, not wrong). Made absolute here
    the same way, URL, gate and file agree for the engine's life. A ``uri=true`` URL (a ``file:``
    URI, which SQLite reads itself) is left as given.
    """
    try:
        uri = asbool(url.query.get("uri", False))
    except ValueError:  # not a boolean: the engine refuses the URL (``_create_engine``), as it would anyway
        return url
    return url if uri else url.set(database=os.path.abspath(str(url.database)))


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
    connect_args = dict(engine_options.pop("connect_args", {}))
    connect_args.setdefault("prepare_threshold", 0)
    engine = _create_engine(parsed, connect_args=connect_args, **engine_options)
    if not engine_options.get("pool_pre_ping"):
        _install_idle_ping(engine)
        # SQLAlchemy's QueuePool defaults: 5 connections and 10 more on demand.
        size, overflow = engine_options.get("pool_size", 5), engine_options.get("max_overflow", 10)
        parking.enable(engine, PING_AFTER_IDLE_S, size, overflow)
    if connect_args["prepare_threshold"] is not None:  # None: behind a pooler, no session state
        event.listen(engine, "connect", session_functions.install)
    return engine


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
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA foreign_keys = ON")
            (journal_mode,) = cursor.execute("PRAGMA journal_mode = WAL").fetchone()
            record.info[group_commit.WAL_INFO] = group_commit.wal_file(dbapi_connection, journal_mode)
            cursor.execute("PRAGMA synchronous = FULL")
            record.info[group_commit.SYNCHRONOUS_INFO] = group_commit.STRICT
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(SQLITE_BEGIN_OPTION, "IMMEDIATE")
        group_commit.strict(connection.exec_driver_sql, connection.info)
        connection.exec_driver_sql(SQLITE_BEGIN[mode])


def _install_idle_ping(engine: Engine) -> None:
    """Ping a pooled PostgreSQL connection at checkout only if it sat idle for :data:`PING_AFTER_IDLE_S`.

    SQLAlchemy's ``pool_pre_ping`` costs a round trip (and psycopg's implicit ``BEGIN``, a
    second one) on every checkout, that is on every unit of work. A connection that was
    returned a moment ago is as alive as the pool can know without asking, so only one
    that sat idle is asked; a dead one is replaced by the pool (``DisconnectionError``).
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        kept_since = record.info.pop(parking.KEPT_SINCE, None)  # idle since a unit kept it (store.parking)
        record.info["idle_since"] = time.monotonic() if kept_since is None else kept_since

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return
        try:
            autocommit = dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            try:
                dbapi_connection.execute("SELECT 1")
            finally:
                dbapi_connection.autocommit = autocommit
        except engine.dialect.loaded_dbapi.Error as error:
            raise DisconnectionError(f"pooled connection failed its ping: {error}") from error


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
