"""Opening a store's database (a2a_tune.db.engine): URLs and secrets, bad databases, schema
versions and migrations, SQLite's journal and busy timeout, read-only opening, and what a
refusal or a reader leaves behind (nothing). Tests taking `db_url` run on an SQLite file and
on a fresh PostgreSQL database (when $A2A_TUNE_TEST_POSTGRES_URL names a server)."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time

import paths
import pytest
import sqlalchemy as sa
from stored import assert_one_clean_line, measurement, new_run, sqlite_url, start_run

import a2a_tune.db.engine as engine_mod
from a2a_tune.db import (
    DEFAULT_URL,
    EmptyStoreError,
    StoreError,
    StoreOutdatedError,
    display_url,
    engine_options,
    head_revision,
    mask_secrets,
    open_store,
    readonly_url,
    resolve_url,
    upgrade,
)
from a2a_tune.db.engine import connection_lost
from a2a_tune.db.models import VERSION_TABLE, Base

FIXTURES = paths.FIXTURES / "db"
SECRET_URL = "postgresql+psycopg2://u:secret@[::1:5432/x"


# ----------------------------------------------------------------------------- URLs


def test_resolve_url(monkeypatch, tmp_path):
    monkeypatch.delenv("A2A_TUNE_DB", raising=False)
    assert resolve_url(None) == DEFAULT_URL == "sqlite:///a2a_tune.db"
    assert resolve_url("") == DEFAULT_URL
    # PostgreSQL through psycopg 3 (the [postgres] extra), whatever SQLAlchemy's default driver
    assert resolve_url("postgresql://u:p@db/a2a") == "postgresql+psycopg://u:p@db/a2a"
    assert resolve_url("postgres://u:p@db/a2a") == "postgresql+psycopg://u:p@db/a2a"
    assert resolve_url("postgresql+psycopg2://u:p@db/a2a") == "postgresql+psycopg2://u:p@db/a2a"
    assert resolve_url("runs/h200.db") == "sqlite:///runs/h200.db"
    assert resolve_url(str(tmp_path / "x.db")) == f"sqlite:///{tmp_path}/x.db"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_url("~/x.db") == f"sqlite:///{tmp_path}/x.db"
    monkeypatch.setenv("A2A_TUNE_DB", "sqlite:///from-env.db")
    assert resolve_url(None) == "sqlite:///from-env.db"
    assert resolve_url("sqlite:///arg.db") == "sqlite:///arg.db"  # the argument wins


def test_masking_covers_urls_that_do_not_parse():
    assert display_url(SECRET_URL) == "postgresql+psycopg2://u:***@[::1:5432/x"
    assert mask_secrets(f"cannot parse '{SECRET_URL}' or postgresql://a:p@ss@h/d") == (
        "cannot parse 'postgresql+psycopg2://u:***@[::1:5432/x' or postgresql://a:***@h/d"
    )


# ----------------------------------------------------------------------------- bad databases


def test_garbage_file_raises_one_line_store_error_and_is_left_alone(db_path):
    garbage = bytes(range(256)) * 64
    db_path.write_bytes(garbage)
    with pytest.raises(StoreError) as info:
        open_store(sqlite_url(db_path))
    assert type(info.value) is StoreError
    message = str(info.value)
    assert_one_clean_line(message)
    assert str(db_path) in message and "not a database" in message
    assert info.value.__cause__ is not None
    assert db_path.read_bytes() == garbage


def test_unopenable_path_raises_one_line_store_error(tmp_path):
    with pytest.raises(StoreError) as info:
        open_store(sqlite_url(tmp_path / "no" / "such" / "dir" / "x.db"))
    assert_one_clean_line(str(info.value))
    assert info.value.__cause__ is not None


def test_bad_url_or_missing_driver_raises_store_error():
    with pytest.raises(StoreError) as info:
        open_store("nosuchdialect://host/db")
    assert_one_clean_line(str(info.value))


def test_unknown_newer_revision_raises_store_error(db_url):
    open_store(db_url).close()
    _execute(db_url, f"UPDATE {VERSION_TABLE} SET version_num = '0099_from_the_future'")
    for attempt in (open_store, upgrade):
        with pytest.raises(StoreError) as info:
            attempt(db_url)
        assert not isinstance(info.value, StoreOutdatedError)
        assert_one_clean_line(str(info.value))
        assert "0099_from_the_future" in str(info.value) and "newer" in str(info.value)


def _execute(url: str, sql: str) -> None:
    engine = sa.create_engine(resolve_url(url))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


def _columns(url: str, table_name: str) -> list[str]:
    engine = sa.create_engine(resolve_url(url))
    try:
        with engine.connect() as conn:
            return [c["name"] for c in sa.inspect(conn).get_columns(table_name)]
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(resolve_url(url))
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_unreachable_or_unauthenticated_postgres_is_one_line_without_the_password(db_url):
    good = sa.engine.make_url(db_url)
    closed_port = sa.engine.make_url(db_url).set(port=1, password="s3cret-pw")  # nothing listens on port 1
    wrong_password = good.set(password="s3cret-pw")
    for url in (closed_port, wrong_password):
        text = url.render_as_string(hide_password=False)
        started = time.monotonic()
        with pytest.raises(StoreError) as info:
            open_store(text)
        assert time.monotonic() - started < engine_mod.PG_CONNECT_TIMEOUT_S + 5
        message = str(info.value)
        assert_one_clean_line(message)
        assert "s3cret-pw" not in message and "***" in message
        assert ("refused" in message) if url is closed_port else ("password authentication failed" in message)


def test_tables_without_version_stamp_raise_store_error(db_path):
    engine = sa.create_engine(sqlite_url(db_path))
    Base.metadata.create_all(engine)  # what a careless tool might do
    engine.dispose()
    with pytest.raises(StoreError, match="not created by a2a-tune"):
        open_store(sqlite_url(db_path))


class _PgError(Exception):
    """What a PostgreSQL driver raises: an error with the server's SQLSTATE (None: the
    client failed before any answer -- refused, timed out, closed)."""

    def __init__(self, message, sqlstate):
        super().__init__(message)
        self.sqlstate = sqlstate


def _wrapped(cls, orig, invalidated=False):
    return cls.instance("SELECT 1", {}, orig, Exception, connection_invalidated=invalidated)


def test_a_lost_server_is_told_from_other_database_errors():
    refused = _PgError(
        'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused', None
    )
    assert connection_lost(_wrapped(sa.exc.OperationalError, refused))
    assert connection_lost(_wrapped(sa.exc.OperationalError, _PgError("terminating connection", "57P01")))
    assert connection_lost(_wrapped(sa.exc.OperationalError, _PgError("connection failure", "08006")))
    # SQLAlchemy saw the connection break (its dialect's own disconnect test)
    assert connection_lost(_wrapped(sa.exc.DBAPIError, Exception("server closed the connection"), invalidated=True))
    # the server answered: not lost
    assert not connection_lost(_wrapped(sa.exc.OperationalError, _PgError("could not serialize access", "40001")))
    assert not connection_lost(_wrapped(sa.exc.OperationalError, _PgError("password authentication failed", "28P01")))
    assert not connection_lost(_wrapped(sa.exc.IntegrityError, _PgError("duplicate key", "23505")))
    # SQLite has no server: a locked or read-only file is never a lost connection
    assert not connection_lost(_wrapped(sa.exc.OperationalError, sqlite3.OperationalError("database is locked")))
    assert not connection_lost(ValueError("not a database error"))


# ----------------------------------------------------------------------------- schema versions


def test_database_at_base_revision_is_outdated_and_upgrade_fixes_it(db_url):
    from alembic import command

    url = db_url
    open_store(url).close()
    command.downgrade(engine_mod.alembic_config(url), "base")

    with pytest.raises(StoreOutdatedError) as info:
        open_store(url)
    message = str(info.value)
    assert_one_clean_line(message)
    assert f"a2a-tune db upgrade --db {engine_mod.display_url(resolve_url(url))}" in message
    assert (info.value.current, info.value.head) == (None, head_revision())

    assert upgrade(url) == (None, head_revision())
    assert upgrade(url) == (head_revision(), head_revision())  # already there: no-op
    with open_store(url) as s:
        new_run(s)


NEXT_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "0002_test_run_note"
down_revision = "{head}"
branch_labels = None
depends_on = None


def _recreate():
    # "always" rebuilds the parent table on SQLite (copy, drop, rename) while children
    # reference it: the path that fails if foreign keys stay enforced. PostgreSQL alters.
    return "always" if op.get_bind().dialect.name == "sqlite" else "auto"


def upgrade():
    with op.batch_alter_table("runs", recreate=_recreate()) as batch:
        batch.add_column(sa.Column("note", sa.String(64), nullable=True))


def downgrade():
    with op.batch_alter_table("runs", recreate=_recreate()) as batch:
        batch.drop_column("note")
"""


def test_older_schema_is_refused_until_upgraded_with_data_intact(db_url, tmp_path, monkeypatch):
    url = db_url
    with open_store(url) as s:  # a database written by "the previous release"
        _, run = new_run(s)
        s.add_measurement(run, measurement())
        s.add_failure(run, backend="deepep", kind="unavailable", reason="package not installed")
        old_head = head_revision()

    # "This release": the packaged history plus one more revision.
    migrations = tmp_path / "migrations"
    shutil.copytree(engine_mod.MIGRATIONS_DIR, migrations, ignore=shutil.ignore_patterns("__pycache__"))
    (migrations / "versions" / "0002_test_run_note.py").write_text(NEXT_REVISION.format(head=old_head))
    monkeypatch.setattr(engine_mod, "MIGRATIONS_DIR", migrations)
    assert head_revision() == "0002_test_run_note"

    with pytest.raises(StoreOutdatedError) as info:
        open_store(url)
    assert_one_clean_line(str(info.value))
    assert f"a2a-tune db upgrade --db {engine_mod.display_url(resolve_url(url))}" in str(info.value)
    assert info.value.current == old_head

    assert upgrade(url) == (old_head, "0002_test_run_note")
    with open_store(url) as s:
        assert [m.median_us for m in s.measurements(run)] == [41.5]
        assert [f.backend for f in s.failures(run)] == ["deepep"]
    assert "note" in _columns(url, "runs")
    if url.startswith("sqlite"):  # batch mode rebuilt the parent table: references intact
        with sqlite3.connect(url.removeprefix("sqlite:///")) as con:
            assert con.execute("PRAGMA foreign_key_check").fetchall() == []
            assert {row[2] for row in con.execute("PRAGMA foreign_key_list(measurements)")} == {"runs"}
        con.close()


FAILING_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "0002_test_fails_halfway"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("half_done", sa.Column("id", sa.Integer, primary_key=True))
    op.add_column("runs", sa.Column("note", sa.String(64), nullable=True))
    raise RuntimeError("migration bug")


def downgrade():
    pass
"""


def test_a_failing_migration_leaves_the_database_as_it_was(db_url, tmp_path, monkeypatch):
    url = db_url
    with open_store(url) as s:
        new_run(s)
        old_head = head_revision()
    migrations = tmp_path / "migrations"
    shutil.copytree(engine_mod.MIGRATIONS_DIR, migrations, ignore=shutil.ignore_patterns("__pycache__"))
    (migrations / "versions" / "0002_test_fails_halfway.py").write_text(FAILING_REVISION.format(head=old_head))
    monkeypatch.setattr(engine_mod, "MIGRATIONS_DIR", migrations)

    with pytest.raises(RuntimeError, match="migration bug"):
        upgrade(url)
    # one transaction: all of it rolled back
    assert "half_done" not in _tables(url)
    assert "note" not in _columns(url, "runs")
    engine = sa.create_engine(resolve_url(url))
    with engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").fetchall() == [(old_head,)]
    engine.dispose()
    with pytest.raises(StoreOutdatedError):
        open_store(url)


def test_committed_schema1_database_still_opens(tmp_path):
    """tests/fixtures/db/schema1.db was written by the first release (see README there)."""
    db = tmp_path / "schema1.db"
    shutil.copyfile(FIXTURES / "schema1.db", db)
    url = sqlite_url(db)
    assert upgrade(url)[0] == "0001_initial"
    with open_store(url) as s:
        [run] = s.runs()
        assert (run.fingerprint, run.status, run.world_size) == ("h200-sxm.nvl18x1.node1", "completed", 2)
        assert run.versions["torch"] == "2.11.0"
        assert [(m.backend, m.tokens_per_rank, m.median_us) for m in s.measurements(run.id)] == [
            ("allgather_reducescatter", 128, 52.0),
            ("nccl_all2allv", 128, 41.5),
        ]
        assert s.done_keys(run.id) == {
            ("allgather_reducescatter", 2, 7168, 8, 64, "bf16", "uniform", 128),
            ("nccl_all2allv", 2, 7168, 8, 64, "bf16", "uniform", 128),
            ("nvlink_one_sided", 2, 7168, 8, 64, "bf16", "uniform", 128),
        }
        assert {f.kind for f in s.failures(run.id)} == {"incorrect", "unavailable"}
        # measured before the figures: they read as not measured, the round trip stands alone
        assert all(m.figures == {} for m in s.measurements(run.id))


def test_committed_schema2_database_upgrades_and_reads_without_figures(tmp_path):
    """tests/fixtures/db/schema2.db was written by the release before 0003_figures (README there);
    `a2a-tune db upgrade` brings it to head and every measurement reads as before."""
    db = tmp_path / "schema2.db"
    shutil.copyfile(FIXTURES / "schema2.db", db)
    url = sqlite_url(db)
    with pytest.raises(StoreOutdatedError, match="a2a-tune db upgrade --db"):
        open_store(url)
    r = subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.cli", "db", "upgrade", "--db", url], capture_output=True, text=True
    )
    assert r.returncode == 0 and f"upgraded from 0002_run_writer to {head_revision()}" in r.stdout, r.stderr
    assert upgrade(url) == (head_revision(), head_revision()) == ("0006_run_launch", "0006_run_launch")
    r = subprocess.run(
        [sys.executable, "-m", "a2a_tune.tuner.cli", "db", "upgrade", "--db", url], capture_output=True, text=True
    )
    assert r.returncode == 0 and f"is at the current schema ({head_revision()})" in r.stdout, r.stderr
    with open_store(url) as s:
        [run] = s.runs()
        assert (run.fingerprint, run.status, run.versions["torch"]) == ("h200.nvl18x2.node1", "completed", "2.12.0")
        rows = s.measurements(run.id)
        assert [(m.backend, m.timing, m.median_us) for m in rows] == [
            ("allgather_reducescatter", "eager", 48.0),
            ("nccl_all2allv", "eager", 39.5),
            ("nvlink_one_sided", "graph", 21.25),
        ]
        assert all(m.figures == {} for m in rows)
        # the upgraded store takes the figures of a new measurement beside the old ones
        s.add_measurement(run.id, measurement(tokens_per_rank=256, dispatch_median_us=20.0, workspace_bytes=1))
        assert s.measurements(run.id)[-1].figures == {"dispatch_us": 20.0, "workspace_bytes": 1}


def test_committed_schema5_database_upgrades_and_its_run_has_no_command_start(tmp_path):
    """tests/fixtures/db/schema5.db was written by the release before 0006_run_launch (README
    there): upgraded, its run reads with no command start or resume (not recorded then), show
    keeps saying its span is the measuring alone, and a new run records its command's start."""
    import datetime as dt

    from typer.testing import CliRunner

    from a2a_tune.tuner.cli import app

    db = tmp_path / "schema5.db"
    shutil.copyfile(FIXTURES / "schema5.db", db)
    url = sqlite_url(db)
    assert upgrade(url) == ("0005_tuned_knobs", head_revision())
    with open_store(url) as s:
        [run] = s.runs()
        assert (run.fingerprint, run.status, run.versions["torch"]) == ("h200.nvl18x2.node1", "completed", "2.12.0")
        assert (run.launched_at, run.resumed_at) == (None, None) and run.started_at < run.finished_at
        assert [(m.backend, m.median_us) for m in s.measurements(run.id)] == [
            ("allgather_reducescatter", 48.0),
            ("nccl_all2allv", 39.5),
        ]
        launched = dt.datetime.now(dt.timezone.utc)
        new = start_run(s, run.hardware_id, config={}, config_hash="c", launched_at=launched)
        assert s.get_run(new).launched_at == launched
    r = CliRunner().invoke(app, ["show", "--db", str(db), "--run", str(run.id)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "s of measuring; the ranks' start-up before it is not recorded)" in r.stdout, r.stdout


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(directory) -> list[tuple[str, str]]:
    return sorted((p.name, _sha(p)) for p in directory.iterdir())


def _sqlite_execute(path, *statements) -> None:
    con = sqlite3.connect(path)
    try:
        for sql in statements:
            con.execute(sql)
        con.commit()
    finally:
        con.close()


@pytest.mark.parametrize("journal", ["delete", "wal"])
@pytest.mark.parametrize("schema", ["newer", "older", "not ours"])
def test_a_refused_store_is_left_byte_for_byte_as_it_was(tmp_path, journal, schema):
    db = tmp_path / "store.db"
    with open_store(sqlite_url(db)) as s:
        _, run = new_run(s)
        s.add_measurement(run, measurement())
    change = {
        "newer": f"UPDATE {VERSION_TABLE} SET version_num = '0099_from_the_future'",
        "older": f"DELETE FROM {VERSION_TABLE}",  # stamped at the base: an upgrade is needed
        "not ours": f"DROP TABLE {VERSION_TABLE}",
    }[schema]
    # A file copied off a cluster may be in rollback-journal mode: switching it to WAL would
    # rewrite its header.
    _sqlite_execute(db, change, f"PRAGMA journal_mode = {journal}")
    before = _files(tmp_path)
    refused = StoreOutdatedError if schema == "older" else StoreError
    for attempt in (open_store, lambda url: open_store(url, readonly=True)) + ((upgrade,) if schema != "older" else ()):
        with pytest.raises(refused):
            attempt(sqlite_url(db))
        assert _files(tmp_path) == before, attempt


# ----------------------------------------------------------------------------- readers and writers


def test_sqlite_uses_wal_and_a_busy_timeout(db_path):
    store = open_store(sqlite_url(db_path))
    with store._engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == engine_mod.SQLITE_BUSY_TIMEOUT_MS
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    store.close()


def test_second_reader_while_a_writer_holds_the_database(db_path, monkeypatch):
    # Shorter timeout: without WAL the blocked side gives up after 10 s instead of 30 s. Not
    # blocked is well under half of that, even on a loaded machine.
    monkeypatch.setattr(engine_mod, "SQLITE_BUSY_TIMEOUT_MS", 10_000)
    url = sqlite_url(db_path)
    writer = open_store(url)
    _, run = new_run(writer)
    writer.add_measurement(run, measurement())

    # 1. A writer in the middle of a transaction (uncommitted row): a second process-like
    #    reader opens the store and reads committed data at once.
    raw_writer = sqlite3.connect(db_path, isolation_level=None, timeout=0)
    raw_writer.execute("BEGIN IMMEDIATE")
    raw_writer.execute("UPDATE runs SET status = 'failed'")
    try:
        started = time.monotonic()
        with open_store(url) as reader:
            assert reader.get_run(run).status == "running"
            assert len(reader.measurements(run)) == 1
        assert time.monotonic() - started < 5
    finally:
        raw_writer.execute("ROLLBACK")
        raw_writer.close()

    # 2. A reader in the middle of a long read (e.g. `a2a-tune show` paging): the sweep's
    #    commits go through without waiting, and the reader keeps its snapshot.
    raw_reader = sqlite3.connect(db_path, isolation_level=None, timeout=0)
    raw_reader.execute("BEGIN")
    assert raw_reader.execute("SELECT count(*) FROM measurements").fetchone() == (1,)
    try:
        started = time.monotonic()
        writer.add_measurement(run, measurement(timing="graph"))
        assert time.monotonic() - started < 5
        assert raw_reader.execute("SELECT count(*) FROM measurements").fetchone() == (1,)
    finally:
        raw_reader.execute("COMMIT")
    assert raw_reader.execute("SELECT count(*) FROM measurements").fetchone() == (2,)
    raw_reader.close()
    writer.close()


def test_processes_creating_one_new_database_at_once(db_url):
    script = textwrap.dedent(
        f"""
        from a2a_tune.db import open_store
        with open_store({db_url!r}) as s:
            hw = s.get_or_create_hardware("h200", "same", {{}})
            print(s.start_run(hw, device_type="cpu", world_size=1, versions={{}}, git_sha=None,
                              config={{}}, config_hash="x"))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert all(rc == 0 for _, _, rc in results), [err for _, err, _ in results]
    with open_store(db_url) as s:
        runs = s.runs()
        assert sorted(r.id for r in runs) == sorted(int(out) for out, _, _ in results)
        assert len({r.hardware_id for r in runs}) == 1


# ----------------------------------------------------------------------------- read-only opening


def test_read_only_database_can_be_read(tmp_path):
    db = tmp_path / "shipped.db"
    with open_store(sqlite_url(db)) as s:
        _, run = new_run(s)
        s.add_measurement(run, measurement())
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode = DELETE")  # as a file copied off a cluster might be
    con.close()
    with open_store(f"sqlite:///file:{db}?mode=ro&uri=true") as s:
        assert [r.id for r in s.runs()] == [run]
        assert len(s.measurements(run)) == 1
        with pytest.raises(StoreError, match="readonly"):
            s.finish_run(run, "failed")
    with open_store(sqlite_url(db)) as s:
        assert s.get_run(run).status == "running"


def test_a_read_only_store_refuses_writes_and_creates_nothing(tmp_path):
    with pytest.raises(StoreError, match="no database at .*missing.db"):
        open_store(str(tmp_path / "missing.db"), readonly=True)
    assert not (tmp_path / "missing.db").exists()
    db = tmp_path / "r.db"
    with open_store(str(db)) as s:
        _, run = new_run(s)
    with open_store(str(db), readonly=True) as s:
        (record,) = s.runs()
        with pytest.raises(StoreError, match="readonly"):
            s.finish_run(record.id, "failed")


def test_a_reader_leaves_no_file_behind_and_sees_a_live_writers_commits(tmp_path):
    db = tmp_path / "store.db"
    with open_store(sqlite_url(db)) as s:
        _, run = new_run(s)
        s.add_measurement(run, measurement())
    before = _files(tmp_path)
    assert [name for name, _ in before] == ["store.db"]  # the writer closed: its -wal and -shm went with it
    with open_store(sqlite_url(db), readonly=True) as reader:
        assert len(reader.measurements(run)) == 1
    assert _files(tmp_path) == before  # no -wal, no -shm, not a byte changed

    # With a writer at work its commits are in its -wal: a reader must see them (not open the
    # file as immutable) and adds no file of its own.
    writer = open_store(sqlite_url(db))
    try:
        writer.add_measurement(run, measurement(tokens_per_rank=256))
        assert (tmp_path / "store.db-wal").exists()
        live = sorted(p.name for p in tmp_path.iterdir())
        with open_store(sqlite_url(db), readonly=True) as reader:
            assert sorted(m.tokens_per_rank for m in reader.measurements(run)) == [128, 256]
        assert sorted(p.name for p in tmp_path.iterdir()) == live
    finally:
        writer.close()


def test_the_read_only_url_and_engine_options(tmp_path):
    db = tmp_path / "a b.db"
    with open_store(sqlite_url(db)):
        assert "mode=ro&uri=true" in readonly_url(str(db)) and "immutable" not in readonly_url(str(db))
    assert readonly_url(str(db)) == f"sqlite:///file:{tmp_path}/a%20b.db?mode=ro&immutable=1&uri=true"
    assert readonly_url("postgresql://u:p@h/d") == "postgresql+psycopg://u:p@h/d"
    assert readonly_url("sqlite://") == "sqlite://"
    assert engine_options(str(db), readonly=True) == {}
    assert engine_options("postgresql://u:p@h/d") == {
        "connect_args": {"connect_timeout": engine_mod.PG_CONNECT_TIMEOUT_S}
    }
    assert engine_options("postgresql://u:p@h/d?connect_timeout=3", readonly=True) == {
        "execution_options": {"postgresql_readonly": True}
    }
    # what another library's engine gets from them reads and cannot write
    engine = sa.create_engine(readonly_url(str(db)), **engine_options(str(db), readonly=True))
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM runs").scalar() == 0
            with pytest.raises(sa.exc.OperationalError, match="readonly"):
                conn.exec_driver_sql("DELETE FROM runs")
    finally:
        engine.dispose()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_read_only_postgres_store_cannot_write(db_url):
    with open_store(db_url) as s:
        _, run = new_run(s)
    with open_store(db_url, readonly=True) as s:
        assert [r.id for r in s.runs()] == [run]
        with pytest.raises(StoreError, match="read-only transaction"):
            s.finish_run(run, "failed")
    engine = sa.create_engine(readonly_url(db_url), **engine_options(db_url, readonly=True))
    try:
        with engine.connect() as conn, pytest.raises(sa.exc.InternalError, match="read-only transaction"):
            conn.exec_driver_sql("DELETE FROM runs")
    finally:
        engine.dispose()


def test_upgrade_refuses_a_file_that_does_not_exist(tmp_path):
    missing = tmp_path / "typo.db"
    with pytest.raises(EmptyStoreError) as info:
        upgrade(str(missing))
    assert_one_clean_line(str(info.value))
    assert f"no database at {missing}: nothing to upgrade" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing created
