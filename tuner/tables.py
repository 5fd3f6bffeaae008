"""A machine's table across runs: a new run's table is merged into the one on disk, never over it.

One table per fingerprint answers every shape and EP size measured on that hardware, whichever
run measured it. The merge (:func:`merge`) is a function of the points: per entry, backend and
token count, the newest trustworthy measurement is kept, whichever table holds it:

* a run is known by its id and start (``provenance`` run and date): run 1 of two stores are
  two runs; the same run selected again replaces its own points, and only those;
* newer is the later start, then the higher id; a run dated after now (a wrong clock) is
  warned about and its points are kept only where no run with a believable date measured;
* a backend keeps one timing mode per entry: where the two tables timed it in different
  modes, the curve holding the newer point is taken whole;
* a failure stays unless a newer run measured that backend where it failed (anywhere, for a
  failure of the whole shape): a backend once found incorrect is not chosen again on the
  strength of older points;
* ``provenance`` lists exactly the runs whose points or failures remain, newest first, and
  each point and failure records which (``from``); the winners follow from the curves.

Writing, with the lock that keeps two writers from losing each other's entries, is
:func:`a2a_tune.tuner.publish.write_table`.
"""

from __future__ import annotations

import datetime as _dt
import logging
from types import MappingProxyType

from .runtime.table import Failed, Profile, ProfileEntry
from .select import fabric_of, future_date, parse_date, shape_sort_key

__all__ = ["merge"]

log = logging.getLogger("a2a_tune")


def _identity(p) -> tuple:
    """What tells runs apart across stores: the run id and its start."""
    return (str(p.get("run")), str(p.get("date")))


def _rank(p) -> tuple:
    """A run's place in time: believable dates first, then later start, then higher id."""
    run, when = p.get("run"), parse_date(p.get("date"))
    return (not future_date(p.get("date")), when or _EARLIEST, run if type(run) is int else -1, str(run))


_EARLIEST = _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)


def merge(old: Profile, new: Profile) -> Profile:
    """The table of ``new`` (e.g. just selected) with ``old`` (the table on disk) merged in by
    the module's rule; ``new``'s top level (hardware, run, generated_*) is kept."""
    backends = {**old.backends, **new.backends}
    preference = list(new.tie_preference)
    preference += [b for b in old.tie_preference if b not in preference]
    preference += [b for b in backends if b not in preference]
    entries = {e.shape: e for e in new.entries}
    facts, world = old.meta.get("hardware", {}).get("facts"), (old.meta.get("run") or {}).get("world_size")
    for e in old.entries:
        if e.fabric is None:  # a table from before schema 4
            e = e._replace(fabric=fabric_of(facts, e.shape.ep_size, world))
        mine = entries.get(e.shape)
        entries[e.shape] = e if mine is None else merge_entry(e, mine)
    for p in {_identity(p): p for e in (*old.entries, *new.entries) for p in e.provenance}.values():
        if future_date(p.get("date")):
            log.warning(
                "a2a-tune: run %s is dated %s, after now (a wrong clock?); its measurements are kept only "
                "where no other run measured",
                p.get("run"),
                p.get("date"),
            )
    return new._replace(backends=MappingProxyType(backends), tie_preference=tuple(preference)).with_entries(
        entries[k] for k in sorted(entries, key=shape_sort_key)
    )


def _points(e: ProfileEntry, b: str, newer: bool) -> dict:
    """token count -> (rank, run record, that point's values) of backend ``b``'s curve in ``e``."""
    origin = e.origin_of(b)
    figures = e.figures.get(b, {})
    knobs = e.knobs.get(b)
    # each run record ranked once, not once per point (a measured point's origin is 0 without any)
    runs = [((*_rank(p), newer), p) for p in e.provenance or (MappingProxyType({}),)]
    out = {}
    for j, t in enumerate(e.tokens):
        if e.median_us[b][j] is None:
            continue
        rank, p = runs[origin[j]]
        values = {
            "median_us": e.median_us[b][j],
            "p10_us": e.p10_us[b][j],
            "p90_us": e.p90_us[b][j],
            "figures": {k: v[j] for k, v in figures.items()},
            "knobs": None if knobs is None else knobs[j],
        }
        out[t] = (rank, p, values)
    return out


def merge_entry(older: ProfileEntry, newer: ProfileEntry) -> ProfileEntry:
    """One shape in two tables (``newer``: the one being written): per backend and token
    count, the newest trustworthy point (module docstring)."""
    chosen: dict = {}  # backend -> (timing, {token: (rank, record, values)})
    for b in sorted(set(older.median_us) | set(newer.median_us)):
        sides = [(e.timing[b], _points(e, b, e is newer)) for e in (older, newer) if b in e.median_us]
        if len(sides) == 2 and sides[0][0] != sides[1][0]:  # two modes: the curve with the newer point, whole
            sides = [max(sides, key=lambda s: max((v[0] for v in s[1].values()), default=()))]
        points: dict = {}
        for _, pts in sides:
            for t, v in pts.items():
                if t not in points or v[0] > points[t][0]:
                    points[t] = v
        chosen[b] = (sides[0][0] if len(sides) == 1 else newer.timing[b], points)

    failed: dict = {}  # backend -> (rank, record, Failed)
    for e in (older, newer):
        for b, f in e.failed.items():
            p = e.provenance[e.failed_origin.get(b, 0)] if e.provenance else MappingProxyType({})
            v = ((*_rank(p), e is newer), p, f)
            if b not in failed or v[0] > failed[b][0]:
                failed[b] = v
    for b, (rank, _, f) in list(failed.items()):
        points = chosen.get(b, (None, {}))[1]
        if any(v[0][:-1] > rank[:-1] and (f.tokens is None or t == f.tokens) for t, v in points.items()):
            del failed[b]  # a newer run measured it there

    records: dict = {}  # identity -> (rank, record): the new table's record of a run wins
    for _, points in chosen.values():
        for rank, p, _ in points.values():
            _keep(records, rank, p)
    for rank, p, _ in failed.values():
        _keep(records, rank, p)
    provenance = tuple(p for _, p in sorted(records.values(), key=lambda v: v[0], reverse=True))
    index = {_identity(p): i for i, p in enumerate(provenance)}

    tokens = tuple(sorted({t for _, points in chosen.values() for t in points}))
    medians, p10s, p90s, timings, knobs, figures, origin = {}, {}, {}, {}, {}, {}, {}
    for b, (mode, points) in chosen.items():
        if not points:
            continue
        col = [points.get(t) for t in tokens]
        timings[b] = mode
        medians[b], p10s[b], p90s[b] = (tuple(None if c is None else c[2][k] for c in col) for k in _CURVES)
        origin[b] = tuple(None if c is None else index[_identity(c[1])] for c in col)
        if any(c is not None and c[2]["knobs"] is not None for c in col):
            knobs[b] = tuple(None if c is None else c[2]["knobs"] for c in col)
        names = dict.fromkeys(k for c in col if c is not None for k in c[2]["figures"])
        rows = {k: tuple(None if c is None else c[2]["figures"].get(k) for c in col) for k in names}
        rows = {k: row for k, row in rows.items() if any(v is not None for v in row)}
        if rows:
            figures[b] = MappingProxyType(rows)
    return newer._replace(
        tokens=tokens,
        median_us=MappingProxyType(medians),
        p10_us=MappingProxyType(p10s),
        p90_us=MappingProxyType(p90s),
        timing=MappingProxyType(timings),
        failed=MappingProxyType({b: Failed(*f) for b, (_, _, f) in sorted(failed.items())}),
        knobs=MappingProxyType(knobs),
        figures=MappingProxyType(figures),
        provenance=provenance,
        fabric=newer.fabric or older.fabric,
        origin=MappingProxyType(origin),
        failed_origin=MappingProxyType({b: index[_identity(p)] for b, (_, p, _) in failed.items()}),
    )


_CURVES = ("median_us", "p10_us", "p90_us")


def _keep(records: dict, rank: tuple, p) -> None:
    key = _identity(p)
    if key not in records or rank > records[key][0]:
        records[key] = (rank, p)
