"""a2a-tune measurement store: SQLAlchemy models, the Store API, packaged migrations.

Layering (never back up the list; tests/test_layout.py checks it): this package may import
a2a_tune.tuner.runtime, the standard-library foundation (the point type and its bounds,
one_line), and nothing else of a2a_tune.tuner, nor a2a_tune.kernels or torch
(docs/architecture.md, "Layering")::

    store.py       open_store / Store: the API the tuner uses
      lease.py     a run's one writer (Writer, LeaseHeartbeat) and the fence on its writes
      engine.py    URLs, engines (SQLite settings, read-only opening), upgrade / migrations
      models.py    ORM tables (hardware <- runs <- measurements, failures)
      migrations/  Alembic env + versions/, run by engine.py; own the schema
    errors.py      StoreError and friends (one-line messages)

Design notes: docs/architecture.md, "Module notes", `db/__init__.py`.
"""

from .engine import (
    DEFAULT_URL,
    ENV_VAR,
    check_url,
    display_url,
    engine_options,
    head_revision,
    is_in_memory,
    mask_secrets,
    readonly_url,
    resolve_url,
    upgrade,
)
from .errors import (
    ConnectionLostError,
    DuplicateMeasurementError,
    EmptyStoreError,
    LeaseLostError,
    NotFoundError,
    RunBusyError,
    StoreError,
    StoreFileLostError,
    StoreOutdatedError,
)
from .knobs import KnobsRecord
from .lease import LEASE_STALE_S, LeaseHeartbeat, Writer
from .store import (
    FailureRecord,
    HardwareRecord,
    MeasurementKey,
    RunRecord,
    Store,
    open_store,
)

__all__ = [
    "DEFAULT_URL",
    "ENV_VAR",
    "LEASE_STALE_S",
    "ConnectionLostError",
    "DuplicateMeasurementError",
    "EmptyStoreError",
    "FailureRecord",
    "HardwareRecord",
    "KnobsRecord",
    "LeaseHeartbeat",
    "LeaseLostError",
    "MeasurementKey",
    "NotFoundError",
    "RunBusyError",
    "RunRecord",
    "Store",
    "StoreError",
    "StoreFileLostError",
    "StoreOutdatedError",
    "Writer",
    "check_url",
    "display_url",
    "engine_options",
    "head_revision",
    "is_in_memory",
    "mask_secrets",
    "open_store",
    "readonly_url",
    "resolve_url",
    "upgrade",
]
