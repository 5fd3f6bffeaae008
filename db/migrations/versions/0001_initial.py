"""Initial schema: hardware, runs, measurements, failures.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01

Written by hand and frozen: it must not import the models (they move on; this revision
describes schema 1 forever). Constraint and index names follow models.NAMING_CONVENTION.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def _utc() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "hardware",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=200), nullable=False),
        sa.Column("facts_hash", sa.String(length=128), nullable=False),
        sa.Column("facts", sa.JSON(), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_hardware"),
        sa.UniqueConstraint("fingerprint", "facts_hash", name="uq_hardware_fingerprint_facts_hash"),
    )
    op.create_index("ix_hardware_fingerprint", "hardware", ["fingerprint"])

    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hardware_id", sa.Integer(), nullable=False),
        sa.Column("started_at", _utc(), nullable=False),
        sa.Column("finished_at", _utc(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("device_type", sa.String(length=16), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("git_sha", sa.String(length=64), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_hash", sa.String(length=128), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.ForeignKeyConstraint(["hardware_id"], ["hardware.id"], name="fk_runs_hardware_id_hardware"),
    )
    op.create_index("ix_runs_hardware_id", "runs", ["hardware_id"])
    op.create_index("ix_runs_config_hash", "runs", ["config_hash"])

    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(length=64), nullable=False),
        sa.Column("num_experts", sa.Integer(), nullable=False),
        sa.Column("topk", sa.Integer(), nullable=False),
        sa.Column("hidden", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(length=32), nullable=False),
        sa.Column("ep_size", sa.Integer(), nullable=False),
        sa.Column("tokens_per_rank", sa.Integer(), nullable=False),
        sa.Column("routing", sa.String(length=64), nullable=False),
        sa.Column("timing", sa.String(length=16), nullable=False),
        sa.Column("median_us", sa.Double(), nullable=False),
        sa.Column("p10_us", sa.Double(), nullable=False),
        sa.Column("p90_us", sa.Double(), nullable=False),
        sa.Column("ci_low_us", sa.Double(), nullable=True),
        sa.Column("ci_high_us", sa.Double(), nullable=True),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("host_median_us", sa.Double(), nullable=True),
        sa.Column("samples", sa.JSON(), nullable=False),
        sa.Column("knobs", sa.JSON(), nullable=False),
        sa.Column("created_at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_measurements"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_measurements_run_id_runs"),
        sa.UniqueConstraint(
            "run_id",
            "backend",
            "num_experts",
            "topk",
            "hidden",
            "dtype",
            "ep_size",
            "tokens_per_rank",
            "routing",
            "timing",
            name="uq_measurements_key",
        ),
    )
    op.create_index("ix_measurements_run_id", "measurements", ["run_id"])

    op.create_table(
        "failures",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("num_experts", sa.Integer(), nullable=True),
        sa.Column("topk", sa.Integer(), nullable=True),
        sa.Column("hidden", sa.Integer(), nullable=True),
        sa.Column("dtype", sa.String(length=32), nullable=True),
        sa.Column("ep_size", sa.Integer(), nullable=True),
        sa.Column("tokens_per_rank", sa.Integer(), nullable=True),
        sa.Column("routing", sa.String(length=64), nullable=True),
        sa.Column("created_at", _utc(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_failures"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_failures_run_id_runs"),
    )
    op.create_index("ix_failures_run_id", "failures", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_failures_run_id", table_name="failures")
    op.drop_table("failures")
    op.drop_index("ix_measurements_run_id", table_name="measurements")
    op.drop_table("measurements")
    op.drop_index("ix_runs_config_hash", table_name="runs")
    op.drop_index("ix_runs_hardware_id", table_name="runs")
    op.drop_table("runs")
    op.drop_index("ix_hardware_fingerprint", table_name="hardware")
    op.drop_table("hardware")
