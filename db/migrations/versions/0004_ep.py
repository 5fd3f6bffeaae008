"""Each EP group's median round trip beside the slowest group's figure (issue 27).

Revision ID: 0004_ep
Revises: 0003_figures
Create Date: 2026-12-02

Written by hand and frozen (no model imports). One nullable JSON column: measurements stored
before this revision were taken on one group (the world) and read as such.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_ep"
down_revision = "0003_figures"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("group_us", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("group_us")
