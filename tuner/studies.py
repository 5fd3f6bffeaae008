"""The knob studies: their names, and the best settings read back from them.

`tune-knobs` (:mod:`a2a_tune.tuner.knobs`, the writer) runs one Optuna study per point in the
measurement database; `select` (:mod:`a2a_tune.tuner.select`, the reader) keeps the best
setting each one found. Both take the study's name from here.

The reader opens the database read-only and reads Optuna's two tables of study names and
attributes with SQLAlchemy, without Optuna: opening an Optuna storage creates and upgrades its
tables. A store in a read-only directory therefore keeps its tuned knobs, and is left
byte-identical.
"""

from __future__ import annotations

import json
from typing import Any

from .runtime.table import SHAPE_KEYS

PREFIX = "a2a-tune knobs: "


def study_name(
    fingerprint: str,
    backend: str,
    shape: Any,
    ep_size: int,
    tokens: int,
    routing: str,
    capacity: int | None = None,
) -> str:
    """One study per point (``shape``: a :class:`~a2a_tune.kernels.MoEShape`, named by its
    ``label()``). A point measured at an engine's capacity (--capacity) is another point than
    the same load in a workspace of its own size. Names given before stay valid."""
    where = "" if routing == "uniform" else f" {routing}"
    cap = "" if capacity is None else f" cap{capacity}"
    return f"{PREFIX}{fingerprint} {backend} {shape.label()} ep{ep_size} T{tokens}{cap}{where}"


def stored_knobs(
    url: str, fingerprint: str, capacity: int | None = None
) -> list[tuple[dict[str, Any], str, int, dict[str, Any]]]:
    """The best knob settings that the studies in database ``url`` found on ``fingerprint``, so
    that `a2a-tune select` keeps what `tune-knobs` found. One (shape keys of a table entry,
    backend, tokens per rank, knobs) per finished study, oldest study first.

    Only the studies of fixed-capacity backends built for ``capacity`` count (None: each
    load's own), because knobs tuned for another workspace size belong to another point. The
    database is opened as the store's readers open it (:func:`a2a_tune.db.readonly_url`):
    nothing is created or written, not even in a database that never held a study. Raises
    SQLAlchemy's errors when it cannot be read."""
    # lazy: select's module (and the views that read tables through it) need no SQLAlchemy
    from sqlalchemy import column, create_engine, inspect, select, table

    from a2a_tune.db import engine_options, readonly_url

    # Optuna's own tables (optuna/storages/_rdb/models.py), stable since Optuna 1.x
    studies = table("studies", column("study_id"), column("study_name"))
    attributes = table("study_user_attributes", column("study_id"), column("key"), column("value_json"))
    found = []
    engine = create_engine(readonly_url(url), **engine_options(url, readonly=True))
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table("studies"):
                return []
            names = {
                sid: name
                for sid, name in conn.execute(select(studies.c.study_id, studies.c.study_name))
                if name.startswith(f"{PREFIX}{fingerprint} ")
            }
            attrs: dict[int, dict[str, Any]] = {sid: {} for sid in names}
            rows = conn.execute(
                select(attributes.c.study_id, attributes.c.key, attributes.c.value_json).where(
                    attributes.c.study_id.in_(names)
                )
            )
            for sid, key, value in rows:
                attrs[sid][key] = json.loads(value)
    finally:
        engine.dispose()
    for sid in sorted(names):
        a = attrs[sid]
        if "best_knobs" not in a:
            continue  # a search still running, or stopped before its first result
        if _capacity_bound(a.get("backend"), a.get("capacity")) and a.get("capacity") != capacity:
            continue  # tuned for another workspace size: another point than this table's
        shape = {k: a.get(k) for k in SHAPE_KEYS}
        found.append((shape, a["backend"], int(a["tokens_per_rank"]), dict(a["best_knobs"])))
    return found


def _capacity_bound(backend: str | None, capacity) -> bool:
    """Whether the study of `backend` (which recorded `capacity`) is of a fixed-capacity one.
    Asked without importing out-of-tree modules (select never needs them): for a backend not
    registered here, only a fixed-capacity backend's study records a capacity."""
    # lazy: the registry (and torch) load only once a study of this machine is found
    from a2a_tune.kernels import UnknownBackendError, get_backend

    try:
        return get_backend(backend, extra=False).capacity_bound
    except UnknownBackendError:
        return capacity is not None
