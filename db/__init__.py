"""a2a-tune measurement store: SQLAlchemy models, the Store API, packaged migrations.

Layering (never back up the list; this package never imports a2a_tune.tuner or torch)::

    store.py       open_store / upgrade / Store: the API the tuner uses
      models.py    ORM tables (hardware <- runs <- measurements, failures)
      migrations/  Alembic env + versions/, run by store.py; own the schema
    errors.py      StoreError and friends (one-line messages)

Typical use::

    from a2a_tune.db import open_store
    with open_store(url) as store:          # url None -> $A2A_TUNE_DB -> sqlite:///a2a_tune.db
        hw = store.get_or_create_hardware(fingerprint, facts_hash, facts)
        run = store.find_resumable_run(hw, config_hash) or store.start_run(hw, ...)
        done = store.done_keys(run)
        ...
        store.add_measurement(run, backend=..., ...)   # committed on return
        store.finish_run(run, "completed", summary)
"""

from .errors import DuplicateMeasurementError, NotFoundError, StoreError, StoreOutdatedError
from .store import (
    DEFAULT_URL,
    ENV_VAR,
    FailureRecord,
    HardwareRecord,
    MeasurementKey,
    MeasurementRecord,
    RunRecord,
    Store,
    head_revision,
    open_store,
    resolve_url,
    upgrade,
)

__all__ = [
    "DEFAULT_URL",
    "ENV_VAR",
    "DuplicateMeasurementError",
    "FailureRecord",
    "HardwareRecord",
    "MeasurementKey",
    "MeasurementRecord",
    "NotFoundError",
    "RunRecord",
    "Store",
    "StoreError",
    "StoreOutdatedError",
    "head_revision",
    "open_store",
    "resolve_url",
    "upgrade",
]
