"""A measurement as one type, and the figures beside its round trip, each declared once.

A :class:`Measurement` is one timed case: a backend at a :class:`~.point.Point`, in one
timing mode, with the round trip's statistics and samples, the knobs in effect and the
figures measured beside it. ``tuner.measure`` produces it, the store writes it
(``Store.add_measurement(run_id, m)``) and reads it back as itself, ``tuner.select`` turns it
into a table's numbers and the views show those.

A :class:`Figure` is declared once, in :data:`FIGURES`: its name (the key of
:attr:`Measurement.figures`), its unit, the store's column, the table's key and the views'
name and label. The store's figure columns (``db.models``), the table's figure keys
(``runtime.table.FIGURE_CURVES`` / ``FIGURE_COUNTS``), what ``select`` writes and what the
views show (``views.model.FIGURE_NAMES``) are derived from it, so adding a figure is one
declaration here, plus the Alembic revision that adds its column, plus the code that
measures it. What each figure counts: ``tuner.figures``.

Standard library only: the store (db/) imports it, and db/ imports nothing of the tuner
above the runtime.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from a2a_tune.tuner.runtime.point import POINT_FIELDS, Point

__all__ = [
    "FIGURE",
    "FIGURES",
    "KEY_FIELDS",
    "MEASUREMENT_COLUMNS",
    "STAT_FIELDS",
    "Figure",
    "Measurement",
    "MeasurementKey",
]

#: What identifies one case (and what a sweep has done): the backend, then the point's fields.
KEY_FIELDS = ("backend",) + POINT_FIELDS

#: The round trip's statistics, in µs except ``n`` (how many samples); the CI bounds and the
#: host time may be unknown (None).
STAT_FIELDS = ("median_us", "p10_us", "p90_us", "ci_low_us", "ci_high_us", "n", "host_median_us")


@dataclass(frozen=True)
class Figure:
    """One figure beside the round trip, declared once.

    ``unit``: what a value counts, "us" (a time, µs: a table keeps it as a time, to the
    nanosecond, within the range a table holds) or "bytes" (a count >= 0). ``column``: the
    store's column. ``table``: the table's key (None: kept in the store only), its values
    ``table_scale`` units to one (2**20: bytes as MiB) rounded to ``table_digits`` decimals
    (times: the table's own rounding). ``view``: the name the views give it (``show --json``;
    None: not shown), ``label`` their heading. ``integer``: whole numbers. ``many``: a list of
    values per point (samples, one value per group...), element by element the same rules.
    """

    name: str
    unit: str
    column: str
    table: str | None
    view: str | None
    label: str
    integer: bool = False
    many: bool = False
    table_scale: int = 1
    table_digits: int = 1

    @property
    def is_time(self) -> bool:
        return self.unit == "us"


#: Every figure, in the order the store, the table and the views list them.
FIGURES: tuple[Figure, ...] = (
    Figure("dispatch_us", "us", "dispatch_median_us", "dispatch_us", "dispatch_us", "dispatch µs"),
    Figure("combine_us", "us", "combine_median_us", "combine_us", "combine_us", "combine µs"),
    Figure("dispatch_samples", "us", "dispatch_samples", None, None, "dispatch samples µs", many=True),
    Figure("combine_samples", "us", "combine_samples", None, None, "combine samples µs", many=True),
    Figure("dispatch_logical_bytes", "bytes", "dispatch_logical_bytes", "dispatch_logical_bytes", "logical_bytes",
           "dispatch bytes"),
    Figure("dispatch_link_bytes", "bytes", "dispatch_link_bytes", "dispatch_link_bytes", "link_bytes",
           "dispatch link bytes"),
    Figure("combine_logical_bytes", "bytes", "combine_logical_bytes", "combine_logical_bytes",
           "combine_logical_bytes", "combine bytes"),
    Figure("combine_link_bytes", "bytes", "combine_link_bytes", "combine_link_bytes", None, "combine link bytes"),
    Figure("workspace_bytes", "bytes", "workspace_bytes", "workspace_mib", "workspace_mib", "MiB", integer=True,
           table_scale=2**20, table_digits=3),
    # each EP group's median round trip, in group order (tuner.groups); `show --json` has it as group_us
    Figure("group_us", "us", "group_us", None, None, "group µs", many=True),
)  # fmt: skip  # one figure per row: the declarations read as a table

#: Each figure by its name.
FIGURE: Mapping[str, Figure] = {f.name: f for f in FIGURES}

#: The store's columns of one measurement, in order: the key, the timing mode, the statistics,
#: the samples, the knobs, then every figure's column.
MEASUREMENT_COLUMNS = KEY_FIELDS + ("timing",) + STAT_FIELDS + ("samples", "knobs") + tuple(f.column for f in FIGURES)


class MeasurementKey(namedtuple("MeasurementKey", KEY_FIELDS)):
    """What a sweep has done for one case: ``(backend, *point)`` in :data:`KEY_FIELDS` order;
    equal (and hashing equal) to the plain tuple."""

    __slots__ = ()

    @classmethod
    def of(cls, backend: str, point: Point) -> MeasurementKey:
        return cls(backend, *point)

    @property
    def point(self) -> Point:
        return Point(*self[1:])


@dataclass(frozen=True)
class Measurement:
    """One timed case: ``backend`` at ``point`` in ``timing`` mode ("eager" | "graph"), the round
    trip's statistics over ``samples`` (µs per round trip, the max over ranks), the backend's
    ``knobs`` in effect and its ``figures`` (figure name -> value, :data:`FIGURES`; a figure not
    measured is absent). The store checks the values when it writes them."""

    backend: str
    point: Point
    timing: str
    median_us: float
    p10_us: float
    p90_us: float
    n: int
    samples: list[float]
    ci_low_us: float | None = None
    ci_high_us: float | None = None
    host_median_us: float | None = None
    knobs: Mapping[str, Any] = field(default_factory=dict)
    figures: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.figures) - set(FIGURE)
        if unknown:
            raise ValueError(f"unknown figure(s) {', '.join(sorted(unknown))}: declare them in FIGURES")
        object.__setattr__(self, "point", Point(*self.point))
        object.__setattr__(self, "figures", {k: v for k, v in self.figures.items() if v is not None})

    @property
    def key(self) -> MeasurementKey:
        return MeasurementKey.of(self.backend, self.point)

    def figure(self, name: str) -> Any:
        """The value of figure `name`, None when not measured (KeyError for an undeclared one)."""
        return self.figures.get(FIGURE[name].name)

    def columns(self) -> dict[str, Any]:
        """The store's columns (:data:`MEASUREMENT_COLUMNS`); a figure not measured is None."""
        out = dict(zip(KEY_FIELDS, self.key))
        out.update({name: getattr(self, name) for name in ("timing", *STAT_FIELDS, "samples")})
        out["knobs"] = dict(self.knobs)
        out.update({f.column: self.figures.get(f.name) for f in FIGURES})
        return out

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any]) -> Measurement:
        """A measurement from the store's columns (a row, or a mapping with those keys; a
        statistic, the samples or a figure's column absent: not known / not measured)."""
        point = Point(*(columns[name] for name in POINT_FIELDS))
        stats = {name: columns.get(name) for name in STAT_FIELDS}
        figures = {f.name: columns.get(f.column) for f in FIGURES}
        return cls(
            backend=columns["backend"],
            point=point,
            timing=columns.get("timing"),
            samples=list(columns.get("samples") or ()),
            knobs=dict(columns.get("knobs") or {}),
            figures=figures,
            **stats,
        )


def _point_field(name: str) -> property:
    return property(lambda self: getattr(self.point, name), doc=f"The point's {name}.")


# A measurement reads as the point it was taken at: m.tokens_per_rank, m.dtype, ...
for _name in POINT_FIELDS:
    setattr(Measurement, _name, _point_field(_name))
del _name
