"""Opening a store's database: URLs, engines, read-only opening, the schema's migrations.

- **Any SQLAlchemy URL.** SQLite by default (``sqlite:///a2a_tune.db``, relative to the
  working directory); PostgreSQL through psycopg 3 (``pip install 'a2a-tune[postgres]'``),
  giving up connecting after ``PG_CONNECT_TIMEOUT_S``. Dialect settings live in
  ``_create_engine`` / ``_migrate`` alone.
- **Schema by migrations only.** A new or empty database is brought to head by the packaged
  Alembic revisions (never ``create_all``); an older one raises :class:`StoreOutdatedError`
  naming ``a2a-tune db upgrade --db <url>``, an unknown one :class:`StoreError`. Our version
  table has its own name (``models.VERSION_TABLE``): Optuna's ``alembic_version`` shares the URL.
- **Readers beside writers (SQLite).** WAL journal and a busy timeout: ``show`` reads while a
  sweep writes (WAL needs a local filesystem; on NFS use PostgreSQL). A writer switches to WAL
  only after its schema check passed: a refused store is left byte for byte as it was.
- **Read-only opening.** ``open_engine(url, readonly=True)`` never creates, migrates or writes,
  and leaves no file behind (SQLite ``mode=ro``, ``immutable=1`` while no writer has it open:
  :func:`readonly_url`; PostgreSQL READ ONLY sessions); read-only mounts can be read.
- **Errors are one line** (:class:`StoreError`, the original chained), and a URL's password
  is ``***`` in every message and in :func:`display_url`, also for URLs that do not parse.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy import Engine, column, create_engine, event, inspect, select, table
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from a2a_tune.tuner.runtime.environ import env_text
from a2a_tune.tuner.runtime.files import FileRefused, read_head
from a2a_tune.tuner.runtime.text import one_line

from .errors import EmptyStoreError, StoreError, StoreOutdatedError
from .models import VERSION_TABLE, Base

DEFAULT_URL = "sqlite:///a2a_tune.db"
ENV_VAR = "A2A_TUNE_DB"
SQLITE_BUSY_TIMEOUT_MS = 30_000
# An unreachable PostgreSQL host fails within this many seconds, not the OS's minutes of TCP
# retries; a ``connect_timeout`` in the URL's query wins.
PG_CONNECT_TIMEOUT_S = 10
# The PostgreSQL driver `pip install 'a2a-tune[postgres]'` brings; a URL naming none uses it
# (SQLAlchemy 2.0 would pick psycopg2, which we do not install).
PG_DRIVER = "postgresql+psycopg"
# Taken for the migration transaction on PostgreSQL, so sweeps opening one new database at
# once migrate it one after the other (any constant; "a2at" in ASCII).
PG_MIGRATION_LOCK = 0x61326174
MIGRATIONS_DIR = Path(__file__).resolve().with_name("migrations")


# --------------------------------------------------------------------------- URLs


def resolve_url(url: str | None = None) -> str:
    """The database URL to use: ``url``, else ``$A2A_TUNE_DB``, else :data:`DEFAULT_URL`.

    A plain filesystem path (no ``://``) becomes an SQLite URL: ``runs/h200.db`` ->
    ``sqlite:///runs/h200.db``, ``/data/a.db`` -> ``sqlite:////data/a.db``; ``~`` expands.
    An empty string counts as not given, and a blank ``$A2A_TUNE_DB`` as unset.
    ``postgresql://`` and ``postgres://`` name the psycopg 3 driver explicitly
    (``postgresql+psycopg://``).
    """
    if not url:
        url = env_text(ENV_VAR) or DEFAULT_URL  # blank: unset, never a file named by spaces
    if "://" not in url:
        url = "sqlite:///" + os.path.expanduser(url)
    scheme, rest = url.split("://", 1)
    if scheme in ("postgresql", "postgres"):
        url = f"{PG_DRIVER}://{rest}"
    return url


_CREDENTIALS = re.compile(r"(://[^\s:/@]*:)\S*@")
# libpq's and SQLAlchemy's parameters that are, or point at, secrets: in a URL's query
# (?password=...) or a keyword/value connection string (password=... passfile=...).
_SECRET_PARAMS = re.compile(
    r"(?i)(?<![A-Za-z0-9_])((?:ssl)?password|passwd|pwd|passfile|service|servicefile|sslkey|token|secret)"
    r"(\s*=\s*)(?:'[^']*'|\"[^\"]*\"|[^\s&;#'\"]*)"
)


def mask_secrets(text: str) -> str:
    """``text`` with every secret a database URL or connection string can carry shown as
    ``***``: the password of ``scheme://user:password@``, and the values of the parameters
    that are or name secrets (``password``, ``sslpassword``, ``passfile``, ``service``,
    ``sslkey``...), wherever they sit (also in URLs SQLAlchemy cannot parse, and in driver
    messages quoting them)."""
    return _SECRET_PARAMS.sub(r"\1\2***", _CREDENTIALS.sub(r"\1***@", str(text)))


def display_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    try:
        parsed = make_url(url)
    except Exception:  # unparsable: the creation step reports it
        return mask_secrets(url)
    if parsed.password is None:  # as typed: rendering percent-encodes, e.g. sqlite:///%3Amemory%3A
        return mask_secrets(url)
    return mask_secrets(parsed.render_as_string(hide_password=True))


def check_url(url: str | None = None, *, persistent: bool = False) -> str:
    """The resolved URL (see :func:`resolve_url`) if it parses, and with ``persistent`` if it is
    not an in-memory database (commands that store: their records must outlive them), and if
    its driver imports; else :class:`StoreError` in one line, password masked. Connects to nothing."""
    url = resolve_url(url)
    try:
        parsed = make_url(url)
    except Exception:
        raise StoreError(f"cannot open database {display_url(url)}: not a valid database URL") from None
    try:  # the driver, imported now: before any rank starts, not when the first rank connects
        parsed.get_dialect().import_dbapi()
    except ImportError as exc:
        hint = "; pip install 'a2a-tune[postgres]'" if parsed.get_backend_name() == "postgresql" else ""
        raise StoreError(
            f"cannot open database {display_url(url)}: its driver ({exc.name or parsed.get_driver_name()}) "
            f"is not installed{hint}"
        ) from None
    if persistent and is_in_memory(url):
        raise StoreError(
            f"{display_url(url)} is an in-memory database: nothing stored there outlives the command "
            "(and spawned ranks would each see their own); give a file (e.g. --db runs.db) or a server URL"
        )
    return url


def is_in_memory(url: str) -> bool:
    """True for an SQLite database that lives only in this process (``sqlite://``,
    ``sqlite:///:memory:``, ``mode=memory`` URIs): nothing written there outlives it, and
    spawned ranks would each see their own empty one."""
    try:
        parsed = make_url(resolve_url(url))
    except Exception:
        return False
    if not parsed.get_backend_name() == "sqlite":
        return False
    db = parsed.database or ""
    return db in ("", ":memory:") or db.startswith("file::memory:") or parsed.query.get("mode") == "memory"


def _one_line(exc: BaseException) -> str:
    """The driver's own message of ``exc``, first line only, without SQLAlchemy's
    statement dump and documentation link."""
    orig = getattr(exc, "orig", None)
    text = str(orig) if orig is not None else (str(exc.args[0]) if exc.args else "")
    first = text.strip().splitlines()[0] if text.strip() else ""  # SQLAlchemy's dump follows
    return one_line(mask_secrets(first)) or type(orig if orig is not None else exc).__name__


# PostgreSQL SQLSTATEs that mean the server went away: class 08 (connection exception) and
# admin/crash shutdown, "cannot connect now" (starting up or shutting down).
_PG_GONE = ("08", "57P01", "57P02", "57P03")


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (from SQLAlchemy) means the database server cannot be reached any more:
    SQLAlchemy saw the connection break, or a PostgreSQL driver failed without the server's
    answer (no SQLSTATE: refused, timed out, closed) or with a "server gone" one. SQLite
    errors never are (a file has no server)."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    orig = getattr(exc, "orig", None)
    if not isinstance(exc, OperationalError) or not (hasattr(orig, "sqlstate") or hasattr(orig, "pgcode")):
        return False
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return code is None or str(code).startswith(_PG_GONE)


@contextmanager
def _db_errors(what: str) -> Iterator[None]:
    """Turn driver/SQLAlchemy/Alembic failures into a one-line StoreError: ``what: cause``."""
    from alembic.util import CommandError

    try:
        yield
    except StoreError:
        raise
    except (SQLAlchemyError, CommandError, OSError) as exc:
        raise StoreError(f"{what}: {_one_line(exc)}") from exc


# --------------------------------------------------------------------------- engine


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_MS)}")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _use_wal(engine: Engine) -> None:
    """Switch a writer's SQLite database to WAL: readers never block the writer, the writer
    never blocks readers. Persistent in the file (it changes the header), so only once the
    schema check passed; an in-memory database answers "memory" and carries on."""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as conn:
        try:
            conn.exec_driver_sql("PRAGMA journal_mode = WAL")
        except SQLAlchemyError as exc:
            # A read-only file (permissions, ``?mode=ro&uri=true``) cannot switch journal
            # mode but can still be read; writes will report "readonly" themselves.
            if "readonly" not in str(exc):
                raise


def _sqlite_file(url: str) -> str | None:
    """The file of an SQLite URL (not in memory, not a ``file:`` URI), else None."""
    try:
        parsed = make_url(url)
    except Exception:
        return None
    db = parsed.database
    if parsed.get_backend_name() != "sqlite" or not db or db == ":memory:" or db.startswith("file:"):
        return None
    return db


def readonly_url(url: str | None) -> str:
    """The URL a reader opens ``url`` by (see :func:`resolve_url`): an SQLite file read-only
    (``mode=ro``), and ``immutable=1`` too when no ``-wal`` file lies next to it -- no writer
    has it open then (a writer's ``-wal`` lasts from its first read to its close), and SQLite
    creates no ``-wal``/``-shm`` files and takes no locks, so the reader leaves nothing
    behind. Other URLs are returned resolved (their read-only part is
    :func:`engine_options`)."""
    from urllib.parse import quote

    url = resolve_url(url)
    db = _sqlite_file(url)
    if db is None:
        return url
    path = os.path.abspath(db)
    options = "mode=ro"
    if not os.path.exists(path + "-wal"):
        options += "&immutable=1"
    return f"sqlite:///file:{quote(path)}?{options}&uri=true"


def engine_options(url: str | None, *, readonly: bool = False) -> dict[str, Any]:
    """The ``create_engine`` keyword arguments for ``url`` (see :func:`resolve_url`):
    PostgreSQL's connect timeout and, for a reader, READ ONLY transactions. With
    :func:`readonly_url`, what other libraries reading the store need (Optuna:
    ``RDBStorage(readonly_url(url), engine_kwargs=engine_options(url, readonly=True),
    skip_table_creation=True)``)."""
    try:
        parsed = make_url(resolve_url(url))
    except Exception:  # unparsable: create_engine says why
        return {}
    options: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        if "connect_timeout" not in parsed.query:
            options["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
        if readonly:
            options["execution_options"] = {"postgresql_readonly": True}
    return options


def _create_engine(url: str, *, readonly: bool = False) -> Engine:
    shown = display_url(url)
    try:
        parsed = make_url(url)
    except Exception:  # unparsable: create_engine says why below
        parsed = None
    try:
        engine = create_engine(readonly_url(url) if readonly else url, **engine_options(url, readonly=readonly))
    except ImportError as exc:
        hint = "; pip install 'a2a-tune[postgres]'" if parsed is not None and parsed.drivername == PG_DRIVER else ""
        raise StoreError(f"cannot open database {shown}: driver not installed ({exc}){hint}") from exc
    except (SQLAlchemyError, ValueError) as exc:
        raise StoreError(f"cannot open database {shown}: {_one_line(exc)}") from exc
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_on_connect)
    return engine


# --------------------------------------------------------------------------- migrations


def alembic_config(url: str | None = None) -> Any:
    """An Alembic ``Config`` for the packaged migrations (no alembic.ini needed).

    Used by the store itself and by developers writing a revision (see migrations/env.py).
    """
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    # New revision files are named by their id alone: --rev-id 0002_add_foo.
    cfg.set_main_option("file_template", "%%(rev)s")
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", resolve_url(url).replace("%", "%%"))
    return cfg


def _script_directory() -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The schema revision this code expects (the single head of the packaged history)."""
    return _script_directory().get_current_head()


class _SchemaState(NamedTuple):
    state: str  # "empty" | "head" | "outdated" | "unknown" | "unmanaged"
    current: str | None  # the database's revision(s), comma-joined; None at base


def _schema_state(engine: Engine, script: Any) -> _SchemaState:
    from alembic.util import CommandError

    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        if VERSION_TABLE not in tables:
            # Other tables (e.g. Optuna's) may live here; only ours make it "unmanaged".
            if tables & set(Base.metadata.tables):
                return _SchemaState("unmanaged", None)
            return _SchemaState("empty", None)
        # Read Alembic's version table directly: a MigrationContext would log at INFO on
        # every open (``a2a-tune show`` output).
        version = table(VERSION_TABLE, column("version_num"))
        heads = tuple(sorted(conn.scalars(select(version.c.version_num))))
    current = ",".join(heads) or None
    for rev in heads:
        try:
            known = script.get_revision(rev) is not None
        except CommandError:
            known = False
        if not known:
            return _SchemaState("unknown", current)
    if set(heads) == set(script.get_heads()):
        return _SchemaState("head", current)
    return _SchemaState("outdated", current)


def _migrate(engine: Engine) -> None:
    """Run the packaged migrations to head in one transaction on ``engine``."""
    from alembic import command

    cfg = alembic_config()
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            # Batch mode rebuilds tables (copy, drop, rename); with foreign keys enforced,
            # dropping a parent table would fail. The pragma is a no-op inside a
            # transaction, so it goes first. BEGIN IMMEDIATE takes the write lock up front:
            # pysqlite would otherwise run each DDL statement in autocommit, and two
            # processes creating the same new file would race.
            conn.exec_driver_sql("PRAGMA foreign_keys = OFF")
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        elif conn.dialect.name == "postgresql":
            # DDL is transactional there but two creators would both find no tables; this
            # lock (released at commit) makes the second wait and then find the schema done.
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK})")
        try:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            if sqlite:
                conn.exec_driver_sql("PRAGMA foreign_keys = ON")
                conn.commit()


def _check_or_migrate(
    engine: Engine, url: str, *, allow_upgrade: bool, readonly: bool = False
) -> tuple[str | None, str]:
    shown = display_url(url)
    with _db_errors(f"cannot open database {shown}"):
        script = _script_directory()
        head = script.get_current_head()
        before = _schema_state(engine, script)
    if readonly and before.state == "empty":
        raise EmptyStoreError(f"database {shown} holds no a2a-tune data (opened read-only: nothing created)")
    if before.state == "unknown":
        raise StoreError(
            f"database {shown} is at schema revision {before.current}, which this a2a-tune "
            f"does not know (written by a newer a2a-tune?); upgrade a2a-tune"
        )
    if before.state == "unmanaged":
        raise StoreError(
            f"database {shown} holds a2a-tune tables but no {VERSION_TABLE} table; it was not created by a2a-tune"
        )
    if before.state == "outdated" and not allow_upgrade:
        raise StoreOutdatedError(shown, before.current, head)
    if readonly:
        return before.current, head
    with _db_errors(f"cannot open database {shown}"):
        _use_wal(engine)  # a refused store is left as it was: nothing written before here
    if before.state == "head":
        return before.current, head
    with _db_errors(f"cannot migrate database {shown} to schema {head}"):
        try:
            _migrate(engine)
        except SQLAlchemyError:
            # Another process may have created the schema at the same moment (PostgreSQL
            # has no BEGIN IMMEDIATE); if the database is at head now, all is well.
            if _schema_state(engine, script).state != "head":
                raise
    return before.current, head


def open_engine(url: str, *, readonly: bool = False) -> Engine:
    """An engine on the database at ``url`` (resolved), its schema checked and, unless
    ``readonly``, created or left at head (see :func:`a2a_tune.db.store.open_store`)."""
    if readonly and _sqlite_file(url) is not None and not os.path.exists(_sqlite_file(url)):
        raise EmptyStoreError(f"no database at {_sqlite_file(url)} (opened read-only: nothing created)")
    engine = _create_engine(url, readonly=readonly)
    try:
        _check_or_migrate(engine, url, allow_upgrade=False, readonly=readonly)
    except BaseException:
        engine.dispose()
        raise
    return engine


def upgrade(url: str | None = None) -> tuple[str | None, str]:
    """Migrate the database at ``url`` to the head revision (``a2a-tune db upgrade``).

    Returns ``(revision before, revision after)``; before is None for an empty database or
    one stamped at the base. A database already at head is left alone. Raises
    :class:`EmptyStoreError` for an SQLite file that does not exist (nothing to upgrade:
    a store is created by the first command that writes to it) or is no regular file (a FIFO,
    a device, a directory), :class:`StoreError` for a database at an unknown (newer) revision.
    """
    url = resolve_url(url)
    path = _sqlite_file(url)
    if path is not None:  # the path as one escaped line: it may come from $A2A_TUNE_DB
        shown = one_line(path, 200)
        if not os.path.exists(path):
            raise EmptyStoreError(
                f"no database at {shown}: nothing to upgrade (a sweep creates its store when it starts)"
            )
        try:
            read_head(path, 1)  # a FIFO, a device or a directory is refused at once, never opened
        except FileRefused as exc:
            raise EmptyStoreError(f"{shown}: {exc}") from None
        except OSError:
            pass  # unreadable: the driver says so
    engine = _create_engine(url)
    try:
        return _check_or_migrate(engine, url, allow_upgrade=True)
    finally:
        engine.dispose()
