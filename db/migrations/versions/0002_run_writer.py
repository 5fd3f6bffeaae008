"""Run lease: the one writer of a run (token, host, pid, pid scope, since) and its heartbeat.

Revision ID: 0002_run_writer
Revises: 0001_initial
Create Date: 2026-12-02

Written by hand and frozen (no model imports). Nullable columns only: runs stored before
this revision hold no lease, so any sweep may resume them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_run_writer"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("writer_token", lambda: sa.String(length=64)),
    ("writer_host", lambda: sa.String(length=255)),
    ("writer_pid", sa.Integer),
    ("writer_scope", lambda: sa.String(length=128)),
    ("writer_since", lambda: sa.DateTime(timezone=True)),
    ("heartbeat_at", lambda: sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name, kind in _COLUMNS:
            batch.add_column(sa.Column(name, kind(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name, _ in reversed(_COLUMNS):
            batch.drop_column(name)
