"""Read a table or a run into a :class:`~.model.TableView`.

* A **profile** (table file) is read by the one table reader,
  :func:`a2a_tune.tuner.runtime.table.parse_profile`, in its lenient mode: what the lookup
  refuses, a view refuses too (:class:`~.model.ViewError`, one line: the file and the field),
  and what the lookup tolerates (no winners written, winners that disagree with the curves)
  is shown and named in ``TableView.notes``. Winners are what the lookup answers at each
  measured token count: the tie rule over the curves
  (:func:`a2a_tune.tuner.runtime.estimate.winners`), never the copy written in the file.
* A **run** in a store (read only: a missing file is never created) becomes the entries
  ``a2a-tune select`` would write for it (:func:`a2a_tune.tuner.select.select_entries`: one
  timing mode per backend and shape, failures, winners by the same rule), read back by the
  same reader. Its tie preference is the engine default, then the run's backends in the
  order the run lists them (the registry's order, as select writes it).

Only input that is not a table at all (missing file, not JSON, not a database, no such run)
or a table the lookup refuses raises :class:`~.model.ViewError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..runtime.files import FileRefused, read_head
from ..runtime.measurement import Measurement
from ..runtime.profiles import parse_table_json, read_table_bytes
from ..runtime.table import (
    FALLBACK_BACKEND,
    GRAPH_WORDS,
    SHAPE_KEYS,
    ProfileEntry,
    ProfileError,
    entry_winners,
    parse_profile,
)
from ..select import fabric_of, iso_timestamp, provenance_of, select_entries
from ..studies import stored_knobs
from .model import RUN_TIMES, Curve, FailureView, ShapeView, TableView, ViewError, clean, shape_label

__all__ = [
    "is_sqlite_file",
    "load_profile_view",
    "load_run_view",
    "load_source",
    "load_view",
    "run_tie_preference",
    "view_from_records",
]

SQLITE_MAGIC = b"SQLite format 3\x00"


# ----------------------------------------------------------------------------- profiles


def _read_json(path: Path) -> Any:
    """The table at `path` read and decoded as the lookup reads it (`read_table_bytes`: capped,
    never blocking), so no view accepts a file the lookup refuses."""
    try:
        raw = read_table_bytes(path)
        if raw.startswith(SQLITE_MAGIC):
            raise ViewError(f"{path}: is an SQLite database, not a profile (pass it as --db)")
        return parse_table_json(raw, path)
    except ProfileError as exc:
        raise ViewError(str(exc)) from None


def _parse(data, label: str, notes: list):
    try:
        return parse_profile(data, label, notes=notes)
    except ProfileError as exc:
        raise ViewError(f"{exc} (the lookup refuses this table)") from None


def load_profile_view(path) -> TableView:
    """Read a profile JSON file (schema 1, 2 or 3) into a view; refuse what the lookup refuses."""
    path = Path(path)
    data = _read_json(path)
    notes: list = []
    prof = _parse(data, str(path), notes)
    shapes = [_shape_view(e, prof.tie_preference) for e in prof.entries]
    failures = []
    for s in shapes:
        for b, f in s.failed.items():
            failures.append(FailureView(b, f.kind, f.reason, shape=s.key, tokens=f.tokens))
    hw = data["hardware"]
    run = dict(data.get("run")) if isinstance(data.get("run"), Mapping) else {}
    facts = _facts(hw.get("facts"), notes)
    _rehearsal(run, notes)
    unfinished = sorted(
        {(p["run"], p["status"]) for e in prof.entries for p in e.provenance if p["status"] != "completed"}, key=str
    )
    if unfinished:
        runs = ", ".join(f"run {clean(str(r))} {clean(s)}" for r, s in unfinished)
        notes.append(f"PARTIAL table: selected with --partial from {runs}; it may lack what those runs did not measure")
    return TableView(
        kind="profile",
        label=clean(path),
        fingerprint=prof.fingerprint,
        schema=prof.schema,
        generated_at=_str(data.get("generated_at")),
        generated_by=_str(data.get("generated_by")),
        facts_hash=_str(hw.get("facts_hash")) or _str(facts.get("facts_hash")),
        facts=facts,
        run=_normalise_run(run),
        backends={
            clean(k): {"engines": dict(n.literals), "closest": dict(n.closest)} for k, n in prof.backends.items()
        },
        shapes=shapes,
        failures=failures,
        notes=notes,
    )


#: What a table or run measured on CPU ranks is (`a2a-tune run` on a machine with fewer than 2 GPUs).
REHEARSAL_NOTE = (
    "measured on CPU ranks over gloo: a rehearsal of the flow, not a machine's figures "
    "(GPU timings come from --device cuda)"
)


def _rehearsal(run: Mapping, notes: list) -> None:
    if run.get("device_type") == "cpu":
        notes.append(REHEARSAL_NOTE)


def _str(v) -> str | None:
    return clean(v) if isinstance(v, str) else None


def _shape_view(entry: ProfileEntry, preference) -> ShapeView:
    """A validated entry as the views show it: curves, the winners lookup answers, failures."""
    c = clean
    curves = {
        c(b): Curve(
            c(b),
            entry.timing[b],
            list(entry.median_us[b]),
            list(entry.p10_us[b]),
            list(entry.p90_us[b]),
            {k: list(v) for k, v in entry.figures.get(b, {}).items()},
            knobs=[None if k is None else dict(k) for k in entry.knobs.get(b, ())],
        )
        for b in entry.median_us
    }
    winners = [
        w._replace(backend=c(w.backend), fastest=c(w.fastest), runner_up=w.runner_up and c(w.runner_up))
        for w in entry_winners(entry, preference)
    ]
    return ShapeView(
        entry.shape._replace(dtype=c(entry.shape.dtype), routing=c(entry.shape.routing)),
        source=entry.source,
        tokens=list(entry.tokens),
        curves=curves,
        winners=winners,
        failed={c(b): f._replace(kind=c(f.kind), reason=c(f.reason)) for b, f in entry.failed.items()},
        fabric=entry.fabric,
        provenance=[_clean_provenance(p) for p in entry.provenance],
    )


def _clean_provenance(p: Mapping) -> dict:
    """A provenance record with its text escaped for the terminal (run ids stay numbers)."""
    return {k: v if v is None or isinstance(v, int) else clean(v) for k, v in p.items()}


def _normalise_run(run: Mapping) -> dict:
    versions = run.get("versions") if isinstance(run.get("versions"), Mapping) else {}

    def text(v):
        return v if v is None or isinstance(v, (int, float)) else clean(v)

    return {
        "id": text(run.get("id")),
        "status": text(run.get("status")),
        "device_type": text(run.get("device_type")),
        "world_size": text(run.get("world_size")),
        "versions": {clean(k): (None if v is None else clean(v)) for k, v in versions.items()},
        "timing": text(run.get("timing")),
        **{k: text(iso_timestamp(run.get(k))) for k in RUN_TIMES},
        "git_sha": text(run.get("git_sha")),
        "config": dict(run["config"]) if isinstance(run.get("config"), Mapping) else {},
    }


# ----------------------------------------------------------------------------- runs


def _sqlite_file(url: str) -> str | None:
    """The file behind an SQLite URL, or None (another dialect, in-memory)."""
    if not url.startswith("sqlite"):
        return None
    try:
        from sqlalchemy.engine import make_url

        db = make_url(url).database
    except Exception:
        return None
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return db


def _check_db_file(url: str) -> None:
    """Views never create a database: open_store would create a missing or empty file."""
    path = _sqlite_file(url)
    if path is None:
        return
    p = Path(path)
    try:
        exists, is_dir = p.exists(), p.is_dir()
    except OSError as exc:  # e.g. a path component over the file system's 255 bytes
        raise ViewError(f"{clean(p)[:160]}: cannot open ({exc.strerror or exc})") from None
    if not exists:
        raise ViewError(f"no database at {p} (pass --db URL or --profile FILE)")
    if is_dir:
        raise ViewError(f"{p}: is a directory, not a database")
    try:
        head = read_head(p, len(SQLITE_MAGIC))
    except FileRefused as exc:
        raise ViewError(f"{p}: {exc}") from None
    except OSError as exc:
        raise ViewError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if not head:
        raise ViewError(f"{p}: empty file, not an a2a-tune database")
    if head != SQLITE_MAGIC:
        raise ViewError(f"{p}: not an SQLite database")


def load_run_view(db: str | None, run_id: int | None = None) -> TableView:
    """One run of a store as a view (``run_id`` None: the latest completed run, else the
    latest run of any status)."""
    from a2a_tune.db import NotFoundError, StoreError, open_store, resolve_url
    from a2a_tune.db.store import display_url

    url = resolve_url(db)
    shown = display_url(url)
    _check_db_file(url)
    try:
        with open_store(url, readonly=True) as store:
            if run_id is None:
                run = store.latest_run(status="completed") or store.latest_run(status=None)
                if run is None:
                    raise ViewError(f"{shown} holds no runs; run `a2a-tune sweep` first")
            else:
                try:
                    run = store.get_run(run_id)
                except NotFoundError:
                    known = ", ".join(str(r.id) for r in reversed(store.runs())) or "none"
                    raise ViewError(f"no run {run_id} in {shown} (runs: {known})") from None
            hw = store.hardware_for_run(run.id)
            measurements = store.measurements(run.id)
            failures = store.failures(run.id)
            capacity = run.config.get("capacity") if isinstance(run.config, Mapping) else None
            tuned = stored_knobs(store, hw.fingerprint, capacity)
    except StoreError as exc:
        raise ViewError(str(exc)) from None
    view = view_from_records(run, hw, measurements, failures, label=f"{shown} run {run.id}")
    _attach_knobs(tuned, view.shapes)
    return view


def _attach_knobs(tuned, shapes: list) -> None:
    """Each curve's tuned setting per token count, from the store's rows ((key, knobs) each,
    :func:`a2a_tune.tuner.studies.stored_knobs`), where a shape, backend and token count match."""
    by_point = {(key.point.shape, key.backend, key.tokens_per_rank): knobs for key, knobs in tuned}
    for s in shapes:
        for backend, curve in s.curves.items():
            found = [by_point.get((s.shape, backend, t)) for t in s.tokens]
            curve.knobs = found if any(k is not None for k in found) else []


def run_tie_preference(config: Mapping | None) -> tuple:
    """select's tie preference for a run: the engine default, then the run's backends in order."""
    backends = [str(b) for b in (config or {}).get("backends", []) if isinstance(b, str)]
    return tuple(dict.fromkeys([FALLBACK_BACKEND, *backends]))


def view_from_records(run, hw, measurements: Iterable[Measurement], failures: Iterable, *, label: str) -> TableView:
    """Build a view from a run's store records (or objects with the same attributes) and its
    measurements: the entries select would write for the run, read back by the table reader."""
    g = _getter
    measurements = list(measurements)
    failures = list(failures)
    notes: list = []
    try:
        entries, preference = select_entries(measurements, failures, order=run_tie_preference(g(run, "config")))
    except ValueError as exc:  # a timing mode or token count select cannot write
        raise ViewError(f"{label}: {exc}") from None
    shapes = []
    if entries:
        shapes = [_shape_view(e, tuple(preference)) for e in entries]
        source = _clean_provenance(
            provenance_of(g(run, "id"), g(run, "started_at"), g(hw, "facts_hash"), g(run, "status") or "completed")
        )
        config = g(run, "config")
        recorded = config.get("fabrics") if isinstance(config, Mapping) else None
        for shape in shapes:  # what select records of each entry
            shape.provenance = [source]
            shape.fabric = fabric_of(g(hw, "facts"), shape.ep_size, g(run, "world_size"), recorded)
    notes += _other_modes(measurements, shapes)
    _attach_group_us(measurements, shapes)
    fviews = [
        FailureView(
            backend=clean(g(f, "backend")),
            kind=clean(g(f, "kind") or "error"),
            reason=clean(g(f, "reason") or "no reason recorded"),
            shape=tuple(g(f, k) for k in SHAPE_KEYS) if all(g(f, k) is not None for k in SHAPE_KEYS) else None,
            tokens=g(f, "tokens_per_rank"),
        )
        for f in failures
    ]
    timings = sorted({c.timing for s in shapes for c in s.curves.values() if c.timing}, key=str)
    run_dict = {
        "id": g(run, "id"),
        "status": g(run, "status"),
        "device_type": g(run, "device_type"),
        "world_size": g(run, "world_size"),
        "versions": g(run, "versions") or {},
        "timing": timings[0] if len(timings) == 1 else None,
        **{k: g(run, k) for k in RUN_TIMES},
        "git_sha": g(run, "git_sha"),
        "config": g(run, "config") or {},
    }
    status = g(run, "status")
    if status and status != "completed":
        notes.append(f"run {g(run, 'id')} is {clean(status)}: its measurements may be partial")
    if not shapes:
        notes.append(f"run {g(run, 'id')} has no measurements")
    _rehearsal(run_dict, notes)
    facts = _facts(g(hw, "facts"), notes)
    fp = g(hw, "fingerprint") or g(run, "fingerprint")
    return TableView(
        kind="run",
        label=clean(label),
        fingerprint=clean(fp) if fp else None,
        schema=None,
        generated_at=None,
        generated_by=None,
        facts_hash=_str(g(hw, "facts_hash")),
        facts=facts,
        run=_normalise_run(run_dict),
        backends={},
        shapes=shapes,
        failures=fviews,
        notes=notes,
    )


def _attach_group_us(measurements: list[Measurement], shapes: list) -> None:
    """Each curve's per-group medians (tuner.groups), from the measurements of its timing."""
    by_key = {s.key: s for s in shapes}
    for m in measurements:
        per_group = m.figure("group_us")
        shape = by_key.get(tuple(m.point.shape))
        curve = shape.curves.get(m.backend) if shape is not None else None
        tokens = m.point.tokens_per_rank
        if not per_group or curve is None or curve.timing != m.timing or tokens not in shape.tokens:
            continue
        if not curve.group_us:
            curve.group_us = [None] * len(shape.tokens)
        curve.group_us[shape.tokens.index(tokens)] = list(per_group)


def _other_modes(measurements: list, shapes: list) -> list:
    """Notes naming the timing modes a run measured but select does not keep (one mode per
    backend and shape)."""
    kept = {(s.key, c.backend): c.timing for s in shapes for c in s.curves.values()}
    other: dict = {}
    for m in measurements:
        key = (tuple(m.point.shape), clean(m.backend))
        mode = m.timing or "eager"
        mode = "graph" if str(mode).lower() in GRAPH_WORDS else mode
        if key in kept and mode != kept[key]:
            other.setdefault(key, set()).add(mode)
    return [
        f"{shape_label(shape)}: {backend} also has {clean(mode)} timings; showing {kept[(shape, backend)]} "
        "(as select keeps it)"
        for (shape, backend), modes in other.items()
        for mode in sorted(modes, key=str)
    ]


def _getter(obj, key, default=None):
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


# ----------------------------------------------------------------------------- sources


def is_sqlite_file(path) -> bool:
    try:
        return read_head(path, len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except (OSError, FileRefused):  # the profile reader says what is wrong with it
        return False


def load_source(source: str, run_id: int | None = None) -> TableView:
    """A positional input: an SQLite database file (its latest completed run, or
    ``run_id``), a database URL (``scheme://``), or a profile JSON file."""
    if "://" in source:
        return load_run_view(source, run_id)
    if is_sqlite_file(source):
        return load_run_view(source, run_id)
    return load_profile_view(source)


def load_view(*, profile=None, db: str | None = None, run: int | None = None) -> TableView:
    """``--profile FILE`` or ``--db URL [--run ID]`` (db None: $A2A_TUNE_DB / default)."""
    if profile is not None:
        if db is not None or run is not None:
            raise ViewError("give either --profile FILE or --db URL [--run ID], not both")
        return load_profile_view(profile)
    return load_run_view(db, run)


#: The probe facts' fields the views read, by the type each must have (``tuner.probe``'s
#: ``Topology.to_dict``); a stored or written row is read here once, the views trust the rest.
_FACT_TYPES = {
    "gpus": list,
    "islands": list,
    "hostnames": list,
    "fabric_domains": list,
    "degraded": list,
    "pcie_only_pairs": list,
    "driver_versions": list,
    "node_count": int,
}


def _facts(raw, notes: list) -> dict:
    """The probe facts of a run or table, with each field the views read of the type it must
    have; a damaged field is left out and said once in ``notes`` (the views show the rest)."""
    if not isinstance(raw, Mapping):
        return {}
    facts, bad = dict(raw), []
    for name, kind in _FACT_TYPES.items():
        value = facts.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            bad.append(name)
            del facts[name]
    if bad:
        notes.append(
            f"probe facts: {', '.join(bad)} damaged (not a {'/'.join(sorted({_FACT_TYPES[b].__name__ for b in bad}))}); left out"
        )
    return facts
