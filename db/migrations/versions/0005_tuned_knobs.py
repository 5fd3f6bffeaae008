"""The knob search's best settings as our own rows (issue 36): ``tuned_knobs``.

Revision ID: 0005_tuned_knobs
Revises: 0004_ep
Create Date: 2026-12-07

Written by hand and frozen (no model imports). Before this revision the best settings lived
only in the user attributes of Optuna's studies in the same database. The upgrade copies each
finished a2a-tune study's best setting into the new table, read through Optuna's public API
(never its tables), so a store tuned before keeps its knobs through ``select``.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op

revision = "0005_tuned_knobs"
down_revision = "0004_ep"
branch_labels = None
depends_on = None

_PREFIX = "a2a-tune knobs: "  # the name every a2a-tune study had (tuner/studies.py)
_POINT = ("ep_size", "hidden", "topk", "num_experts", "dtype", "routing", "tokens_per_rank")


def _table() -> sa.Table:
    plain = ("fingerprint", "backend", *_POINT, "capacity", "timing", "default_us", "best_us", "study")
    return sa.table(
        "tuned_knobs",
        *(sa.column(n) for n in plain),
        sa.column("default_knobs", sa.JSON()),
        sa.column("best_knobs", sa.JSON()),
        sa.column("updated_at", sa.DateTime()),
    )


def upgrade() -> None:
    op.create_table(
        "tuned_knobs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("fingerprint", sa.String(length=200), nullable=False),
        sa.Column("backend", sa.String(length=64), nullable=False),
        sa.Column("num_experts", sa.Integer(), nullable=False),
        sa.Column("topk", sa.Integer(), nullable=False),
        sa.Column("hidden", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(length=32), nullable=False),
        sa.Column("ep_size", sa.Integer(), nullable=False),
        sa.Column("tokens_per_rank", sa.Integer(), nullable=False),
        sa.Column("routing", sa.String(length=64), nullable=False),
        sa.Column("capacity", sa.Integer(), nullable=True),
        sa.Column("timing", sa.String(length=16), nullable=True),
        sa.Column("default_knobs", sa.JSON(), nullable=False),
        sa.Column("default_us", sa.Double(), nullable=True),
        sa.Column("best_knobs", sa.JSON(), nullable=False),
        sa.Column("best_us", sa.Double(), nullable=True),
        sa.Column("study", sa.String(length=500), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tuned_knobs"),
        sa.UniqueConstraint("fingerprint", "backend", *_POINT, "capacity", name="uq_tuned_knobs_key"),
    )
    op.create_index("ix_tuned_knobs_fingerprint", "tuned_knobs", ["fingerprint"])
    rows = _studied()
    if rows:
        op.bulk_insert(_table(), rows)


def _studied() -> list[dict]:
    """One row per finished a2a-tune study of this database (none when Optuna never wrote here)."""
    bind = op.get_bind()
    if not sa.inspect(bind).has_table("studies"):
        return []
    url = bind.engine.url
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        return []  # Optuna cannot reach an in-memory database from another connection
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(
        url.render_as_string(hide_password=False), skip_compatibility_check=True, skip_table_creation=True
    )
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)  # as UTCDateTime stores it on SQLite
    found = {}
    try:
        summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    finally:
        storage.remove_session()
        storage.engine.dispose()
    for summary in summaries:  # oldest first
        a = summary.user_attrs
        if not summary.study_name.startswith(_PREFIX) or "best_knobs" not in a:
            continue  # another study, or a search stopped before its first result
        try:
            row = {n: a[n] for n in ("fingerprint", "backend", *_POINT)}
            row.update(capacity=a.get("capacity"), timing=a.get("timing") or None, study=summary.study_name)
            row.update(default_knobs=dict(a.get("default_knobs") or {}), default_us=a.get("default_us"))
            row.update(best_knobs=dict(a["best_knobs"]), best_us=a.get("best_us"), updated_at=now)
        except (KeyError, TypeError, ValueError):
            continue  # a study without the attributes a point needs: nothing to keep
        key = tuple(row[n] for n in ("fingerprint", "backend", *_POINT, "capacity"))
        found[key] = row  # the newest study of a point wins, as select took it
    return list(found.values())


def downgrade() -> None:
    op.drop_index("ix_tuned_knobs_fingerprint", table_name="tuned_knobs")
    op.drop_table("tuned_knobs")
