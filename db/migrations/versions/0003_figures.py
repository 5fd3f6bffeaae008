"""Figures beside the round trip: dispatch and combine apart, bytes moved, device memory held.

Revision ID: 0003_figures
Revises: 0002_run_writer
Create Date: 2026-12-01

Written by hand and frozen (no model imports). Nullable columns only: measurements stored
before this revision have no split, no byte counts and no memory figure, and read as the
round trip alone.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_figures"
down_revision = "0002_run_writer"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("dispatch_median_us", sa.Double),
    ("combine_median_us", sa.Double),
    ("dispatch_samples", sa.JSON),
    ("combine_samples", sa.JSON),
    ("dispatch_logical_bytes", sa.Double),
    ("dispatch_link_bytes", sa.Double),
    ("combine_logical_bytes", sa.Double),
    ("combine_link_bytes", sa.Double),
    ("workspace_bytes", sa.BigInteger),
)


def upgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        for name, kind in _COLUMNS:
            batch.add_column(sa.Column(name, kind(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        for name, _ in reversed(_COLUMNS):
            batch.drop_column(name)
