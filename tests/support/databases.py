"""Fresh databases for tests that run against SQLite and PostgreSQL alike.

PostgreSQL is used when ``$A2A_TUNE_TEST_POSTGRES_URL`` names a server (CI starts one, see
.ci/postgres.sh): a URL whose user may create databases, e.g.
``postgresql://postgres:secret@127.0.0.1:55432/postgres``. Each test gets a database of its
own, dropped afterwards; without the variable the PostgreSQL half of a test is skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POSTGRES_ENV = "A2A_TUNE_TEST_POSTGRES_URL"


def postgres_server() -> str | None:
    """The admin URL of the test PostgreSQL server, or None when none is configured."""
    return os.environ.get(POSTGRES_ENV) or None


@contextmanager
def fresh_postgres_database(server: str) -> Iterator[str]:
    """A new, empty database on `server` for the duration of the block; yields its URL."""
    import sqlalchemy as sa

    from a2a_tune.db import resolve_url

    admin_url = sa.engine.make_url(resolve_url(server))
    name = f"a2a_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield admin_url.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


def store_with_a_completed_run(path: Path) -> None:
    """An SQLite store at `path` with one completed run on h200.nvl18x2.node1: two backends
    at 1 and 64 tokens per rank, E=64, k=8, H=7168, bf16, EP 2, uniform."""
    from a2a_tune.db import open_store
    from a2a_tune.tuner.runtime.measurement import Measurement

    shape = dict(num_experts=64, topk=8, hidden=7168, dtype="bf16", ep_size=2, routing="uniform")
    with open_store(str(path)) as s:
        hw = s.get_or_create_hardware("h200.nvl18x2.node1", "h", {})
        run = s.start_run(hw, device_type="cuda", world_size=2, versions={}, git_sha=None, config={}, config_hash="c")
        for backend, us in (("allgather_reducescatter", 50.0), ("nccl_all2allv", 40.0)):
            for tokens in (1, 64):
                s.add_measurement(
                    run,
                    Measurement.from_columns(
                        dict(
                            backend=backend,
                            tokens_per_rank=tokens,
                            timing="eager",
                            median_us=us * tokens**0.5,
                            p10_us=us * tokens**0.5 * 0.95,
                            p90_us=us * tokens**0.5 * 1.05,
                            n=3,
                            samples=[us] * 3,
                            **shape,
                        )
                    ),
                )
        s.finish_run(run, "completed")


def measurement_count(url: str) -> int:
    """How many measurements the database at `url` (a URL or an SQLite path) holds; 0 while it
    has no schema yet or cannot be read (a sweep is still creating it)."""
    import sqlalchemy as sa

    from a2a_tune.db import resolve_url

    engine = sa.create_engine(resolve_url(url))
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT count(*) FROM measurements").scalar()
    except sa.exc.SQLAlchemyError:
        return 0
    finally:
        engine.dispose()
