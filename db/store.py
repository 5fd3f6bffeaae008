"""The measurement store: open a database by URL, check its schema, read and write records.

Guarantees
----------
- **Any SQLAlchemy URL.** SQLite by default (``sqlite:///a2a_tune.db``, relative to the
  working directory); PostgreSQL (or any SQLAlchemy dialect) for a cluster-wide store:
  ``postgresql://user:password@host/db`` goes through psycopg 3 (``pip install
  'a2a-tune[postgres]'``) and gives up connecting after ``PG_CONNECT_TIMEOUT_S``.
  Dialect-specific settings live in one place (``_create_engine`` / ``_migrate``).
- **Schema by migrations only.** A new or empty database is brought to the head revision
  by the packaged Alembic revisions (never ``create_all``). A database at an older
  revision raises :class:`StoreOutdatedError` naming ``a2a-tune db upgrade --db <url>``;
  one at a revision this code does not know raises :class:`StoreError`. Alembic's version
  table is kept under our own name (``models.VERSION_TABLE``) so Optuna, which shares the
  URL and uses the default ``alembic_version``, never collides with us.
- **Every write commits before it returns.** A sweep killed at any point keeps every
  measurement and failure whose ``add_*`` call returned.
- **Readers and writers side by side (SQLite).** WAL journal and a busy timeout
  (``SQLITE_BUSY_TIMEOUT_MS``): ``a2a-tune show`` can read while a sweep writes, and the
  sweep's commits do not wait for readers. (WAL needs a local filesystem; for a store on
  NFS, use PostgreSQL.)
- **Plain values out.** Writes return integer ids; reads return frozen dataclasses
  (:class:`HardwareRecord`, :class:`RunRecord`, :class:`MeasurementRecord`,
  :class:`FailureRecord`), snapshots detached from any session. Unknown ids raise
  :class:`NotFoundError`; "nothing yet" answers are ``None`` or an empty list.
- **Errors are one line.** Driver and SQLAlchemy errors become :class:`StoreError` with a
  one-line message; the original is chained (``__cause__``).
- **Threads and processes.** Each call uses its own short session, so one Store may be
  shared by threads. Do not carry an open Store across ``fork``; open it in the process
  that writes (rank 0).
- **One writer per run.** A run is held by at most one :class:`Writer` at a time (its
  lease: token, host, pid, since, heartbeat in the ``runs`` row). Every write to a run --
  measurement, failure, finish -- first checks the lease in the same transaction, so a
  process that lost the run writes nothing and never changes another's status
  (:class:`LeaseLostError`); a write without a writer is refused while anyone holds the
  run. :meth:`Store.claim_run` takes a run over only when nobody holds it, its holder is
  silent for :data:`LEASE_STALE_S` seconds (:class:`LeaseHeartbeat` beats every
  :data:`HEARTBEAT_S`), or its holder's pid is dead on this same host (same boot and PID
  namespace); otherwise it raises :class:`RunBusyError` naming the holder. Lease times come
  from the writers' clocks: hosts sharing a store keep them within seconds (NTP).
- **Read-only opening.** ``open_store(url, readonly=True)`` never creates, migrates or
  writes: SQLite files open with ``mode=ro`` (and ``immutable=1`` in a directory this
  process cannot write, where no writer can be either); PostgreSQL sessions are READ ONLY.
- **Secrets stay out of messages.** A URL's password is shown as ``***`` in every error
  and in :func:`display_url`, also for URLs that do not parse.

Duplicate measurements: ``add_measurement`` with a key already stored for the run raises
:class:`DuplicateMeasurementError` (nothing is overwritten); the sweep consults
``done_keys`` first, so a duplicate means a bug worth hearing about.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import re
import socket
import threading
import uuid
from collections import namedtuple
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy import Engine, column, create_engine, event, inspect, select, table, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from a2a_tune.tuner.runtime.point import Point, check_tokens

from .errors import (
    DuplicateMeasurementError,
    EmptyStoreError,
    LeaseLostError,
    NotFoundError,
    RunBusyError,
    StoreError,
    StoreOutdatedError,
)
from .models import (
    DEVICE_TYPES,
    FAILURE_KINDS,
    KEY_FIELDS,
    RUN_STATUSES,
    VERSION_TABLE,
    Base,
    Failure,
    Hardware,
    Measurement,
    Run,
    utcnow,
)

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
MAX_REASON_CHARS = 2000
LEASE_STALE_S = 60.0  # a writer silent this long is taken for dead: its run may be taken over
HEARTBEAT_S = 10.0  # how often a live writer says so (LeaseHeartbeat); well inside LEASE_STALE_S


# --------------------------------------------------------------------------- URLs


def resolve_url(url: str | None = None) -> str:
    """The database URL to use: ``url``, else ``$A2A_TUNE_DB``, else :data:`DEFAULT_URL`.

    A plain filesystem path (no ``://``) becomes an SQLite URL: ``runs/h200.db`` ->
    ``sqlite:///runs/h200.db``, ``/data/a.db`` -> ``sqlite:////data/a.db``; ``~`` expands.
    An empty string counts as not given. ``postgresql://`` and ``postgres://`` name the
    psycopg 3 driver explicitly (``postgresql+psycopg://``).
    """
    if not url:
        url = os.environ.get(ENV_VAR) or DEFAULT_URL
    if "://" not in url:
        url = "sqlite:///" + os.path.expanduser(url)
    scheme, rest = url.split("://", 1)
    if scheme in ("postgresql", "postgres"):
        url = f"{PG_DRIVER}://{rest}"
    return url


_CREDENTIALS = re.compile(r"(://[^\s:/@]*:)\S*@")


def mask_secrets(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it shown as ``***``
    (also in URLs SQLAlchemy cannot parse, and in driver messages quoting them)."""
    return _CREDENTIALS.sub(r"\1***@", str(text))


def display_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # unparsable: the creation step reports it
        return mask_secrets(url)


def check_url(url: str | None = None, *, persistent: bool = False) -> str:
    """The resolved URL (see :func:`resolve_url`) if it parses, and with ``persistent`` if it is
    not an in-memory database (commands that store: their records must outlive them);
    else :class:`StoreError` in one line, password masked. Connects to nothing."""
    url = resolve_url(url)
    try:
        make_url(url)
    except Exception:
        raise StoreError(f"cannot open database {display_url(url)}: not a valid database URL") from None
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
    text = " ".join(text.strip().splitlines()[0].split()) if text.strip() else ""
    return mask_secrets(text) or type(orig if orig is not None else exc).__name__


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
        # WAL: readers never block the writer, the writer never blocks readers. Persistent
        # in the file; an in-memory database answers "memory" and carries on. This reads
        # the header, so a file that is not a database fails here, before anything is
        # written to it.
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
        except Exception as exc:
            # A read-only file (permissions, ``?mode=ro&uri=true``) cannot switch journal
            # mode but can still be read; writes will report "readonly" themselves.
            if "readonly" not in str(exc):
                raise
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


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


def _readonly_url(url: str) -> str:
    """An SQLite file URL opened read-only: ``mode=ro``; plus ``immutable=1`` where the
    directory is not writable and holds no ``-wal`` file (SQLite cannot create the WAL index
    there, and no process can be writing the database). Other URLs are returned as they are."""
    from urllib.parse import quote

    db = _sqlite_file(url)
    if db is None:
        return url
    path = os.path.abspath(db)
    options = "mode=ro"
    if not os.access(os.path.dirname(path), os.W_OK) and not os.path.exists(path + "-wal"):
        options += "&immutable=1"
    return f"sqlite:///file:{quote(path)}?{options}&uri=true"


def _create_engine(url: str, *, readonly: bool = False) -> Engine:
    shown = display_url(url)
    connect_args: dict[str, Any] = {}
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
            connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    except Exception:  # unparsable: create_engine says why below
        parsed = None
    try:
        if readonly:
            url = _readonly_url(url)
        engine = create_engine(url, connect_args=connect_args)
        if readonly and engine.dialect.name == "postgresql":
            engine = engine.execution_options(postgresql_readonly=True)
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


def open_store(url: str | None = None, *, readonly: bool = False) -> Store:
    """Open (creating if new or empty) the store at ``url`` (see :func:`resolve_url`).

    ``readonly``: for readers (show, select, report, diff): nothing is created, migrated or
    written, and a database in a read-only directory or on a read-only mount can be read.
    Raises :class:`StoreOutdatedError` for an older schema, :class:`StoreError` for a
    newer/unknown one, for a file that is not a database, or any failure to connect.
    """
    url = resolve_url(url)
    if readonly and _sqlite_file(url) is not None and not os.path.exists(_sqlite_file(url)):
        raise EmptyStoreError(f"no database at {_sqlite_file(url)} (opened read-only: nothing created)")
    engine = _create_engine(url, readonly=readonly)
    try:
        _check_or_migrate(engine, url, allow_upgrade=False, readonly=readonly)
    except BaseException:
        engine.dispose()
        raise
    return Store(engine, url)


def upgrade(url: str | None = None) -> tuple[str | None, str]:
    """Migrate the database at ``url`` to the head revision (``a2a-tune db upgrade``).

    Returns ``(revision before, revision after)``; before is None for a new database or
    one stamped at the base. A database already at head is left alone. Raises
    :class:`StoreError` for a database at an unknown (newer) revision.
    """
    url = resolve_url(url)
    engine = _create_engine(url)
    try:
        return _check_or_migrate(engine, url, allow_upgrade=True)
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- records


class MeasurementKey(namedtuple("MeasurementKey", KEY_FIELDS)):
    """What a sweep has done for one case: ``(backend, *point)`` in :data:`KEY_FIELDS` order
    (the backend, then :class:`~a2a_tune.tuner.runtime.point.Point`'s fields); equal (and
    hashing equal) to the plain tuple."""

    __slots__ = ()

    @classmethod
    def of(cls, backend: str, point: Point) -> MeasurementKey:
        return cls(backend, *point)

    @property
    def point(self) -> Point:
        return Point(*self[1:])


@dataclasses.dataclass(frozen=True)
class HardwareRecord:
    id: int
    fingerprint: str
    facts_hash: str
    facts: dict[str, Any]
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class RunRecord:
    id: int
    hardware_id: int
    fingerprint: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    status: str
    device_type: str
    world_size: int
    versions: dict[str, Any]
    git_sha: str | None
    config: dict[str, Any]
    config_hash: str
    summary: dict[str, Any] | None
    # The writer holding the run (None while nobody does) and its last heartbeat.
    writer_host: str | None = None
    writer_pid: int | None = None
    writer_since: dt.datetime | None = None
    heartbeat_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class MeasurementRecord:
    id: int
    run_id: int
    backend: str
    num_experts: int
    topk: int
    hidden: int
    dtype: str
    ep_size: int
    tokens_per_rank: int
    routing: str
    timing: str
    median_us: float
    p10_us: float
    p90_us: float
    ci_low_us: float | None
    ci_high_us: float | None
    n: int
    host_median_us: float | None
    samples: list[float]
    knobs: dict[str, Any]
    created_at: dt.datetime

    @property
    def key(self) -> MeasurementKey:
        return MeasurementKey(*(getattr(self, f) for f in KEY_FIELDS))


@dataclasses.dataclass(frozen=True)
class FailureRecord:
    id: int
    run_id: int
    backend: str
    kind: str
    reason: str
    num_experts: int | None
    topk: int | None
    hidden: int | None
    dtype: str | None
    ep_size: int | None
    tokens_per_rank: int | None
    routing: str | None
    created_at: dt.datetime

    @property
    def has_shape(self) -> bool:
        """True when every shape column is set (the failure is about one point)."""
        return all(getattr(self, f) is not None for f in KEY_FIELDS[1:])

    @property
    def key(self) -> MeasurementKey | None:
        if not self.has_shape:
            return None
        return MeasurementKey(*(getattr(self, f) for f in KEY_FIELDS))


def _record(cls: type, row: Any, **extra: Any) -> Any:
    names = [f.name for f in dataclasses.fields(cls) if f.name not in extra]
    return cls(**{n: getattr(row, n) for n in names}, **extra)


def _run_record(run: Run, fingerprint: str) -> RunRecord:
    record = _record(RunRecord, run, fingerprint=fingerprint)
    if run.writer_token is None:  # finished or never held: no current writer to show
        record = dataclasses.replace(record, writer_host=None, writer_pid=None, writer_since=None)
    return record


# --------------------------------------------------------------------------- writers


def _pid_scope() -> str:
    """Where a pid names one process: this boot (Linux boot id) and PID namespace; "" when
    unknown (then no pid is ever checked, only heartbeats)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process in this PID namespace."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    except OSError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # killed, not yet reaped: dead
    except (OSError, IndexError):
        return True


@dataclasses.dataclass(frozen=True)
class Writer:
    """The identity a process writes a run under (see "One writer per run" above).

    ``token`` is random and secret to the writer; ``host`` and ``pid`` name it to people;
    ``scope`` says where ``pid`` can be checked. A sweep makes one in the process the
    operator started and hands it to the rank that writes, so restarted ranks keep the run.
    """

    token: str
    host: str
    pid: int
    scope: str

    @classmethod
    def this_process(cls) -> Writer:
        return cls(uuid.uuid4().hex, socket.gethostname(), os.getpid(), _pid_scope())


class LeaseHeartbeat:
    """Keeps a writer's hold on a run fresh from a daemon thread (every ``interval`` s) while
    the writer's main thread measures. ``lost`` holds the reason once the run was taken
    over; the writer's next write raises :class:`LeaseLostError` anyway. A context manager."""

    def __init__(self, store: Store, run_id: int, writer: Writer, interval: float = HEARTBEAT_S) -> None:
        self.lost: str | None = None
        self._args = (store, run_id, writer)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"a2a-tune run {run_id} heartbeat", daemon=True)

    def _beat(self) -> None:
        store, run_id, writer = self._args
        while not self._stop.wait(self._interval):
            try:
                store.heartbeat(run_id, writer)
            except LeaseLostError as exc:
                self.lost = str(exc)
                return
            except StoreError:
                pass  # a busy or briefly unreachable database: the next beat tries again

    def __enter__(self) -> LeaseHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------- validation


def _json(name: str, value: Any) -> Any:
    """Refuse values that would not survive a JSON column on every backend (numpy
    scalars, NaN/inf: PostgreSQL rejects them) with a clear error, before any SQL."""
    import json

    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} is not storable as JSON: {exc}") from None
    return value


def _finite(name: str, value: Any, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {out}")
    return out


def _int(name: str, value: Any, *, optional: bool = False, minimum: int = 0) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    out = int(value.__index__())
    if out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {out}")
    return out


def _tokens(value: Any, *, optional: bool = False) -> int | None:
    """A token count per rank: the point's one bound (1..2^20), numpy/torch ints converted."""
    if value is None and optional:
        return None
    return check_tokens(_int("tokens_per_rank", value), "tokens_per_rank")


def _str(name: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _one_line_reason(reason: str) -> str:
    text = " ".join(part.strip() for part in str(reason).splitlines() if part.strip())
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 1] + "…"
    return text or "(no reason given)"


# --------------------------------------------------------------------------- store


class Store:
    """Reads and writes runs, measurements and failures. Obtain one with :func:`open_store`;
    see the module docstring for the guarantees. Usable as a context manager."""

    def __init__(self, engine: Engine, url: str) -> None:
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._closed = False
        self.url = url

    # -- lifecycle

    @property
    def display_url(self) -> str:
        return display_url(self.url)

    def close(self) -> None:
        """Release connections (SQLite: checkpoints the WAL). Idempotent."""
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.display_url!r}{', closed' if self._closed else ''})"

    @contextmanager
    def _session(self, what: str, *, conflicts: bool = False) -> Iterator[Session]:
        """One transaction, committed on success. ``conflicts=True`` lets IntegrityError
        through for the caller to interpret."""
        if self._closed:
            raise StoreError(f"store {self.display_url} is closed")
        try:
            with self._sessions.begin() as session:
                yield session
        except IntegrityError as exc:
            if conflicts:
                raise
            raise StoreError(f"{what} on {self.display_url} failed: {_one_line(exc)}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"{what} on {self.display_url} failed: {_one_line(exc)}") from exc

    @staticmethod
    def _run_or_raise(session: Session, run_id: int) -> Run:
        run = session.get(Run, run_id)
        if run is None:
            raise NotFoundError(f"no run {run_id} in this store")
        return run

    # -- hardware

    def get_or_create_hardware(self, fingerprint: str, facts_hash: str, facts: dict[str, Any]) -> int:
        """The id of the hardware row for (fingerprint, facts_hash), inserted if new.
        ``facts`` is stored only on insert (the hash identifies it)."""
        _str("fingerprint", fingerprint)
        _str("facts_hash", facts_hash)
        _json("facts", facts)
        query = select(Hardware.id).where(Hardware.fingerprint == fingerprint, Hardware.facts_hash == facts_hash)
        try:
            with self._session("recording hardware", conflicts=True) as s:
                found = s.scalar(query)
                if found is not None:
                    return found
                row = Hardware(fingerprint=fingerprint, facts_hash=facts_hash, facts=facts)
                s.add(row)
                s.flush()
                return row.id
        except IntegrityError as exc:
            # Another process inserted the same hardware between our read and write.
            with self._session("recording hardware") as s:
                found = s.scalar(query)
            if found is None:
                raise StoreError(f"recording hardware failed: {_one_line(exc)}") from exc
            return found

    def get_hardware(self, hardware_id: int) -> HardwareRecord:
        with self._session("reading hardware") as s:
            row = s.get(Hardware, hardware_id)
            if row is None:
                raise NotFoundError(f"no hardware {hardware_id} in this store")
            return _record(HardwareRecord, row)

    def hardware_for_run(self, run_id: int) -> HardwareRecord:
        with self._session("reading hardware") as s:
            run = self._run_or_raise(s, run_id)
            return _record(HardwareRecord, s.get(Hardware, run.hardware_id))

    # -- runs

    def start_run(
        self,
        hardware_id: int,
        *,
        device_type: str,
        world_size: int,
        versions: dict[str, Any],
        git_sha: str | None,
        config: dict[str, Any],
        config_hash: str,
        writer: Writer | None = None,
    ) -> int:
        """Insert a run with status "running", held by ``writer`` when given; returns its id."""
        if device_type not in DEVICE_TYPES:
            raise ValueError(f"device_type must be one of {DEVICE_TYPES}, got {device_type!r}")
        world_size = _int("world_size", world_size, minimum=1)
        _json("versions", versions)
        _json("config", config)
        _str("config_hash", config_hash)
        _str("git_sha", git_sha, optional=True)
        with self._session("starting a run") as s:
            if s.get(Hardware, hardware_id) is None:
                raise NotFoundError(f"no hardware {hardware_id} in this store")
            run = Run(
                hardware_id=hardware_id,
                status="running",
                device_type=device_type,
                world_size=world_size,
                versions=versions,
                git_sha=git_sha,
                config=config,
                config_hash=config_hash,
                **(self._lease_values(writer, utcnow()) if writer is not None else {}),
            )
            s.add(run)
            s.flush()
            return run.id

    def finish_run(
        self, run_id: int, status: str, summary: dict[str, Any] | None = None, *, writer: Writer | None = None
    ) -> None:
        """Set the final status ("completed", "interrupted" or "failed") and finished_at, and
        release the run; ``summary`` replaces the stored one when given. Only ``writer``, the
        run's holder, may (without a writer: only while nobody holds the run)."""
        if status not in RUN_STATUSES or status == "running":
            raise ValueError(f"finish status must be completed, interrupted or failed, got {status!r}")
        if summary is not None:
            _json("summary", summary)
        values: dict[str, Any] = {"status": status, "finished_at": utcnow(), "writer_token": None}
        if summary is not None:
            values["summary"] = summary
        with self._session("finishing a run") as s:
            self._fence(s, run_id, writer, values)

    # -- the run's one writer

    @staticmethod
    def _lease_values(writer: Writer, now: dt.datetime) -> dict[str, Any]:
        return {
            "writer_token": writer.token,
            "writer_host": writer.host[:255],
            "writer_pid": writer.pid,
            "writer_scope": writer.scope[:128],
            "writer_since": now,
            "heartbeat_at": now,
        }

    def _fence(self, s: Session, run_id: int, writer: Writer | None, values: dict[str, Any] | None = None) -> None:
        """The first statement of every write to a run: an UPDATE of its row that matches only
        while ``writer`` holds it (None: while nobody does), refreshing the heartbeat. It takes
        the row's write lock, so a takeover cannot slip between the check and the write."""
        held = Run.writer_token.is_(None) if writer is None else Run.writer_token == writer.token
        if values is None:
            values = {"heartbeat_at": utcnow()} if writer is not None else {"writer_token": None}
        elif writer is not None and "writer_token" not in values:
            values = {**values, "heartbeat_at": utcnow()}
        if s.execute(update(Run).where(Run.id == run_id, held).values(**values)).rowcount == 1:
            return
        row = s.get(Run, run_id)
        if row is None:
            raise NotFoundError(f"no run {run_id} in this store")
        if writer is None:
            raise self._busy(row)
        holder = f"now held by host {row.writer_host}, pid {row.writer_pid}" if row.writer_token else "released"
        raise LeaseLostError(
            f"run {run_id} is no longer held by this process (pid {writer.pid}): {holder}; nothing was written"
        )

    @staticmethod
    def _busy(row: Run, stale_after: float = LEASE_STALE_S) -> RunBusyError:
        return RunBusyError(row.id, row.writer_host, row.writer_pid, row.writer_since, row.heartbeat_at, stale_after)

    def claim_run(self, run_id: int, writer: Writer, *, stale_after: float = LEASE_STALE_S) -> None:
        """Take ``run_id`` for ``writer`` and mark it "running" again (``--resume``).

        Succeeds when nobody holds the run, ``writer`` already does (restarted ranks), the
        holder's last heartbeat is older than ``stale_after`` seconds, or the holder's pid is
        dead on this host. Otherwise raises :class:`RunBusyError` naming the holder (host,
        pid, since). A completed run is not resumed (:class:`StoreError`)."""
        now = utcnow()
        with self._session("claiming a run") as s:
            row = s.execute(
                select(Run.id, Run.status, Run.writer_token, Run.writer_pid, Run.writer_scope, Run.heartbeat_at).where(
                    Run.id == run_id
                )
            ).first()
            if row is None:
                raise NotFoundError(f"no run {run_id} in this store")
            if row.status == "completed":
                raise StoreError(f"run {run_id} is completed: nothing to resume")
            if row.writer_token not in (None, writer.token):
                stale = row.heartbeat_at is None or (now - row.heartbeat_at).total_seconds() > stale_after
                dead = bool(row.writer_scope) and row.writer_scope == writer.scope and not _pid_alive(row.writer_pid)
                if not (stale or dead):
                    raise self._busy(s.get(Run, run_id), stale_after)
            # Compare and swap: the holder (and its heartbeat) seen above, else someone moved first.
            same = [
                Run.status == row.status,
                Run.writer_token.is_(None) if row.writer_token is None else Run.writer_token == row.writer_token,
                Run.heartbeat_at.is_(None) if row.heartbeat_at is None else Run.heartbeat_at == row.heartbeat_at,
            ]
            values: dict[str, Any] = {"status": "running", "finished_at": None, **self._lease_values(writer, now)}
            if row.writer_token == writer.token:
                del values["writer_since"]  # still the same writer since it first took the run
            if s.execute(update(Run).where(Run.id == run_id, *same).values(**values)).rowcount != 1:
                raise self._busy(s.get(Run, run_id), stale_after)

    def heartbeat(self, run_id: int, writer: Writer) -> None:
        """Say ``writer`` is alive and still writing ``run_id``; raises :class:`LeaseLostError`
        when it no longer holds it."""
        with self._session("refreshing a run's heartbeat") as s:
            self._fence(s, run_id, writer)

    def find_resumable_run(self, hardware_id: int, config_hash: str) -> int | None:
        """The latest run on this hardware with this config hash, if it is not completed
        (running, interrupted or failed); None when there is none or the latest one
        completed (a newer completed run supersedes older unfinished ones). A "running"
        run may be a live sweep: the caller decides whether to take it over."""
        with self._session("finding a run to resume") as s:
            row = s.execute(
                select(Run.id, Run.status)
                .where(Run.hardware_id == hardware_id, Run.config_hash == config_hash)
                .order_by(Run.started_at.desc(), Run.id.desc())
                .limit(1)
            ).first()
        if row is None or row.status == "completed":
            return None
        return row.id

    def _run_query(self):  # noqa: ANN202 - internal
        return (
            select(Run, Hardware.fingerprint)
            .join(Hardware, Run.hardware_id == Hardware.id)
            .order_by(Run.started_at.desc(), Run.id.desc())
        )

    def get_run(self, run_id: int) -> RunRecord:
        with self._session("reading a run") as s:
            row = s.execute(self._run_query().where(Run.id == run_id)).first()
            if row is None:
                raise NotFoundError(f"no run {run_id} in this store")
            return _run_record(row[0], row[1])

    def runs(self, fingerprint: str | None = None) -> list[RunRecord]:
        """All runs, newest first; only those on ``fingerprint`` when given."""
        query = self._run_query()
        if fingerprint is not None:
            query = query.where(Hardware.fingerprint == fingerprint)
        with self._session("listing runs") as s:
            return [_run_record(run, fp) for run, fp in s.execute(query)]

    def latest_run(self, fingerprint: str | None = None, status: str | None = "completed") -> RunRecord | None:
        """The newest run (on ``fingerprint`` if given) with ``status`` (any if None)."""
        query = self._run_query().limit(1)
        if fingerprint is not None:
            query = query.where(Hardware.fingerprint == fingerprint)
        if status is not None:
            query = query.where(Run.status == status)
        with self._session("reading runs") as s:
            row = s.execute(query).first()
            return None if row is None else _run_record(row[0], row[1])

    # -- measurements and failures

    def add_measurement(
        self,
        run_id: int,
        *,
        backend: str,
        num_experts: int,
        topk: int,
        hidden: int,
        dtype: str,
        ep_size: int,
        tokens_per_rank: int,
        routing: str,
        timing: str,
        median_us: float,
        p10_us: float,
        p90_us: float,
        n: int,
        samples: list[float],
        ci_low_us: float | None = None,
        ci_high_us: float | None = None,
        host_median_us: float | None = None,
        knobs: dict[str, Any] | None = None,
        writer: Writer | None = None,
    ) -> int:
        """Store one timed case, committed before returning; returns its id.

        Numbers may be numpy/torch scalars (converted); ``samples`` in µs. Raises
        :class:`DuplicateMeasurementError` when (run, key, timing) is already stored, and
        :class:`LeaseLostError` / :class:`RunBusyError` when ``writer`` does not hold the run
        (see :meth:`finish_run`).
        """
        row = Measurement(
            run_id=run_id,
            backend=_str("backend", backend),
            num_experts=_int("num_experts", num_experts, minimum=1),
            topk=_int("topk", topk, minimum=1),
            hidden=_int("hidden", hidden, minimum=1),
            dtype=_str("dtype", dtype),
            ep_size=_int("ep_size", ep_size, minimum=1),
            tokens_per_rank=_tokens(tokens_per_rank),
            routing=_str("routing", routing),
            timing=_str("timing", timing),
            median_us=_finite("median_us", median_us),
            p10_us=_finite("p10_us", p10_us),
            p90_us=_finite("p90_us", p90_us),
            ci_low_us=_finite("ci_low_us", ci_low_us, optional=True),
            ci_high_us=_finite("ci_high_us", ci_high_us, optional=True),
            n=_int("n", n),
            host_median_us=_finite("host_median_us", host_median_us, optional=True),
            samples=[_finite("samples[]", v) for v in samples],
            knobs=_json("knobs", dict(knobs or {})),
        )
        key = (run_id, *(getattr(row, f) for f in KEY_FIELDS), row.timing)
        try:
            with self._session("adding a measurement", conflicts=True) as s:
                self._fence(s, run_id, writer)
                s.add(row)
                s.flush()
                return row.id
        except IntegrityError as exc:
            with self._session("adding a measurement") as s:
                clash = s.scalar(
                    select(Measurement.id).where(
                        Measurement.run_id == run_id,
                        Measurement.timing == row.timing,
                        *(getattr(Measurement, f) == getattr(row, f) for f in KEY_FIELDS),
                    )
                )
            if clash is not None:
                raise DuplicateMeasurementError(key) from exc
            raise StoreError(f"adding a measurement failed: {_one_line(exc)}") from exc

    def add_failure(
        self,
        run_id: int,
        *,
        backend: str,
        kind: str,
        reason: str,
        num_experts: int | None = None,
        topk: int | None = None,
        hidden: int | None = None,
        dtype: str | None = None,
        ep_size: int | None = None,
        tokens_per_rank: int | None = None,
        routing: str | None = None,
        writer: Writer | None = None,
    ) -> int:
        """Record why ``backend`` was not timed, committed before returning; returns its id.

        Leave the shape out for a failure that is not about one point ("unavailable").
        A multi-line ``reason`` is joined into one line (and capped at MAX_REASON_CHARS).
        """
        if kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind must be one of {FAILURE_KINDS}, got {kind!r}")
        row = Failure(
            run_id=run_id,
            backend=_str("backend", backend),
            kind=kind,
            reason=_one_line_reason(reason),
            num_experts=_int("num_experts", num_experts, optional=True, minimum=1),
            topk=_int("topk", topk, optional=True, minimum=1),
            hidden=_int("hidden", hidden, optional=True, minimum=1),
            dtype=_str("dtype", dtype, optional=True),
            ep_size=_int("ep_size", ep_size, optional=True, minimum=1),
            tokens_per_rank=_tokens(tokens_per_rank, optional=True),
            routing=_str("routing", routing, optional=True),
        )
        with self._session("adding a failure") as s:
            self._fence(s, run_id, writer)
            s.add(row)
            s.flush()
            return row.id

    def done_keys(self, run_id: int) -> set[MeasurementKey]:
        """Keys a resumed sweep can skip: those of the run's measurements (any timing) and
        of its failures that carry a full shape. Shapeless failures ("unavailable") are
        not points, so they add nothing."""
        m_cols = [getattr(Measurement, f) for f in KEY_FIELDS]
        f_cols = [getattr(Failure, f) for f in KEY_FIELDS]
        with self._session("reading done keys") as s:
            self._run_or_raise(s, run_id)
            keys = {MeasurementKey(*r) for r in s.execute(select(*m_cols).where(Measurement.run_id == run_id))}
            shaped = [getattr(Failure, f).is_not(None) for f in KEY_FIELDS[1:]]
            keys.update(MeasurementKey(*r) for r in s.execute(select(*f_cols).where(Failure.run_id == run_id, *shaped)))
        return keys

    def measurements(self, run_id: int) -> list[MeasurementRecord]:
        """The run's measurements in insertion order."""
        with self._session("reading measurements") as s:
            self._run_or_raise(s, run_id)
            rows = s.scalars(select(Measurement).where(Measurement.run_id == run_id).order_by(Measurement.id))
            return [_record(MeasurementRecord, r) for r in rows]

    def failures(self, run_id: int) -> list[FailureRecord]:
        """The run's failures in insertion order."""
        with self._session("reading failures") as s:
            self._run_or_raise(s, run_id)
            rows = s.scalars(select(Failure).where(Failure.run_id == run_id).order_by(Failure.id))
            return [_record(FailureRecord, r) for r in rows]
