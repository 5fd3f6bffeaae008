"""The knob search's results as rows of the store: the best launch setting per machine, backend,
point and capacity (``tuned_knobs``, :class:`~a2a_tune.db.models.TunedKnobs`).

`tune-knobs` writes one row per point it searched (:meth:`KnobRows.put_knobs`, replacing the
row of the same key); `select` reads a machine's rows back (:meth:`KnobRows.tuned_knobs`).
Optuna samples the settings and keeps its trials in its own tables; nothing here reads them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select

from a2a_tune.tuner.runtime.measurement import KEY_FIELDS, MeasurementKey

from .models import TunedKnobs, utcnow
from .values import _finite, _int, _json, _str, _tokens


@dataclasses.dataclass(frozen=True)
class KnobsRecord:
    """One point's tuned setting (see :class:`~a2a_tune.db.models.TunedKnobs`): ``best`` is the
    fastest correct setting, ``default`` the backend's own; ``capacity`` None: each load's own
    workspace, or a backend without a fixed capacity."""

    fingerprint: str
    key: MeasurementKey
    best: Mapping[str, Any]
    capacity: int | None = None
    best_us: float | None = None
    default: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    default_us: float | None = None
    timing: str | None = None
    study: str | None = None
    updated_at: dt.datetime | None = None


class KnobRows:
    """The `Store`'s methods for tuned knobs (the store's guarantees hold: one transaction
    each, plain values out, errors as one line)."""

    def put_knobs(self, record: KnobsRecord) -> int:
        """Store `record`, replacing the row of its fingerprint, key and capacity; its row id."""
        key = MeasurementKey(*record.key)
        values = {
            "fingerprint": _str("fingerprint", record.fingerprint),
            "backend": _str("backend", key.backend),
            **{f: _int(f, getattr(key, f), minimum=1) for f in ("num_experts", "topk", "hidden", "ep_size")},
            "dtype": _str("dtype", key.dtype),
            "routing": _str("routing", key.routing),
            "tokens_per_rank": _tokens(key.tokens_per_rank),
            "capacity": _int("capacity", record.capacity, optional=True, minimum=1),
            "timing": _str("timing", record.timing, optional=True),
            "best_knobs": _json("best_knobs", dict(record.best)),
            "best_us": _finite("best_us", record.best_us, optional=True),
            "default_knobs": _json("default_knobs", dict(record.default)),
            "default_us": _finite("default_us", record.default_us, optional=True),
            "study": record.study,
            "updated_at": utcnow(),
        }
        match = [getattr(TunedKnobs, f) == values[f] for f in ("fingerprint", *KEY_FIELDS)]
        match.append(
            TunedKnobs.capacity.is_(None) if record.capacity is None else TunedKnobs.capacity == values["capacity"]
        )
        with self._session("storing tuned knobs") as s:
            row = s.scalars(select(TunedKnobs).where(*match)).first()
            if row is None:
                row = TunedKnobs(**values)
                s.add(row)
            else:
                for name, value in values.items():
                    setattr(row, name, value)
            s.flush()
            return row.id

    def tuned_knobs(self, fingerprint: str) -> list[KnobsRecord]:
        """Every tuned setting stored for machine `fingerprint`, oldest first."""
        with self._session("reading tuned knobs") as s:
            rows = s.scalars(
                select(TunedKnobs)
                .where(TunedKnobs.fingerprint == fingerprint)
                .order_by(TunedKnobs.updated_at, TunedKnobs.id)
            ).all()
            return [
                KnobsRecord(
                    r.fingerprint,
                    MeasurementKey(*(getattr(r, f) for f in KEY_FIELDS)),
                    dict(r.best_knobs or {}),
                    r.capacity,
                    r.best_us,
                    dict(r.default_knobs or {}),
                    r.default_us,
                    r.timing,
                    r.study,
                    r.updated_at,
                )
                for r in rows
            ]
