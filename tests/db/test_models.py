"""The schema (a2a_tune.db.models and the Alembic revisions in db/migrations/): the models
match what the migrations build, and Optuna's tables share the database without a clash.
On an SQLite file and on PostgreSQL (the `db_url` fixture)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from stored import new_run, sqlite_url

from a2a_tune.db import open_store, resolve_url
from a2a_tune.db.models import VERSION_TABLE, Base


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
        new_run(s)
    optuna.create_study(storage=url, study_name="after")
    with open_store(url) as s:
        assert len(s.runs()) == 1
    assert [st.study_name for st in optuna.get_all_study_summaries(storage=url)] == ["after"]

    # And the other way round: Optuna first in a fresh file.
    other = sqlite_url(tmp_path / "optuna-first.db")
    optuna.create_study(storage=other, study_name="before")
    with open_store(other) as s:
        assert s.runs() == []
