"""ORM models of the measurement store (SQLAlchemy 2 declarative).

Five tables, one direction of reference::

    hardware  <- runs <- measurements
                      <- failures
    tuned_knobs (by hardware fingerprint)

``hardware`` is one probed machine/cluster (fingerprint + hash of the full probe facts);
``runs`` is one sweep on it (versions, sweep plan, status); ``measurements`` holds one
timed case (backend, shape, dtype, routing, token count) in one timing mode with its
statistics and raw samples; ``failures`` records why a backend was not timed (unavailable, incorrect
result, error, timeout, a rank's process that died in it, not applicable to the run's EP group),
with the shape when the failure is shape-specific. ``tuned_knobs`` holds the best launch setting
the knob search found per machine, backend, point and capacity.

The schema is owned by the Alembic revisions in ``migrations/versions``: a change here
needs a new revision there (``tests/db/test_models.py`` compares the two). Columns use only
portable types (no SQLite-only or PostgreSQL-only SQL). Timestamps are UTC and always
come back timezone-aware, whatever the backend stores.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Double,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from a2a_tune.tuner.runtime.measurement import FIGURES, KEY_FIELDS, Figure

# Alembic's version table, under our own name: Optuna studies share the store's URL and
# Optuna keeps its own revision in the default ``alembic_version`` table.
VERSION_TABLE = "a2a_tune_alembic_version"

# Deterministic constraint names, so later migrations (batch mode on SQLite) can name the
# constraint they alter. Revisions spell the resulting names out literally.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

RUN_STATUSES = ("running", "completed", "interrupted", "failed")
DEVICE_TYPES = ("cuda", "cpu")
# "not_applicable": the run's EP group is beyond the backend's reach (not a failure of it).
FAILURE_KINDS = ("unavailable", "incorrect", "error", "timeout", "crashed", "not_applicable")

# KEY_FIELDS: the columns that identify one case, what a sweep has done (see Store.done_keys):
# the backend and the point, in the point's one field order; a measurement adds ``timing`` to
# make its unique key.


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A ``DateTime(timezone=True)`` that stores UTC and returns aware UTC datetimes.

    SQLite has no time zones: values are stored as naive UTC there and tagged UTC on load.
    Naive datetimes handed in are taken to be UTC already.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        value = value.astimezone(dt.timezone.utc)
        if dialect.name == "sqlite":
            value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Hardware(Base):
    """One probed machine or cluster. Same fingerprint + different facts hash = a change
    the human-readable fingerprint does not show (driver, a degraded link...)."""

    __tablename__ = "hardware"
    __table_args__ = (UniqueConstraint("fingerprint", "facts_hash", name="uq_hardware_fingerprint_facts_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(200), index=True)
    facts_hash: Mapped[str] = mapped_column(String(128))
    facts: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class Run(Base):
    """One sweep on one piece of hardware. ``config`` is the sweep plan (shapes, token
    counts, dtypes, routings, backends, iterations...) and ``config_hash`` its digest,
    used to find a run to resume. ``versions`` maps torch, nccl, cuda, driver, triton,
    flashinfer, python, a2a_tune to a version string or None. The ``writer_*`` columns and
    ``heartbeat_at`` are the lease of the one process allowed to write the run.

    ``started_at`` is when the ranks opened the run, ``launched_at`` when the command that
    started them began (its ranks' start-up included), ``resumed_at`` when the latest
    ``--resume`` command that took the run over began; the last two are NULL for runs stored
    before revision 0006, and ``resumed_at`` for a run never resumed."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hardware_id: Mapped[int] = mapped_column(ForeignKey("hardware.id"), index=True)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    status: Mapped[str] = mapped_column(String(16))  # one of RUN_STATUSES
    device_type: Mapped[str] = mapped_column(String(16))  # one of DEVICE_TYPES
    world_size: Mapped[int] = mapped_column(Integer)
    versions: Mapped[dict[str, Any]] = mapped_column(JSON)
    git_sha: Mapped[str | None] = mapped_column(String(64), nullable=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_hash: Mapped[str] = mapped_column(String(128), index=True)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The run's one writer (its lease; see Store.claim_run). NULL token: nobody holds it.
    writer_token: Mapped[str | None] = mapped_column(String(64), nullable=True)
    writer_host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    writer_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Where writer_pid means something (boot id + PID namespace): a process with the same
    # scope may ask the kernel whether that pid is alive.
    writer_scope: Mapped[str | None] = mapped_column(String(128), nullable=True)
    writer_since: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    launched_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    resumed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class _CaseKey:
    """The columns of a case's key (:data:`KEY_FIELDS`): the backend and the point ("uniform",
    "skewed", ... routing)."""

    backend: Mapped[str] = mapped_column(String(64))
    num_experts: Mapped[int] = mapped_column(Integer)
    topk: Mapped[int] = mapped_column(Integer)
    hidden: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(32))
    ep_size: Mapped[int] = mapped_column(Integer)
    tokens_per_rank: Mapped[int] = mapped_column(Integer)
    routing: Mapped[str] = mapped_column(String(64))


class Measurement(_CaseKey, Base):
    """One timed case (``a2a_tune.tuner.runtime.measurement.Measurement``, column for column).
    Times are microseconds per dispatch+combine round trip measured on the device;
    ``host_median_us`` is host wall time per round trip; ``samples`` the raw per-iteration
    device times; ``knobs`` backend-specific settings used.

    The figures beside the round trip get one nullable column each, derived from their
    declaration (``runtime.measurement.FIGURES``; NULL in measurements from before them, or
    where not measured): see :func:`_figure_column`."""

    __tablename__ = "measurements"
    __table_args__ = (UniqueConstraint("run_id", *KEY_FIELDS, "timing", name="uq_measurements_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    timing: Mapped[str] = mapped_column(String(16))  # "eager", "graph", ...
    median_us: Mapped[float] = mapped_column(Double)
    p10_us: Mapped[float] = mapped_column(Double)
    p90_us: Mapped[float] = mapped_column(Double)
    ci_low_us: Mapped[float | None] = mapped_column(Double, nullable=True)
    ci_high_us: Mapped[float | None] = mapped_column(Double, nullable=True)
    n: Mapped[int] = mapped_column(Integer)
    host_median_us: Mapped[float | None] = mapped_column(Double, nullable=True)
    samples: Mapped[list[float]] = mapped_column(JSON)
    knobs: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


def _figure_column(figure: Figure):
    """A figure's column: JSON for a list per point, BigInteger for whole numbers, else Double."""
    kind = JSON if figure.many else BigInteger if figure.integer else Double
    return mapped_column(figure.column, kind, nullable=True)


for _figure in FIGURES:
    setattr(Measurement, _figure.column, _figure_column(_figure))
del _figure

#: The figure columns of ``measurements``, all nullable, in declaration order.
FIGURE_FIELDS = tuple(f.column for f in FIGURES)


class Failure(Base):
    """Why a backend was not timed. An "unavailable" failure usually has no shape (the
    backend cannot run on this machine at all); the shape columns are then NULL."""

    __tablename__ = "failures"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    backend: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))  # one of FAILURE_KINDS
    reason: Mapped[str] = mapped_column(Text)  # one line
    num_experts: Mapped[int | None] = mapped_column(Integer, nullable=True)
    topk: Mapped[int | None] = mapped_column(Integer, nullable=True)
    hidden: Mapped[int | None] = mapped_column(Integer, nullable=True)
    dtype: Mapped[str | None] = mapped_column(String(32), nullable=True)
    ep_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_per_rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    routing: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class TunedKnobs(_CaseKey, Base):
    """The best launch setting `tune-knobs` found for one backend at one point on one machine
    (``fingerprint``), for fixed-capacity backends at one ``capacity`` (NULL: each load's own, or
    a backend without one). ``default_*`` is the backend's default setting and its µs, ``best_*``
    the fastest correct one (the default when nothing beat it); ``study`` names the Optuna study
    that searched it (Optuna keeps the trials in its own tables)."""

    __tablename__ = "tuned_knobs"
    __table_args__ = (UniqueConstraint("fingerprint", *KEY_FIELDS, "capacity", name="uq_tuned_knobs_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(200), index=True)
    capacity: Mapped[int | None] = mapped_column(Integer, nullable=True)
    timing: Mapped[str | None] = mapped_column(String(16), nullable=True)
    default_knobs: Mapped[dict[str, Any]] = mapped_column(JSON)
    default_us: Mapped[float | None] = mapped_column(Double, nullable=True)
    best_knobs: Mapped[dict[str, Any]] = mapped_column(JSON)
    best_us: Mapped[float | None] = mapped_column(Double, nullable=True)
    study: Mapped[str | None] = mapped_column(String(500), nullable=True)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
