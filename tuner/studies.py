"""The knob studies' names, and the best settings read back from the store.

`tune-knobs` (:mod:`a2a_tune.tuner.knobs`, the writer) runs one Optuna study per point and
stores each point's best setting as a row of ours (``Store.put_knobs``); `select`
(:mod:`a2a_tune.tuner.select`, the reader) reads those rows (:func:`stored_knobs`). Optuna
keeps its trials in its own tables, which nothing of ours reads; the study's name is only the
handle Optuna resumes a search by, and ``optuna-dashboard <url>`` shows.
"""

from __future__ import annotations

from typing import Any

from a2a_tune.tuner.runtime.measurement import MeasurementKey

PREFIX = "a2a-tune knobs: "


def study_name(fingerprint: str, key: MeasurementKey, capacity: int | None = None) -> str:
    """The Optuna study of one point: a rerun adds trials to the study of the same name, so the
    format is frozen (names given before stay valid). A point measured at an engine's capacity
    (--capacity) is another point than the same load in a workspace of its own size."""
    where = "" if key.routing == "uniform" else f" {key.routing}"
    cap = "" if capacity is None else f" cap{capacity}"
    shape = f"E{key.num_experts}-k{key.topk}-H{key.hidden}-{key.dtype}"
    return f"{PREFIX}{fingerprint} {key.backend} {shape} ep{key.ep_size} T{key.tokens_per_rank}{cap}{where}"


def stored_knobs(store: Any, fingerprint: str, capacity: int | None = None) -> list[tuple[MeasurementKey, dict]]:
    """The best knob settings `tune-knobs` stored in `store` (an open :class:`~a2a_tune.db.Store`)
    for machine ``fingerprint``: (measurement key, knobs) per tuned point, oldest first.

    Only the settings of fixed-capacity backends built for ``capacity`` count (None: each
    load's own), because knobs tuned for another workspace size belong to another point."""
    found = []
    for record in store.tuned_knobs(fingerprint):
        if _capacity_bound(record.key.backend, record.capacity) and record.capacity != capacity:
            continue  # tuned for another workspace size: another point than this table's
        found.append((record.key, dict(record.best)))
    return found


def _capacity_bound(backend: str, capacity: int | None) -> bool:
    """Whether `backend` (whose row recorded `capacity`) is a fixed-capacity one. Asked without
    importing out-of-tree modules (select never needs them): for a backend not registered
    here, only a fixed-capacity backend's row records a capacity."""
    # lazy: the registry (and torch) load only once a tuned point of this machine is found
    from a2a_tune.kernels import UnknownBackendError, get_backend

    try:
        return get_backend(backend, extra=False).capacity_bound
    except UnknownBackendError:
        return capacity is not None
