"""Selection: turn one sweep run's measurements into a typed table (:class:`Profile`).

Flow position: probe -> sweep -> store -> **select** -> lookup. :func:`select_entries` builds
one :class:`~a2a_tune.tuner.runtime.table.ProfileEntry` per shape (ep_size, hidden, topk,
num_experts, dtype, routing) from :class:`~a2a_tune.tuner.runtime.measurement.Measurement`
values and failure records (:class:`FailureRow`, or the store's records: the same
attributes), so it is testable without a database; :func:`build_profile` adds the run's
provenance and names; :func:`profile_from_store` is the thin adapter to ``a2a_tune.db``.

What it guarantees: a backend that failed the correctness check or crashed at any token
count of a shape is listed in ``failed`` and never wins there; each backend keeps one timing
mode per entry; a median outside [MIN_US, MAX_US] is left out with a warning; a point
measured twice in one mode keeps the lower median; winners follow the one tie rule
(:func:`a2a_tune.tuner.runtime.estimate.winners`). The rules in full, and why, are in
docs/architecture.md ("Selection table").

The file is ``profile_filename(fingerprint)``, written from the Profile by
:func:`write_profile_to`: checked once against the published JSON Schema, then written
through :func:`~a2a_tune.tuner.runtime.table.to_dict` atomically. Merging it into the table
on disk is :func:`a2a_tune.tuner.publish.write_table`'s (:mod:`a2a_tune.tuner.tables`).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

from a2a_tune.tuner.runtime.engines import ENGINES
from a2a_tune.tuner.runtime.measurement import FIGURES, Figure, Measurement
from a2a_tune.tuner.runtime.profiles import profile_filename, replace_file
from a2a_tune.tuner.runtime.table import (
    FABRICS,
    FALLBACK_BACKEND,
    GRAPH_WORDS,
    MAX_US,
    MIN_US,
    READABLE_SCHEMAS,
    SCHEMA_VERSION,
    SHAPE_KEYS,
    TIMING_MODES,
    BackendNames,
    Failed,
    Profile,
    ProfileEntry,
    ProfileError,
    Shape,
    json_text,
    parse_profile,
    round_us,
    table_fingerprint,
    to_dict,
    upgrade,
)
from a2a_tune.tuner.runtime.table_fields import knobs_at
from a2a_tune.tuner.runtime.text import one_line

from .studies import stored_knobs

__all__ = [
    "FailureRow",
    "build_profile",
    "select_entries",
    "validate_profile",
    "with_knobs",
    "with_knobs_from_file",
    "write_knobs_into",
    "with_stored_knobs",
    "profile_for_run",
    "write_profile",
    "write_profile_to",
    "profile_from_store",
    "upgrade_profile",
    "ProfileError",
    "UnfinishedRunError",
]

log = logging.getLogger("a2a_tune")

# Precedence when one backend has several failures for one entry (lower wins).
_FAILURE_RANK = {"incorrect": 0, "crashed": 1, "unavailable": 2, "not_applicable": 2, "error": 3, "timeout": 4}


class FailureRow(NamedTuple):
    """Why a backend was not timed, as select reads it (the store's ``FailureRecord`` has the
    same attributes): a shape key or ``tokens_per_rank`` of None matches any."""

    backend: str
    kind: str
    reason: str | None = None
    tokens_per_rank: int | None = None
    ep_size: int | None = None
    hidden: int | None = None
    topk: int | None = None
    num_experts: int | None = None
    dtype: str | None = None
    routing: str | None = None


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("a2a-tune")
    except Exception:
        return "unknown"


def iso_timestamp(v):
    """datetime -> 'YYYY-MM-DDTHH:MM:SS[.ffffff]Z' (naive datetimes are taken as UTC)."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, _dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return v.isoformat() + "Z"
    return str(v)


#: How far after now a run's start may lie before its clock is taken as wrong (the clocks of
#: the nodes that wrote two stores may differ by this much).
CLOCK_SLACK = _dt.timedelta(hours=1)


def parse_date(date) -> _dt.datetime | None:
    if not isinstance(date, str):
        return None
    try:
        when = _dt.datetime.fromisoformat(date.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=_dt.timezone.utc)


def future_date(date) -> bool:
    """Whether a run's start (a provenance ``date``) lies after now, beyond the clocks' slack."""
    when = parse_date(date)
    return when is not None and when > _dt.datetime.now(_dt.timezone.utc) + CLOCK_SLACK


def build_profile(
    measurements: Iterable[Measurement],
    failures: Iterable,
    *,
    hardware: Mapping,
    run: Mapping,
    backend_names: Mapping,
    generated_at: _dt.datetime | str | None = None,
    status: str = "completed",
    fabrics: Mapping | None = None,
) -> Profile:
    """The :class:`Profile` of one run's measurements and failures.

    ``measurements``: the run's :class:`Measurement` values (timing "eager" | "graph";
    "cuda_graph" is read as "graph", None as "eager"). ``failures``: :class:`FailureRow`
    values or the store's records. ``hardware``: fingerprint, facts_hash, facts. ``run``:
    id, device_type, world_size, versions, started_at, finished_at (extra keys kept; a
    schema-1 style ``timing`` key is dropped: the mode is per backend now).
    ``backend_names``: backend -> {engines, closest, engine_options}
    (:func:`a2a_tune.kernels.registry.engine_names`; a run's recorded names from before the
    maps, one ``<engine>_name`` field each, are read too), in registry order (it sets the tie
    preference); a backend missing there gets nulls (with a warning). ``status``: the run's
    (each entry's ``provenance`` records it; ``fabric``: :func:`fabric_of` the run's recorded
    ``fabrics``, else the facts).

    With no usable measurement the result has no entries (callers check;
    :func:`write_profile` refuses it). Raises ``ValueError`` for a timing mode other than
    eager / graph, :class:`ProfileError` for a fingerprint a table cannot hold.
    """
    entries, preference = select_entries(measurements, failures, order=backend_names)
    source = (
        MappingProxyType(provenance_of(run.get("id"), run.get("started_at"), hardware.get("facts_hash"), status)),
    )
    world = run.get("world_size")
    entries = [
        e._replace(provenance=source, fabric=fabric_of(hardware.get("facts"), e.shape.ep_size, world, fabrics))
        for e in entries
    ]
    fingerprint = table_fingerprint(str(hardware.get("fingerprint")))
    if generated_at is None:
        generated_at = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    run_out = _run_section(run)
    return Profile(
        path=None,
        schema=SCHEMA_VERSION,
        fingerprint=fingerprint,
        backends=MappingProxyType({b: _engine_names(b, backend_names) for b in sorted(preference)}),
        tie_preference=tuple(preference),
        entries=tuple(entries),
        by_shape=MappingProxyType({e.shape: e for e in entries}),
        capacity=run_out.get("capacity"),
        meta=MappingProxyType(
            {
                "generated_by": f"a2a-tune {_version()}",
                "generated_at": iso_timestamp(generated_at),
                "hardware": {"facts_hash": hardware.get("facts_hash"), "facts": hardware.get("facts")},
                "run": run_out,
            }
        ),
    )


def provenance_of(run_id, started_at, facts_hash, status: str) -> dict:
    """One entry's provenance record of a run: {run, date, facts_hash, status}."""
    return {"run": run_id, "date": iso_timestamp(started_at), "facts_hash": facts_hash, "status": status}


def fabric_of(facts, ep_size: int, world_size, recorded=None) -> str | None:
    """What the groups of ``ep_size`` consecutive ranks span (:data:`FABRICS`), the widest over
    the groups: as the run ``recorded`` it (its config's ``fabrics``, EP size -> fabric, from
    where each rank really ran: :meth:`~a2a_tune.tuner.cluster.ClusterView.fabrics`), else from
    the probe's ``facts``, assuming rank r is GPU r (ranks numbered node by node, as the probe
    orders the nodes: runs from before the record). None when neither can tell: no GPUs (CPU
    ranks), or more ranks than GPUs (virtual ranks)."""
    if isinstance(recorded, Mapping) and recorded.get(str(ep_size)) in FABRICS:
        return recorded[str(ep_size)]
    gpus = facts.get("gpus") if isinstance(facts, Mapping) else None
    world = world_size if isinstance(world_size, int) else 0
    if not isinstance(gpus, list) or not gpus or not 0 < ep_size <= world <= len(gpus):
        return None
    try:
        node_of = {g["index"]: g["node"] for g in gpus}
        island_of = {r: i for i, isl in enumerate(facts.get("islands") or []) for r in isl["gpus"]}
    except (KeyError, TypeError):
        return None
    widest = 0
    for start in range(0, world - ep_size + 1, ep_size):
        group = range(start, start + ep_size)
        islands = {island_of.get(r) for r in group}
        if None in islands or len(islands) > 1:
            widest = 2
        elif len({node_of.get(r) for r in group}) > 1:
            widest = max(widest, 1)
    return FABRICS[widest]


def _engine_names(backend: str, backend_names: Mapping) -> BackendNames:
    """A table's ``backends.<b>``: the engines map (every engine, null where it has no
    literal), the closest literals and the engine options, from the registry's names."""
    spec = backend_names.get(backend)
    if spec is None:
        log.warning("a2a-tune select: no engine names for backend %r; writing null literals", backend)
        spec = {}
    # The registry's maps, or a run recorded before them (one field per engine).
    given = dict(spec.get("engines") or {e: spec.get(f"{e}_name") for e in ENGINES})
    closest = dict(spec.get("closest") or {"vllm": spec.get("vllm_closest")})
    literals = {e: given.get(e) for e in (*ENGINES, *sorted(set(given) - set(ENGINES)))}
    closest = {e: v for e, v in closest.items() if v and not given.get(e)}
    return BackendNames.of(literals, closest, spec.get("engine_options") or None)


def select_entries(
    measurements: Iterable[Measurement], failures: Iterable, *, order: Iterable = ()
) -> tuple[list, list]:
    """(entries, tie preference) of one run's measurements and failures, by the rules of
    docs/architecture.md ("Selection table"): what :func:`build_profile` writes, and what the
    views show of a run. Entries are :class:`ProfileEntry` values without provenance.

    ``order``: backend names in registry order (after the engine default, they rank first in
    the tie preference); the preference lists every backend measured or failed.
    """
    # shape -> backend -> timing mode -> tokens -> (median, p10, p90, figures)
    points: dict = {}
    seen_backends = set()
    for m in measurements:
        backend, shape, t, med = m.backend, Shape(*m.point.shape), m.point.tokens_per_rank, m.median_us
        if not isinstance(t, int) or isinstance(t, bool) or t < 1:
            raise ValueError(
                f"measurement of {backend} at {tuple(shape)}: tokens_per_rank={t!r} is not a positive integer"
            )
        if not _in_range(med):
            log.warning(
                "a2a-tune select: ignoring %s %s at %s tokens/rank: median_us=%r", backend, tuple(shape), t, med
            )
            continue
        timing = m.timing or "eager"
        timing = "graph" if str(timing).lower() in GRAPH_WORDS else timing
        if timing not in TIMING_MODES:
            raise ValueError(
                f"measurement of {backend} at {tuple(shape)}: timing={timing!r} is not one of {TIMING_MODES}"
            )
        seen_backends.add(backend)
        stats = _stats(float(med), _opt_us(m.p10_us), _opt_us(m.p90_us)) + (_table_figures(m),)
        per_t = points.setdefault(shape, {}).setdefault(backend, {}).setdefault(timing, {})
        if t not in per_t or stats[0] < per_t[t][0]:
            per_t[t] = stats

    failures = list(failures)
    seen_backends.update(f.backend for f in failures)
    preference = _tie_preference(seen_backends, order)
    entries = [_build_entry(shape, points[shape], failures) for shape in sorted(points, key=shape_sort_key)]
    return entries, preference


def _table_figures(m: Measurement) -> dict:
    """A measurement's figures as a table holds them, under their table keys (a figure without
    one, absent or out of range: left out)."""
    out = {}
    for f in FIGURES:
        value = m.figure(f.name)
        if f.table is None or value is None:
            continue
        value = [_table_value(f, v) for v in value] if f.many else _table_value(f, value)
        if value is not None:
            out[f.table] = value
    return out


def _table_value(f: Figure, v):
    """One value of figure `f` as a table holds it: a time to the nanosecond within the range a
    table holds, a count >= 0 (whole where declared so) in the table's unit; else None."""
    if f.is_time:
        v = _opt_us(v)
        return None if v is None else round_us(v)
    number = int if f.integer else (int, float)
    if isinstance(v, number) and not isinstance(v, bool) and 0 <= v < float("inf"):
        return round(float(v) / f.table_scale, f.table_digits)
    return None


def _in_range(v) -> bool:
    """A time a table may hold (see the module docstring)."""
    return v is not None and MIN_US <= v <= MAX_US


def _opt_us(v):
    return float(v) if _in_range(v) else None


def _stats(med: float, p10, p90) -> tuple:
    """(median, p10, p90) with a spread that contains the median (a p10 above or a p90
    below the median is a broken statistic: dropped)."""
    return med, (p10 if p10 is not None and p10 <= med else None), (p90 if p90 is not None and p90 >= med else None)


def _tie_preference(backends: set, registry_order: Iterable) -> list:
    """Engine default first, then registry order, then by name."""
    order = [FALLBACK_BACKEND] if FALLBACK_BACKEND in backends else []
    order += [b for b in registry_order if b in backends and b not in order]
    return order + sorted(b for b in backends if b not in order)


def shape_sort_key(shape: tuple) -> tuple:
    ep, hidden, topk, ne, dtype, routing = shape
    return (ep, str(dtype), hidden, topk, ne, str(routing))


def _run_section(run: Mapping) -> dict:
    out = dict(run)  # keep extra keys (git sha, status, ...)
    for key in ("id", "device_type", "world_size", "versions", "started_at", "finished_at"):
        out.setdefault(key, None)
    out.pop("timing", None)  # schema 2: per backend per entry
    out["versions"] = {str(k): (None if v is None else str(v)) for k, v in dict(out.get("versions") or {}).items()}
    for key, value in out.items():
        if isinstance(value, _dt.datetime) or key in ("started_at", "finished_at"):
            out[key] = iso_timestamp(value)
    return out


def _failure_applies(f, shape: Shape) -> bool:
    return all(getattr(f, k) is None or getattr(f, k) == v for k, v in zip(SHAPE_KEYS, shape))


def _failure_of(f) -> Failed:
    """A table's ``failed.<b>``: the store's failure as structure (:class:`~a2a_tune.tuner.runtime.table.Failed`)."""
    reason = one_line(f.reason or "no reason recorded", None)  # the store bounds it
    return Failed(f.kind or "error", f.tokens_per_rank, reason)


def _pick_mode(per_mode: dict) -> str:
    """One timing mode per backend per entry: the one covering more token counts, graph on a draw."""
    return max(per_mode, key=lambda mode: (len(per_mode[mode]), mode == "graph"))


def _build_entry(shape: Shape, per_backend: dict, failures: list) -> ProfileEntry:
    per_backend = {b: (mode, modes[mode]) for b, modes in per_backend.items() for mode in [_pick_mode(modes)]}
    tokens = tuple(sorted({t for _, per_t in per_backend.values() for t in per_t}))

    failed: dict = {}  # backend -> (rank, Failed)
    for f in failures:
        if not _failure_applies(f, shape):
            continue
        if f.kind in ("error", "timeout") and f.backend in per_backend:
            continue  # just a null at that point
        rank = _FAILURE_RANK.get(f.kind, len(_FAILURE_RANK))
        if f.backend not in failed or rank < failed[f.backend][0]:
            failed[f.backend] = (rank, _failure_of(f))

    medians, p10s, p90s, timings, figures = {}, {}, {}, {}, {}
    for b in sorted(per_backend):
        mode, per_t = per_backend[b]
        cols = [per_t.get(t) for t in tokens]
        timings[b] = mode
        medians[b] = tuple(None if c is None else round_us(c[0]) for c in cols)
        p10s[b] = tuple(None if c is None or c[1] is None else round_us(c[1]) for c in cols)
        p90s[b] = tuple(None if c is None or c[2] is None else round_us(c[2]) for c in cols)
        rows = {}
        for key in (f.table for f in FIGURES if f.table):
            row = tuple(None if c is None else c[3].get(key) for c in cols)
            if any(v is not None for v in row):
                rows[key] = row
        if rows:
            figures[b] = MappingProxyType(rows)

    return ProfileEntry(
        shape=shape,
        source="measured",
        tokens=tokens,
        median_us=MappingProxyType(medians),
        p10_us=MappingProxyType(p10s),
        p90_us=MappingProxyType(p90s),
        timing=MappingProxyType(timings),
        failed=MappingProxyType({b: why for b, (_, why) in sorted(failed.items())}),
        knobs=MappingProxyType({}),
        figures=MappingProxyType(figures),
        provenance=(),
        fabric=None,
    )


# ----------------------------------------------------------------- validate / write


@cache
def _validator(version: int):
    from importlib.resources import files

    import jsonschema

    text = files("a2a_tune.profiles").joinpath(f"schema-v{version}.json").read_text(encoding="utf-8")
    schema = json.loads(text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _json_path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "top level"


def _check_schema(table: dict) -> None:
    """``table`` (a current-schema object, or one a file holds) against its published JSON
    Schema: :class:`ProfileError` naming the JSON path of the first error."""
    from jsonschema.exceptions import best_match

    version = table.get("schema") if isinstance(table, Mapping) else None
    if type(version) is not int or version not in READABLE_SCHEMAS:
        # Let the reader word it: one line naming the field `schema`.
        parse_profile(table)
    err = best_match(_validator(version).iter_errors(table))
    if err is not None:
        raise ProfileError(one_line(err.message), field=_json_path(err.absolute_path))


def validate_profile(profile: dict) -> Profile:
    """A table object from outside (a file's JSON, schema 1 to 4), checked against its
    published schema (profiles/schema-v<N>.json), then read (the rules JSON Schema cannot
    state): the :class:`Profile`. Raises :class:`ProfileError` naming the JSON path of the
    first error, e.g. ``entries[0].backends.nccl_all2allv.median_us[2]: -1.0 is not valid
    under any of the given schemas``."""
    _check_schema(profile)
    return parse_profile(profile)


def upgrade_profile(profile: dict) -> dict:
    """A profile dict of any readable schema as the current one (:func:`a2a_tune.tuner.runtime.table.upgrade`:
    the conversion lookup does on load, written back). Raises :class:`ProfileError` if the
    input does not load."""
    return upgrade(profile)


def write_profile(profile: Profile, directory: Path) -> Path:
    """Atomically write ``directory / profile_filename(fingerprint)`` (:func:`write_profile_to`)."""
    return write_profile_to(profile, Path(directory) / profile_filename(profile.fingerprint))


def write_profile_to(profile: Profile, target: Path) -> Path:
    """Write ``profile`` into the file ``target``: its current-schema object
    (:func:`~a2a_tune.tuner.runtime.table.to_dict`) checked once against the published JSON
    Schema, then atomically replacing the file (a reader, an engine starting up, sees the old
    file or the new one, never a partial one; a symlink is written through to its target).
    Raises :class:`ProfileError` (an empty table included) or OSError."""
    if not profile.entries:
        raise ProfileError("empty table (no entries)", field="entries")
    table = to_dict(profile)
    _check_schema(table)
    try:
        text = json_text(table)
    except ValueError as exc:  # NaN / inf slipped past the schema
        raise ProfileError(str(exc)) from None
    return Path(replace_file(target, text))


def with_knobs(
    profile: Profile, shape: Mapping, backend: str, knobs_by_tokens: Mapping[int, Mapping]
) -> tuple[Profile, list[str]]:
    """``profile`` whose entry for ``shape`` (the :data:`SHAPE_KEYS`) holds ``knobs_by_tokens``
    (token count -> knob setting) in ``backend``'s ``knobs``, aligned with the entry's
    ``tokens``. Returns (the new profile, one line per token count or shape that could not be
    written: not in the table). Raises ProfileError for a setting a table cannot hold."""
    want = Shape(*(shape[k] for k in SHAPE_KEYS))
    entry = profile.by_shape.get(want)
    where = ", ".join(f"{k}={v}" for k, v in zip(SHAPE_KEYS, want))
    if entry is None:
        return profile, [f"the table has no entry for {where}"]
    if backend not in entry.median_us:
        return profile, [f"the entry for {where} has no {backend} curve"]
    tokens = entry.tokens
    row = [None if k is None else dict(k) for k in entry.knobs.get(backend, (None,) * len(tokens))]
    notes = []
    for t, setting in sorted(knobs_by_tokens.items()):
        if t not in tokens:
            notes.append(f"{t} tokens/rank is not one of the entry's token counts ({', '.join(map(str, tokens))})")
            continue
        row[tokens.index(t)] = dict(setting)
    knobs = {**entry.knobs, backend: knobs_at(row, len(tokens), f"knobs of {backend} at {where}")}
    return replace_entry(profile, entry._replace(knobs=MappingProxyType(knobs))), notes


def replace_entry(profile: Profile, entry: ProfileEntry) -> Profile:
    """``profile`` with its entry of ``entry.shape`` replaced by ``entry``."""
    return profile.with_entries(entry if e.shape == entry.shape else e for e in profile.entries)


def with_knobs_from_file(
    path: Path, shape: Mapping, backend: str, knobs_by_tokens: Mapping[int, Mapping]
) -> tuple[Profile, list[str]]:
    """:func:`with_knobs` on the table in file `path` (`tune-knobs --profile`), which is first
    read and judged as lookup reads and judges it. Write it back with
    :func:`write_profile_to`, or do both under the table's lock with :func:`write_knobs_into`.
    Raises ProfileError (one line naming the file) for a file the lookup would refuse,
    unreadable or not JSON included."""
    from .runtime.profiles import parse_table_json, read_table_bytes

    table = parse_profile(parse_table_json(read_table_bytes(path), path), str(path))  # as the lookup reads it
    return with_knobs(table, shape, backend, knobs_by_tokens)


def write_knobs_into(path: Path, shape: Mapping, backend: str, knobs_by_tokens: Mapping[int, Mapping]) -> list[str]:
    """Read the table in file `path`, add the knobs (:func:`with_knobs_from_file`) and write
    it back, all under the lock of its directory and fingerprint that `select` and `run` take
    (:func:`~a2a_tune.tuner.runtime.profiles.table_lock`), so no writer's entries are lost in
    between. Returns the lines of what could not be written; raises ProfileError or OSError."""
    from .runtime.profiles import table_lock

    with table_lock(None, file=path):
        updated, notes = with_knobs_from_file(path, shape, backend, knobs_by_tokens)
        write_profile_to(updated, path)
    return notes


# ------------------------------------------------------------------ store adapter
# Kept apart on purpose: the only place that knows the store's API (a2a_tune.db).


def profile_from_store(store, run_id, *, backend_names: Mapping) -> Profile:
    """Build the profile for ``run_id`` from a store: its ``get_run``, ``hardware_for_run``,
    ``measurements`` and ``failures`` (the store's records)."""
    run = store.get_run(run_id)
    hw = store.hardware_for_run(run_id)
    config = run.config or {}
    capacity = config.get("capacity")
    run_section = {
        **({"capacity": capacity} if capacity is not None else {}),  # fixed-capacity backends' size
        **({"cluster": config["cluster"]} if config.get("cluster") else {}),  # a multi-node or mixed job's nodes
        "id": run.id,
        "device_type": run.device_type,
        "world_size": run.world_size,
        "versions": run.versions or {},
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        # when its command began, and its latest --resume (show counts the run's duration from there)
        **{k: v for k in ("launched_at", "resumed_at") if (v := getattr(run, k, None)) is not None},
    }
    return build_profile(
        store.measurements(run_id),
        store.failures(run_id),
        hardware={"fingerprint": hw.fingerprint, "facts_hash": hw.facts_hash, "facts": hw.facts},
        run=run_section,
        backend_names=backend_names,
        status=run.status or "completed",
        fabrics=config.get("fabrics"),
    )


def with_stored_knobs(profile: Profile, store) -> tuple[Profile, int]:
    """`profile` with the launch knobs `tune-knobs` stored in `store` (an open Store) for its
    hardware, wherever the table has that shape, backend and token count: (profile, tuned
    points kept). The store is only read (:func:`a2a_tune.tuner.studies.stored_knobs`)."""
    found = stored_knobs(store, profile.fingerprint, profile.capacity)
    kept = 0
    for key, knobs in found:
        profile, notes = with_knobs(profile, key.point.shape._asdict(), key.backend, {key.tokens_per_rank: knobs})
        kept += not notes
    return profile, kept


def run_engine_names(config: Mapping) -> dict:
    """`backend_names` for a run's table, without importing any out-of-tree backend module
    (A2A_TUNE_BACKEND_MODULES: `select` must work when one hangs or is gone): what the sweep
    recorded in the run's config (``engine_names``: [name, literals] in registry order), with
    today's literals for the backends shipped here, then shipped backends it did not list."""
    from a2a_tune.kernels import engine_names

    shipped = engine_names(extra=False)
    recorded = [e for e in config.get("engine_names") or () if isinstance(e, list | tuple) and len(e) == 2]
    names = {name: shipped.get(name, spec) for name, spec in recorded if isinstance(spec, Mapping)}
    for name, spec in shipped.items():
        names.setdefault(name, spec)
    return names


class UnfinishedRunError(ValueError):
    """`select` of a run that did not complete, not asked for with ``partial=True``."""


def profile_for_run(url: str | None, run_id: int | None, *, partial: bool = False) -> tuple[Profile, int, str | None]:
    """The table of run `run_id` (None: the latest completed run; the table's ``run.id`` says
    which) in the store at `url`, opened read-only, with its stored knobs
    (:func:`with_stored_knobs`): (profile, tuned points kept, a note when the knobs could not
    be read -- the table is good without them). A run still running, interrupted or failed
    is refused (:class:`UnfinishedRunError`, one line) unless ``partial``: then its entries
    record that status (their ``provenance``), which marks the table partial. Raises
    EmptyStoreError, NotFoundError (no such run, or no completed one), StoreError, or
    ValueError for a run without measurements."""
    from a2a_tune.db import NotFoundError, open_store

    with open_store(url, readonly=True) as store:
        if run_id is None:
            run = store.latest_run(status="completed")
            if run is None:
                raise NotFoundError("no completed run in the database")
            run_id = run.id
        run = store.get_run(run_id)
        if run.status != "completed" and not partial:
            raise UnfinishedRunError(
                f"run {run_id} is {run.status}, not completed: its table would lack what it did not measure; "
                "pass --partial to write it anyway, marked partial"
            )
        profile = profile_from_store(store, run_id, backend_names=run_engine_names(run.config))
        if future_date(iso_timestamp(run.started_at)):
            log.warning(
                "a2a-tune select: run %s is dated %s, after now (a wrong clock?); merged into a table, "
                "its measurements are kept only where no other run measured",
                run_id,
                iso_timestamp(run.started_at),
            )
        if not profile.entries:
            raise ValueError(f"run {run_id} has no measurements to select from")
        try:
            profile, kept = with_stored_knobs(profile, store)
        except Exception as exc:  # noqa: BLE001 - knobs are an extra: the table is written without them
            return profile, 0, f"tuned knobs not read ({one_line(exc)})"
    return profile, kept, None
