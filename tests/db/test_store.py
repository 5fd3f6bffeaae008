"""Behaviour of the measurement store (a2a_tune.db): CPU only. Tests taking `db_url` (or `store`)
run on an SQLite file and on a fresh PostgreSQL database (when $A2A_TUNE_TEST_POSTGRES_URL names
a server, see tests/support/databases.py); the others pin SQLite's own behaviour."""

from __future__ import annotations

import datetime as dt
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import paths
import pytest
import sqlalchemy as sa

import a2a_tune.db.store as store_mod
from a2a_tune.db import (
    DEFAULT_URL,
    DuplicateMeasurementError,
    MeasurementKey,
    NotFoundError,
    StoreError,
    StoreOutdatedError,
    Writer,
    head_revision,
    open_store,
    resolve_url,
    upgrade,
)
from a2a_tune.db.models import VERSION_TABLE, Base
from a2a_tune.tuner.runtime.point import MAX_TOKENS_PER_RANK, Point

FIXTURES = paths.FIXTURES / "db"

# One point, in the point's field order (the store's key: the backend, then these).
SHAPE = dict(ep_size=2, hidden=7168, topk=8, num_experts=64, dtype="bf16", routing="uniform", tokens_per_rank=128)
VERSIONS = {
    "torch": "2.11.0",
    "nccl": "2.27.3",
    "cuda": "12.9",
    "driver": "575.57",
    "triton": "3.4.0",
    "flashinfer": None,
    "python": "3.12.3",
    "a2a_tune": "0.1.0",
}


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def _measurement(**over):
    fields = dict(
        backend="nccl_all2allv",
        **SHAPE,
        timing="eager",
        median_us=41.5,
        p10_us=40.0,
        p90_us=44.25,
        ci_low_us=41.0,
        ci_high_us=42.0,
        n=5,
        host_median_us=55.0,
        samples=[40.0, 41.0, 41.5, 43.0, 44.5],
        knobs={"num_sms": 24},
    )
    fields.update(over)
    return fields


def _new_run(store, *, fingerprint="h200-sxm.nvl18x1.node1", facts_hash="f" * 64, config_hash="cfg1"):
    hw = store.get_or_create_hardware(fingerprint, facts_hash, {"gpus": [{"name": "NVIDIA H200"}] * 2})
    run = store.start_run(
        hw,
        device_type="cuda",
        world_size=2,
        versions=VERSIONS,
        git_sha="0123abc",
        config={"tokens": [1, 128], "backends": ["nccl_all2allv"], "iterations": 50},
        config_hash=config_hash,
    )
    return hw, run


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "store.db"


@pytest.fixture
def store(db_url):
    with open_store(db_url) as s:
        yield s


# ----------------------------------------------------------------------------- round trip


def test_round_trip_of_hardware_run_measurement_failure(db_url):
    facts = {"gpus": [{"name": "NVIDIA H200", "nvlinks": 18}], "nodes": 1}
    with open_store(db_url) as s:
        hw = s.get_or_create_hardware("h200-sxm.nvl18x1.node1", "abc123", facts)
        assert s.get_or_create_hardware("h200-sxm.nvl18x1.node1", "abc123", {"ignored": True}) == hw
        other_hw = s.get_or_create_hardware("h200-sxm.nvl18x1.node1", "def456", facts)
        assert other_hw != hw
        run = s.start_run(
            hw,
            device_type="cuda",
            world_size=2,
            versions=VERSIONS,
            git_sha=None,
            config={"tokens": [1, 2, 4], "routings": ["uniform", "skewed"]},
            config_hash="cfg-a",
        )
        m_id = s.add_measurement(run, **_measurement())
        f_id = s.add_failure(run, backend="nvlink_one_sided", kind="incorrect", reason="max abs err 0.5", **SHAPE)
        s.finish_run(run, "completed", summary={"points": 1})

    # Everything above is read back by a fresh store: nothing lived only in memory.
    with open_store(db_url) as s:
        h = s.get_hardware(hw)
        assert (h.fingerprint, h.facts_hash, h.facts) == ("h200-sxm.nvl18x1.node1", "abc123", facts)
        assert s.hardware_for_run(run) == h

        r = s.get_run(run)
        assert (r.status, r.device_type, r.world_size, r.git_sha) == ("completed", "cuda", 2, None)
        assert r.versions == VERSIONS and r.config["routings"] == ["uniform", "skewed"]
        assert (r.config_hash, r.summary, r.fingerprint, r.hardware_id) == ("cfg-a", {"points": 1}, h.fingerprint, hw)
        assert r.started_at.tzinfo is not None and r.finished_at is not None
        assert r.started_at <= r.finished_at <= dt.datetime.now(dt.timezone.utc)

        [m] = s.measurements(run)
        expected = _measurement()
        assert m.id == m_id and m.run_id == run
        assert {k: getattr(m, k) for k in expected} == expected
        assert m.key == MeasurementKey("nccl_all2allv", *SHAPE.values())
        assert m.created_at.tzinfo == dt.timezone.utc

        [f] = s.failures(run)
        assert (f.id, f.backend, f.kind, f.reason) == (f_id, "nvlink_one_sided", "incorrect", "max abs err 0.5")
        assert f.has_shape and f.key == MeasurementKey("nvlink_one_sided", *SHAPE.values())


def test_runs_newest_first_and_latest_run_filters(store):
    _, r1 = _new_run(store, fingerprint="h200-a")
    _, r2 = _new_run(store, fingerprint="l40s-b")
    _, r3 = _new_run(store, fingerprint="h200-a")
    store.finish_run(r1, "completed")
    store.finish_run(r2, "completed")
    store.finish_run(r3, "interrupted")

    assert [r.id for r in store.runs()] == [r3, r2, r1]
    assert [r.id for r in store.runs("h200-a")] == [r3, r1]
    assert store.runs("nope") == []
    assert store.latest_run().id == r2
    assert store.latest_run("h200-a").id == r1
    assert store.latest_run("h200-a", status=None).id == r3
    assert store.latest_run("h200-a", status="interrupted").id == r3
    assert store.latest_run("nope") is None


def test_numbers_are_normalised_and_bad_values_refused(store):
    class IndexLike:  # what numpy/torch integer scalars look like to us
        def __index__(self):
            return 64

    class FloatLike:
        def __float__(self):
            return 12.5

    _, run = _new_run(store)
    store.add_measurement(run, **_measurement(num_experts=IndexLike(), median_us=FloatLike(), knobs=None))
    [m] = store.measurements(run)
    assert (m.num_experts, m.median_us, m.knobs) == (64, 12.5, {})
    assert type(m.num_experts) is int and type(m.median_us) is float

    with pytest.raises(ValueError, match="median_us"):
        store.add_measurement(run, **_measurement(tokens_per_rank=1, median_us=float("nan")))
    with pytest.raises(ValueError, match="knobs"):
        store.add_measurement(run, **_measurement(tokens_per_rank=1, knobs={"x": object()}))
    with pytest.raises(ValueError, match="kind"):
        store.add_failure(run, backend="x", kind="flaky", reason="?")
    with pytest.raises(ValueError, match="status"):
        store.finish_run(run, "done")
    with pytest.raises(TypeError):
        store.add_measurement(run, **_measurement(), phase="decode")
    with pytest.raises(NotFoundError):
        store.add_measurement(run + 100, **_measurement())
    with pytest.raises(NotFoundError):
        store.get_run(run + 100)
    with pytest.raises(NotFoundError):
        store.start_run(999, device_type="cpu", world_size=1, versions={}, git_sha=None, config={}, config_hash="x")
    assert len(store.measurements(run)) == 1  # refused writes left nothing behind


def test_failure_reason_is_stored_on_one_line(store):
    _, run = _new_run(store)
    store.add_failure(run, backend="deepep", kind="error", reason="Traceback:\n  boom\n\nRuntimeError: x\n")
    [f] = store.failures(run)
    assert f.reason == "Traceback: boom RuntimeError: x"
    assert not f.has_shape and f.key is None


def test_duplicate_measurement_raises_and_keeps_the_first(store):
    _, run = _new_run(store)
    first = store.add_measurement(run, **_measurement(median_us=10.0))
    with pytest.raises(DuplicateMeasurementError) as info:
        store.add_measurement(run, **_measurement(median_us=99.0))
    assert info.value.key[0] == run and "nccl_all2allv" in str(info.value)
    # Same point timed another way is not a duplicate.
    store.add_measurement(run, **_measurement(timing="graph"))
    ms = store.measurements(run)
    assert [(m.id, m.median_us) for m in ms][0] == (first, 10.0) and len(ms) == 2


# ----------------------------------------------------------------------------- durability / resume


def test_measurement_survives_a_process_that_dies_without_closing(db_url):
    with open_store(db_url) as s:
        _, run = _new_run(s)
    script = textwrap.dedent(
        f"""
        import os, sys
        from a2a_tune.db import open_store
        store = open_store({db_url!r})
        mid = store.add_measurement({run}, backend="nccl_all2allv", num_experts=64, topk=8,
            hidden=7168, dtype="bf16", ep_size=2, tokens_per_rank=7, routing="skewed",
            timing="graph", median_us=3.25, p10_us=3.0, p90_us=4.0, n=2, samples=[3.0, 3.5])
        store.add_failure({run}, backend="deepep", kind="timeout", reason="no answer in 60 s")
        print(mid, flush=True)
        os._exit(0)  # no close, no commit at exit, no atexit handlers
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    mid = int(proc.stdout.strip())

    with open_store(db_url) as s:
        [m] = s.measurements(run)
        assert (m.id, m.tokens_per_rank, m.routing, m.samples) == (mid, 7, "skewed", [3.0, 3.5])
        assert [f.kind for f in s.failures(run)] == ["timeout"]


def test_done_keys_holds_measurements_and_shaped_failures_only(store):
    _, run = _new_run(store)
    _, other_run = _new_run(store, config_hash="other")
    store.add_measurement(run, **_measurement(timing="eager"))
    store.add_measurement(run, **_measurement(timing="graph"))  # same key, other timing
    store.add_failure(run, backend="nvlink_one_sided", kind="incorrect", reason="wrong rows", **SHAPE)
    store.add_failure(run, backend="flashinfer_nvlink_one_sided", kind="unavailable", reason="package not installed")
    partial = dict(SHAPE, tokens_per_rank=None)
    store.add_failure(run, backend="nvlink_low_latency", kind="error", reason="setup failed", **partial)
    store.add_measurement(other_run, **_measurement(backend="allgather_reducescatter"))

    keys = store.done_keys(run)
    shape = tuple(SHAPE.values())
    # Plain tuples compare and hash equal to MeasurementKey: the sweep may build either.
    assert keys == {("nccl_all2allv", *shape), ("nvlink_one_sided", *shape)}
    assert all(isinstance(k, MeasurementKey) for k in keys)
    assert MeasurementKey.of("nccl_all2allv", Point(**SHAPE)).point == Point(**SHAPE)
    assert store.done_keys(other_run) == {("allgather_reducescatter", *shape)}


def test_find_resumable_run(store):
    hw, r1 = _new_run(store, config_hash="A")
    assert store.find_resumable_run(hw, "A") == r1  # still "running" (the sweep died)
    assert store.find_resumable_run(hw, "B") is None
    other_hw = store.get_or_create_hardware("l40s", "x", {})
    assert store.find_resumable_run(other_hw, "A") is None

    store.finish_run(r1, "interrupted")
    assert store.find_resumable_run(hw, "A") == r1
    _, r2 = _new_run(store, config_hash="A")
    store.finish_run(r2, "failed")
    assert store.find_resumable_run(hw, "A") == r2  # the latest unfinished one

    me = Writer.this_process()
    store.claim_run(r2, me)
    assert store.get_run(r2).status == "running" and store.get_run(r2).finished_at is None
    store.finish_run(r2, "completed", writer=me)
    # A completed run with this config supersedes the older interrupted r1.
    assert store.find_resumable_run(hw, "A") is None


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


def test_open_store_uses_default_file_then_env_var(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("A2A_TUNE_DB", raising=False)
    with open_store() as s:
        _new_run(s)
    assert (tmp_path / "a2a_tune.db").is_file()

    env_file = tmp_path / "sub" / "env.db"
    env_file.parent.mkdir()
    monkeypatch.setenv("A2A_TUNE_DB", str(env_file))  # a plain path is fine
    with open_store() as s:
        assert s.runs() == []
        _new_run(s)
    assert env_file.is_file()
    with open_store(str(tmp_path / "a2a_tune.db")) as s:
        assert len(s.runs()) == 1


def test_read_only_database_can_be_read(tmp_path):
    db = tmp_path / "shipped.db"
    with open_store(_url(db)) as s:
        _, run = _new_run(s)
        s.add_measurement(run, **_measurement())
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode = DELETE")  # as a file copied off a cluster might be
    con.close()
    with open_store(f"sqlite:///file:{db}?mode=ro&uri=true") as s:
        assert [r.id for r in s.runs()] == [run]
        assert len(s.measurements(run)) == 1
        with pytest.raises(StoreError, match="readonly"):
            s.finish_run(run, "failed")
    with open_store(_url(db)) as s:
        assert s.get_run(run).status == "running"


def test_in_memory_database_works():
    with open_store("sqlite://") as s:
        _, run = _new_run(s)
        s.add_measurement(run, **_measurement())
        assert len(s.measurements(run)) == 1


def test_closed_store_refuses_use(db_url):
    s = open_store(db_url)
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        s.runs()


# ----------------------------------------------------------------------------- bad databases


def _assert_one_clean_line(message: str) -> None:
    assert message and "\n" not in message
    for noise in ("Traceback", "sqlalche.me", "[SQL", "Background on this error"):
        assert noise not in message


def test_garbage_file_raises_one_line_store_error_and_is_left_alone(db_path):
    garbage = bytes(range(256)) * 64
    db_path.write_bytes(garbage)
    with pytest.raises(StoreError) as info:
        open_store(_url(db_path))
    assert type(info.value) is StoreError
    message = str(info.value)
    _assert_one_clean_line(message)
    assert str(db_path) in message and "not a database" in message
    assert info.value.__cause__ is not None
    assert db_path.read_bytes() == garbage


def test_unopenable_path_raises_one_line_store_error(tmp_path):
    with pytest.raises(StoreError) as info:
        open_store(_url(tmp_path / "no" / "such" / "dir" / "x.db"))
    _assert_one_clean_line(str(info.value))
    assert info.value.__cause__ is not None


def test_bad_url_or_missing_driver_raises_store_error():
    with pytest.raises(StoreError) as info:
        open_store("nosuchdialect://host/db")
    _assert_one_clean_line(str(info.value))


def test_unknown_newer_revision_raises_store_error(db_url):
    open_store(db_url).close()
    _execute(db_url, f"UPDATE {VERSION_TABLE} SET version_num = '0099_from_the_future'")
    for attempt in (open_store, upgrade):
        with pytest.raises(StoreError) as info:
            attempt(db_url)
        assert not isinstance(info.value, StoreOutdatedError)
        _assert_one_clean_line(str(info.value))
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
        assert time.monotonic() - started < store_mod.PG_CONNECT_TIMEOUT_S + 5
        message = str(info.value)
        _assert_one_clean_line(message)
        assert "s3cret-pw" not in message and "***" in message
        assert ("refused" in message) if url is closed_port else ("password authentication failed" in message)


def test_tables_without_version_stamp_raise_store_error(db_path):
    engine = sa.create_engine(_url(db_path))
    Base.metadata.create_all(engine)  # what a careless tool might do
    engine.dispose()
    with pytest.raises(StoreError, match="not created by a2a-tune"):
        open_store(_url(db_path))


# ----------------------------------------------------------------------------- schema versions


def test_database_at_base_revision_is_outdated_and_upgrade_fixes_it(db_url):
    from alembic import command

    url = db_url
    open_store(url).close()
    command.downgrade(store_mod.alembic_config(url), "base")

    with pytest.raises(StoreOutdatedError) as info:
        open_store(url)
    message = str(info.value)
    _assert_one_clean_line(message)
    assert f"a2a-tune db upgrade --db {store_mod.display_url(resolve_url(url))}" in message
    assert (info.value.current, info.value.head) == (None, head_revision())

    assert upgrade(url) == (None, head_revision())
    assert upgrade(url) == (head_revision(), head_revision())  # already there: no-op
    with open_store(url) as s:
        _new_run(s)


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
        _, run = _new_run(s)
        s.add_measurement(run, **_measurement())
        s.add_failure(run, backend="deepep", kind="unavailable", reason="package not installed")
        old_head = head_revision()

    # "This release": the packaged history plus one more revision.
    migrations = tmp_path / "migrations"
    shutil.copytree(store_mod.MIGRATIONS_DIR, migrations, ignore=shutil.ignore_patterns("__pycache__"))
    (migrations / "versions" / "0002_test_run_note.py").write_text(NEXT_REVISION.format(head=old_head))
    monkeypatch.setattr(store_mod, "MIGRATIONS_DIR", migrations)
    assert head_revision() == "0002_test_run_note"

    with pytest.raises(StoreOutdatedError) as info:
        open_store(url)
    _assert_one_clean_line(str(info.value))
    assert f"a2a-tune db upgrade --db {store_mod.display_url(resolve_url(url))}" in str(info.value)
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
        _new_run(s)
        old_head = head_revision()
    migrations = tmp_path / "migrations"
    shutil.copytree(store_mod.MIGRATIONS_DIR, migrations, ignore=shutil.ignore_patterns("__pycache__"))
    (migrations / "versions" / "0002_test_fails_halfway.py").write_text(FAILING_REVISION.format(head=old_head))
    monkeypatch.setattr(store_mod, "MIGRATIONS_DIR", migrations)

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
    url = _url(db)
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


def test_models_match_the_migrated_schema(db_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    open_store(db_url).close()
    engine = sa.create_engine(resolve_url(db_url))

    def diff(metadata):
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
            return compare_metadata(ctx, metadata)

    try:
        assert diff(Base.metadata) == []
        # The comparison itself can see a difference (guards against a vacuous pass).
        altered = sa.MetaData()
        for table in Base.metadata.tables.values():
            table.to_metadata(altered)
        altered.tables["measurements"].append_column(sa.Column("extra", sa.Integer(), nullable=True))
        assert any(op[0] == "add_column" for op in diff(altered))
    finally:
        engine.dispose()


def test_coexists_with_optuna_in_one_database(db_url, tmp_path):
    optuna = pytest.importorskip("optuna")
    url = resolve_url(db_url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with open_store(url) as s:
        _new_run(s)
    optuna.create_study(storage=url, study_name="after")
    with open_store(url) as s:
        assert len(s.runs()) == 1
    assert [st.study_name for st in optuna.get_all_study_summaries(storage=url)] == ["after"]

    # And the other way round: Optuna first in a fresh file.
    other = _url(tmp_path / "optuna-first.db")
    optuna.create_study(storage=other, study_name="before")
    with open_store(other) as s:
        assert s.runs() == []


# ----------------------------------------------------------------------------- readers and writers


def test_sqlite_uses_wal_and_a_busy_timeout(db_path):
    store = open_store(_url(db_path))
    with store._engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == store_mod.SQLITE_BUSY_TIMEOUT_MS
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    store.close()


def test_second_reader_while_a_writer_holds_the_database(db_path, monkeypatch):
    # Shorter timeout: without WAL the blocked side gives up after 10 s instead of 30 s. Not
    # blocked is well under half of that, even on a loaded machine.
    monkeypatch.setattr(store_mod, "SQLITE_BUSY_TIMEOUT_MS", 10_000)
    url = _url(db_path)
    writer = open_store(url)
    _, run = _new_run(writer)
    writer.add_measurement(run, **_measurement())

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
        writer.add_measurement(run, **_measurement(timing="graph"))
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


def test_concurrent_writers_from_threads_lose_nothing(store):
    _, run = _new_run(store)
    errors = []

    def write(tokens):
        try:
            hw = store.get_or_create_hardware("shared", "hash", {})
            store.add_measurement(run, **_measurement(tokens_per_rank=tokens, knobs={"hw": hw}))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(1, 17)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ms = store.measurements(run)
    assert sorted(m.tokens_per_rank for m in ms) == list(range(1, 17))
    assert len({m.knobs["hw"] for m in ms}) == 1


def test_db_package_never_imports_tuner_or_torch():
    # except the stdlib leaf modules of tuner/runtime its key and messages come from
    leaves = (
        "('a2a_tune.tuner', 'a2a_tune.tuner.runtime', 'a2a_tune.tuner.runtime.point', 'a2a_tune.tuner.runtime.text')"
    )
    code = (
        "import sys, a2a_tune.db, a2a_tune.db.store, a2a_tune.db.models;"
        "a2a_tune.db.open_store('sqlite://').close();"
        f"bad = [m for m in sys.modules if m == 'torch' or m.startswith('a2a_tune.tuner') and m not in {leaves}];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("tokens", [0, MAX_TOKENS_PER_RANK + 1])
def test_the_store_refuses_a_token_count_outside_the_points_bound(store, tokens):
    """The one bound for token counts (runtime.point.check_tokens), as the CLI, the table and
    lookup hold it: nothing is written."""
    _, run = _new_run(store)
    with pytest.raises(ValueError, match=rf"tokens_per_rank must be in 1\.\.{MAX_TOKENS_PER_RANK}, got {tokens}"):
        store.add_measurement(run, **_measurement(tokens_per_rank=tokens))
    with pytest.raises(ValueError, match=rf"must be in 1\.\.{MAX_TOKENS_PER_RANK}, got {tokens}"):
        store.add_failure(
            run, backend="nvlink_one_sided", kind="error", reason="x", **dict(SHAPE, tokens_per_rank=tokens)
        )
    assert store.measurements(run) == [] and store.failures(run) == []
    store.add_measurement(run, **_measurement(tokens_per_rank=MAX_TOKENS_PER_RANK))  # the bound itself is a count
