"""When a run's command began (issue 37): ``runs.launched_at`` and ``runs.resumed_at``.

Revision ID: 0006_run_launch
Revises: 0005_tuned_knobs
Create Date: 2026-12-08

Written by hand and frozen (no model imports). Nullable columns only: runs stored before this
revision recorded only when their ranks opened the run (``started_at``), not when the command
that started them began, and read as such (``show`` says the span is the measuring alone).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_run_launch"
down_revision = "0005_tuned_knobs"
branch_labels = None
depends_on = None

_COLUMNS = ("launched_at", "resumed_at")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name in _COLUMNS:
            batch.add_column(sa.Column(name, sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name in reversed(_COLUMNS):
            batch.drop_column(name)
