"""Selection: turn one sweep run's measurements into a profile (the default-selection table).

Flow position: probe -> sweep -> store -> **select** -> lookup. This module works on
:class:`~a2a_tune.tuner.runtime.measurement.Measurement` values and plain failure records
(mappings, or objects with the same attribute names) so it is testable without a database;
:func:`profile_from_store` at the bottom is the thin adapter to ``a2a_tune.db``.

Rules:

* One entry per shape (ep_size, hidden, topk, num_experts, dtype, routing). Its
  ``tokens`` are every token count per rank measured for that shape; each backend's
  ``median_us`` / ``p10_us`` / ``p90_us`` arrays align with them, null where the backend
  has no measurement (an "error" / "timeout" at that point, or never run there).
* A backend that failed the correctness check ("incorrect") at ANY token count of a
  shape is listed in that entry's ``failed`` and is never a winner for that shape --
  a backend that gives wrong answers is never selected. Its timings stay in the table
  for inspection; lookup ignores them too.
* "unavailable" and "not_applicable" (the run's EP group is beyond the backend's reach)
  failures without a shape go into every entry's ``failed``; with a (partial) shape, into
  the matching entries (a None shape key matches anything).
* A backend with no measurement at all for a shape and only "error"/"timeout"
  failures there is listed in ``failed`` as well, so the table says why it is absent.
* A backend that killed a rank's process ("crashed") at any token count of a shape is
  listed in that entry's ``failed``, like an incorrect one: an engine must never start it.
* ``winners``: per token count, among the non-failed backends, the ``fastest`` by
  median, the ``runner_up``, ``margin = runner_up / fastest - 1`` and ``tie``: whether the
  fastest's p10..p90 spread (capped at 3%) holds another backend's median. Without a tie
  the winner (``backend``) is the fastest; with one it is the most preferred backend inside
  that spread (:func:`a2a_tune.tuner.runtime.estimate.winners`, the rule lookup and the views
  apply too) in the order written as ``tie_preference``: the engine default
  ``allgather_reducescatter`` first (a difference the measurement cannot resolve is no
  reason to leave the engine's default), then the order of ``backend_names`` (the
  registry's order: registered first, preferred first), then any other backend by name.
* Times are stored to the nanosecond; a measurement whose median lies outside the range a
  table may hold (:data:`~a2a_tune.tuner.runtime.table.MIN_US` ..
  :data:`~a2a_tune.tuner.runtime.table.MAX_US`) is left out with a warning.
* A point measured twice in one timing mode (e.g. a resumed sweep) keeps the lower median.
* Schema 3's figures (every :data:`~a2a_tune.tuner.runtime.measurement.FIGURES` with a table
  key, under that key) come from the same measurement as the median kept: its dispatch and
  combine medians, its byte counts and its workspace (bytes -> MiB), as each figure declares;
  a backend gets only the figure arrays that hold a value somewhere, so tables of runs from
  before them carry the round trip alone.
* Timing modes may differ between backends (schema 2: ``timing`` per backend per entry;
  capturable backends are timed under CUDA-graph replay, as engines run them in decode).
  One backend keeps ONE mode per entry, so its curve is never a patchwork: the mode that
  covers more of the entry's token counts, ``graph`` on a draw.

* A failure is written as structure, ``{kind, tokens, reason}``
  (:class:`~a2a_tune.tuner.runtime.table.Failed`); each entry records its ``provenance`` (this
  run: id, start, facts hash, status) and the ``fabric`` its EP groups span (:func:`fabric_of`).

The file is ``profile_filename(fingerprint)`` from :mod:`a2a_tune.tuner.runtime.profiles` -- the
one key function shared with the reader -- written through the reader's model
(:func:`~a2a_tune.tuner.runtime.table.to_json`), atomically. Merging it into the table already
on disk is :func:`a2a_tune.tuner.publish.write_table`'s (:mod:`a2a_tune.tuner.tables`).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

from a2a_tune.tuner.runtime.engines import ENGINES
from a2a_tune.tuner.runtime.estimate import winners
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
    Failed,
    ProfileError,
    parse_profile,
    round_us,
    to_json,
    upgrade,
)
from a2a_tune.tuner.runtime.text import one_line

from .studies import stored_knobs

__all__ = [
    "build_profile",
    "select_entries",
    "validate_profile",
    "with_knobs",
    "with_knobs_from_file",
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


def _get(obj, key, default=None):
    """Mapping lookup with an attribute fallback (ORM rows, dataclasses)."""
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


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
) -> dict:
    """Build a current-schema profile dict from one run's measurements and failures.

    ``measurements``: the run's :class:`Measurement` values (timing "eager" | "graph";
    "cuda_graph" is read as "graph", None as "eager"). ``failures``: backend, kind
    ("incorrect" | "crashed" | "unavailable" | "not_applicable" | "error" | "timeout"), reason, and shape keys /
    tokens_per_rank, any of which may be None. ``hardware``: fingerprint, facts_hash,
    facts. ``run``: id, device_type, world_size, versions, started_at, finished_at (extra
    keys kept; a schema-1 style ``timing`` key is dropped: the mode is per backend now).
    ``backend_names``: backend -> {engines, closest, engine_options} (mapping or object;
    :func:`a2a_tune.kernels.registry.engine_names`; a run's recorded names from before the
    maps, one ``<engine>_name`` field each, are read too), in
    registry order (it sets the tie preference); a backend missing there gets nulls (with
    a warning). ``status``: the run's (each entry's ``provenance`` records it; ``fabric``:
    :func:`fabric_of` the run's recorded ``fabrics``, else the facts).

    With no usable measurement the result has ``entries == []`` (callers check;
    :func:`write_profile` refuses it). Raises ``ValueError`` for a timing mode other than
    eager / graph. The result is not validated; :func:`write_profile` does that.
    """
    failures = list(failures)
    entries, preference = select_entries(
        measurements, failures, order=backend_names if isinstance(backend_names, Mapping) else ()
    )
    source = provenance_of(run, hardware, status)
    for e in entries:
        e["provenance"] = [dict(source)]
        fabric = fabric_of(_get(hardware, "facts"), e["ep_size"], _get(run, "world_size"), fabrics)
        if fabric is not None:
            e["fabric"] = fabric
    backends_out = {b: _engine_names(b, backend_names) for b in sorted(preference)}

    if generated_at is None:
        generated_at = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    return {
        "schema": SCHEMA_VERSION,
        "generated_by": f"a2a-tune {_version()}",
        "generated_at": iso_timestamp(generated_at),
        "hardware": {
            "fingerprint": _get(hardware, "fingerprint"),
            "facts_hash": _get(hardware, "facts_hash"),
            "facts": _get(hardware, "facts"),
        },
        "run": _run_section(run),
        "backends": backends_out,
        "tie_preference": preference,
        "entries": entries,
    }


def provenance_of(run, hardware, status: str) -> dict:
    """One entry's provenance from ``run`` (a mapping or object): {run, date, facts_hash, status}."""
    return {
        "run": _get(run, "id"),
        "date": iso_timestamp(_get(run, "started_at")),
        "facts_hash": _get(hardware, "facts_hash"),
        "status": status,
    }


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


def _engine_names(backend: str, backend_names) -> dict:
    """A table's ``backends.<b>``: the engines map (every engine, null where it has no
    literal), the closest literals and the engine options, from the registry's names."""
    spec = backend_names.get(backend) if isinstance(backend_names, Mapping) else None
    if spec is None:
        log.warning("a2a-tune select: no engine names for backend %r; writing null literals", backend)
    given, closest = {}, {}
    if spec is not None:  # the registry's maps, or a run recorded before them (one field per engine)
        given = dict(_get(spec, "engines") or {e: _get(spec, f"{e}_name") for e in ENGINES})
        closest = dict(_get(spec, "closest") or {"vllm": _get(spec, "vllm_closest")})
    out = {"engines": {e: given.get(e) for e in (*ENGINES, *sorted(set(given) - set(ENGINES)))}}
    closest = {e: v for e, v in closest.items() if v and not given.get(e)}
    if closest:
        out["closest"] = closest
    options = _get(spec, "engine_options") if spec is not None else None
    if options:
        out["engine_options"] = {engine: list(opts) for engine, opts in options.items()}
    return out


def select_entries(
    measurements: Iterable[Measurement], failures: Iterable, *, order: Iterable = ()
) -> tuple[list, list]:
    """(entries, tie preference) of one run's measurements and failures, by the rules of the
    module docstring: what :func:`build_profile` writes, and what the views show of a run.

    ``order``: backend names in registry order (after the engine default, they rank first in
    the tie preference); the preference lists every backend measured or failed.
    """
    # shape -> backend -> timing mode -> tokens -> (median, p10, p90)
    points: dict = {}
    seen_backends = set()
    for m in measurements:
        backend, shape, t, med = m.backend, tuple(m.point.shape), m.point.tokens_per_rank, m.median_us
        if not isinstance(t, int) or isinstance(t, bool) or t < 1:
            raise ValueError(f"measurement of {backend} at {shape}: tokens_per_rank={t!r} is not a positive integer")
        if not _in_range(med):
            log.warning("a2a-tune select: ignoring %s %s at %s tokens/rank: median_us=%r", backend, shape, t, med)
            continue
        timing = m.timing or "eager"
        timing = "graph" if str(timing).lower() in GRAPH_WORDS else timing
        if timing not in TIMING_MODES:
            raise ValueError(f"measurement of {backend} at {shape}: timing={timing!r} is not one of {TIMING_MODES}")
        seen_backends.add(backend)
        stats = _stats(float(med), _opt_us(m.p10_us), _opt_us(m.p90_us)) + (_table_figures(m),)
        per_t = points.setdefault(shape, {}).setdefault(backend, {}).setdefault(timing, {})
        if t not in per_t or stats[0] < per_t[t][0]:
            per_t[t] = stats

    failures = list(failures)
    seen_backends.update(_get(f, "backend") for f in failures)
    preference = _tie_preference(seen_backends, order)
    entries = [_build_entry(shape, points[shape], failures, preference) for shape in sorted(points, key=shape_sort_key)]
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


def _run_section(run) -> dict:
    out = {}
    if isinstance(run, Mapping):
        out.update(run)  # keep extra keys (git sha, status, ...)
    for key in ("id", "device_type", "world_size", "versions", "started_at", "finished_at"):
        if key not in out:
            out[key] = _get(run, key)
    out.pop("timing", None)  # schema 2: per backend per entry
    out["versions"] = {str(k): (None if v is None else str(v)) for k, v in dict(out.get("versions") or {}).items()}
    for key, value in out.items():
        if isinstance(value, _dt.datetime) or key in ("started_at", "finished_at"):
            out[key] = iso_timestamp(value)
    return out


def _failure_applies(f, shape: tuple) -> bool:
    return all(_get(f, k) is None or _get(f, k) == v for k, v in zip(SHAPE_KEYS, shape))


def _failure_of(f) -> dict:
    """A table's ``failed.<b>``: the store's failure as structure (:class:`~a2a_tune.tuner.runtime.table.Failed`)."""
    reason = one_line(_get(f, "reason") or "no reason recorded", None)  # the store bounds it
    return Failed(_get(f, "kind") or "error", _get(f, "tokens_per_rank"), reason)._asdict()


def _pick_mode(per_mode: dict) -> str:
    """One timing mode per backend per entry: the one covering more token counts, graph on a draw."""
    return max(per_mode, key=lambda mode: (len(per_mode[mode]), mode == "graph"))


def table_winners(tokens: list, backends: dict, failed, preference: list) -> list:
    """The entry's ``winners`` array (the one rule: :func:`~a2a_tune.tuner.runtime.estimate.winners`)."""
    curves = {key: {b: c[key] for b, c in backends.items()} for key in ("median_us", "p10_us", "p90_us")}
    return [
        w._asdict()
        for w in winners(tokens, curves["median_us"], curves["p10_us"], curves["p90_us"], failed, preference)
    ]


def _build_entry(shape: tuple, per_backend: dict, failures: list, preference: list) -> dict:
    per_backend = {b: (mode, modes[mode]) for b, modes in per_backend.items() for mode in [_pick_mode(modes)]}
    tokens = sorted({t for _, per_t in per_backend.values() for t in per_t})

    failed: dict = {}  # backend -> (rank, text)
    for f in failures:
        if not _failure_applies(f, shape):
            continue
        b, kind = _get(f, "backend"), _get(f, "kind")
        if kind in ("error", "timeout") and b in per_backend:
            continue  # just a null at that point
        rank = _FAILURE_RANK.get(kind, len(_FAILURE_RANK))
        if b not in failed or rank < failed[b][0]:
            failed[b] = (rank, _failure_of(f))

    backends = {}
    for b in sorted(per_backend):
        mode, per_t = per_backend[b]
        cols = [per_t.get(t) for t in tokens]
        backends[b] = {
            "timing": mode,
            "median_us": [None if c is None else round_us(c[0]) for c in cols],
            "p10_us": [None if c is None or c[1] is None else round_us(c[1]) for c in cols],
            "p90_us": [None if c is None or c[2] is None else round_us(c[2]) for c in cols],
        }
        for key in (f.table for f in FIGURES if f.table):
            row = [None if c is None else c[3].get(key) for c in cols]
            if any(v is not None for v in row):
                backends[b][key] = row

    winners = table_winners(tokens, backends, failed, preference)

    entry = dict(zip(SHAPE_KEYS, shape))
    entry.update(
        source="measured",
        tokens=tokens,
        backends=backends,
        winners=winners,
        failed={b: text for b, (_, text) in sorted(failed.items())},
    )
    return entry


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


def validate_profile(profile: dict) -> None:
    """Check ``profile`` against its published schema (profiles/schema-v<N>.json, N = 1, 2
    or 3, by its ``schema`` field), then the reader's own checks.

    Raises :class:`ProfileError` naming the JSON path of the first error, e.g.
    ``entries[0].backends.nccl_all2allv.median_us[2]: -1.0 is not valid under any of the given schemas``.
    """
    from jsonschema.exceptions import best_match

    version = profile.get("schema") if isinstance(profile, Mapping) else None
    if type(version) is not int or version not in READABLE_SCHEMAS:
        # Let the reader word it: one line naming the field `schema`.
        parse_profile(profile)
    err = best_match(_validator(version).iter_errors(profile))
    if err is not None:
        raise ProfileError(one_line(err.message), field=_json_path(err.absolute_path))
    # Cross-field rules JSON Schema cannot state (array lengths, known backends...):
    # whatever is written must load in lookup.
    parse_profile(profile)


def upgrade_profile(profile: dict) -> dict:
    """A profile dict of any readable schema as the current one (:func:`a2a_tune.tuner.runtime.table.upgrade`:
    the conversion lookup does on load, written back). Raises :class:`ProfileError` if the
    input does not load."""
    return upgrade(profile)


def write_profile(profile: dict, directory: Path) -> Path:
    """Validate, then atomically write ``directory / profile_filename(fingerprint)``
    (:func:`write_profile_to`)."""
    return write_profile_to(profile, Path(directory) / profile_filename(profile["hardware"]["fingerprint"]))


def write_profile_to(profile: dict, target: Path) -> Path:
    """Validate ``profile`` (its JSON Schema, then the reader), then atomically replace the file
    ``target`` with the reader's model of it written back (:func:`~a2a_tune.tuner.runtime.table.to_json`):
    a reader (an engine starting up) sees the old file or the new one, never a partial one."""
    validate_profile(profile)
    try:
        text = to_json(parse_profile(profile))
    except ValueError as exc:  # NaN / inf slipped past validation
        raise ProfileError(str(exc)) from None
    return Path(replace_file(target, text))


def with_knobs(
    profile: dict, shape: Mapping, backend: str, knobs_by_tokens: Mapping[int, Mapping]
) -> tuple[dict, list[str]]:
    """A copy of ``profile`` whose entry for ``shape`` (the :data:`SHAPE_KEYS`) holds
    ``knobs_by_tokens`` (token count -> knob setting) in ``backend``'s ``knobs`` array, which
    is aligned with the entry's ``tokens``. Returns (the copy, one line per token count or
    shape that could not be written: not in the table)."""
    import copy

    out = copy.deepcopy(profile)
    want = tuple(shape[k] for k in SHAPE_KEYS)
    entry = next((e for e in out.get("entries", []) if tuple(e.get(k) for k in SHAPE_KEYS) == want), None)
    where = ", ".join(f"{k}={v}" for k, v in zip(SHAPE_KEYS, want))
    if entry is None:
        return out, [f"the table has no entry for {where}"]
    curve = entry.get("backends", {}).get(backend)
    if curve is None:
        return out, [f"the entry for {where} has no {backend} curve"]
    tokens = entry["tokens"]
    row = list(curve.get("knobs") or [None] * len(tokens))
    notes = []
    for t, setting in sorted(knobs_by_tokens.items()):
        if t not in tokens:
            notes.append(f"{t} tokens/rank is not one of the entry's token counts ({', '.join(map(str, tokens))})")
            continue
        row[tokens.index(t)] = dict(setting)
    curve["knobs"] = row
    return out, notes


def with_knobs_from_file(
    path: Path, shape: Mapping, backend: str, knobs_by_tokens: Mapping[int, Mapping]
) -> tuple[dict, list[str]]:
    """:func:`with_knobs` on the table in file `path` (`tune-knobs --profile`), which is first
    read and judged as lookup reads and judges it. Write the copy back with
    :func:`write_profile_to`. Raises ProfileError (one line naming the file) for a file the
    lookup would refuse, unreadable or not JSON included."""
    from .runtime.profiles import parse_table_json, read_table_bytes

    table = parse_table_json(read_table_bytes(path), path)  # read as the lookup reads it
    parse_profile(table, str(path))
    return with_knobs(table, shape, backend, knobs_by_tokens)


# ------------------------------------------------------------------ store adapter
# Kept apart on purpose: the only place that knows the store's API (a2a_tune.db).


def profile_from_store(store, run_id, *, backend_names: Mapping) -> dict:
    """Build the profile for ``run_id`` from a store.

    Assumes ``store.measurements(run_id)``, ``store.failures(run_id)``,
    ``store.get_run(run_id)`` and ``store.hardware_for_run(run_id)`` returning objects
    (or mappings) whose attribute names are the keys :func:`build_profile` documents.
    """
    run = store.get_run(run_id)
    hw = store.hardware_for_run(run_id)
    config = _get(run, "config") or {}
    capacity = config.get("capacity")
    run_section = {
        **({"capacity": capacity} if capacity is not None else {}),  # fixed-capacity backends' size
        **({"cluster": config["cluster"]} if config.get("cluster") else {}),  # a multi-node or mixed job's nodes
        "id": _get(run, "id", run_id),
        "device_type": _get(run, "device_type"),
        "world_size": _get(run, "world_size"),
        "versions": _get(run, "versions") or {},
        "started_at": _get(run, "started_at"),
        "finished_at": _get(run, "finished_at"),
    }
    hardware = {
        "fingerprint": _get(hw, "fingerprint"),
        "facts_hash": _get(hw, "facts_hash"),
        "facts": _get(hw, "facts"),
    }
    return build_profile(
        store.measurements(run_id),
        store.failures(run_id),
        hardware=hardware,
        run=run_section,
        backend_names=backend_names,
        status=_get(run, "status") or "completed",
        fabrics=config.get("fabrics"),
    )


def with_stored_knobs(profile: dict, store) -> tuple[dict, int]:
    """`profile` with the launch knobs `tune-knobs` stored in `store` (an open Store) for its
    hardware, wherever the table has that shape, backend and token count: (profile, tuned
    points kept). The store is only read (:func:`a2a_tune.tuner.studies.stored_knobs`)."""
    found = stored_knobs(store, profile["hardware"]["fingerprint"], (profile.get("run") or {}).get("capacity"))
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


def profile_for_run(url: str | None, run_id: int | None, *, partial: bool = False) -> tuple[dict, int, str | None]:
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
        if not profile["entries"]:
            raise ValueError(f"run {run_id} has no measurements to select from")
        try:
            profile, kept = with_stored_knobs(profile, store)
        except Exception as exc:  # noqa: BLE001 - knobs are an extra: the table is written without them
            return profile, 0, f"tuned knobs not read ({one_line(exc)})"
    return profile, kept, None
