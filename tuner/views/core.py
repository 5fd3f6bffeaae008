"""Ops views: what a selection table or a sweep run says, for people and for a cluster's CI.

Flow position: probe -> sweep -> store -> select -> lookup, and beside them, read-only,
**views** (``a2a-tune show`` / ``diff``), :mod:`.plot` (``plot``) and :mod:`.report`
(``report``). Layering (never back up the list)::

    report.py   one self-contained HTML file      -> plot.py, views.py
    plot.py     one PNG per shape (matplotlib)     -> views.py
    views.py    load a table or a run into a TableView; show; diff
      profiles: the raw JSON, read field by field with defaults (schema 1 and 2)
      runs:     a2a_tune.db.open_store (read only: a missing file is never created)

Both inputs become one :class:`TableView`: per shape, each backend's curve over tokens
per rank (median, p10, p90), the winners per token count with margin and tie flag, and
the failures with their reasons; plus the run's provenance and the probe facts.

Reading is defensive on purpose: a view must show as much of an odd table as it can
(another schema version, a missing p10, a winner list left out), and say what it could
not read in ``TableView.notes`` instead of refusing. Only input that is not a table at
all (missing file, not JSON, not a database, no such run) raises :class:`ViewError`,
whose message is one line for the CLI.

Winners read from a profile are the profile's own (schema 1 has no tie flag: it is
derived from the curves). Winners of a run straight from the database are derived here
with the rules of :mod:`.select`: backends failed for the shape never win; the fastest
median wins unless the runner-up's median lies inside the fastest's p10..p90 spread (a
tie), when the preferred backend of the tied set wins (:func:`.estimate.decide`; the
view prefers the engine default ``allgather_reducescatter``, then names, since it does
not import the registry); margin = runner-up / fastest - 1.

Diff rules (:func:`diff_views`; A is the baseline, B the candidate):

* **Regression**: a backend at a (shape, tokens) point where B's p10 > A's p90 (the
  whole inner spread of B is above A's) and B's median / A's median > 1 + tolerance.
  Without p10/p90 on either side the medians alone are compared (marked so).
* **Improvement**: the mirror image (B's p90 < A's p10).
* **Winner change**: the winner at a (shape, tokens) point differs. It is "within
  noise" when B's tie flag pairs the two backends, or when in B the old winner's spread
  overlaps the new winner's (B's old-winner p10 <= new-winner p90). Only B decides: a
  tie in A that B settles clearly is a real change.
* **New failure**: a backend failed for a shape in B but not in A (counts as a
  regression: a backend that now fails its correctness check is worse than slow).
* Points whose timing mode differs between A and B (eager vs graph) are not compared;
  the diff says so.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..select import iso_timestamp

__all__ = [
    "ViewError",
    "Curve",
    "Winner",
    "FailureView",
    "ShapeView",
    "TableView",
    "WinnerRange",
    "load_profile_view",
    "load_run_view",
    "load_view",
    "load_source",
    "winner_ranges",
    "token_range",
    "shape_label",
    "render_show",
    "show_data",
    "DiffResult",
    "diff_views",
    "render_diff",
]

#: Shape keys of a table entry, in table order (as :data:`a2a_tune.tuner.select.SHAPE_KEYS`).
SHAPE_KEYS = ("ep_size", "hidden", "topk", "num_experts", "dtype", "routing")
SQLITE_MAGIC = b"SQLite format 3\x00"
EN_DASH = "\u2013"


class ViewError(Exception):
    """An input that cannot be shown at all; ``str()`` is one line for the terminal."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


# ----------------------------------------------------------------------------- model


@dataclass
class Curve:
    """One backend's measurements over a shape's token counts (lists align with
    ``ShapeView.tokens``; None where not measured)."""

    backend: str
    timing: str | None
    median_us: list
    p10_us: list
    p90_us: list

    def at(self, j: int) -> tuple:
        """(median, p10, p90) at token index j, each None when missing."""
        return tuple(_num(seq[j]) if j < len(seq) else None for seq in (self.median_us, self.p10_us, self.p90_us))


@dataclass
class Winner:
    tokens: int
    backend: str
    median_us: float | None
    runner_up: str | None
    margin: float | None  # runner_up / fastest - 1
    tie: bool | None  # the runner-up is inside the fastest's p10..p90 spread (None: unknown)
    fastest: str | None = None  # schema 2: with a tie the winner may be a preferred, slower backend

    @property
    def other(self) -> str | None:
        """The backend the winner was chosen over: the fastest when a tie gave the win
        to a preferred backend, else the runner-up."""
        return self.fastest if self.fastest and self.fastest != self.backend else self.runner_up


@dataclass
class FailureView:
    backend: str
    kind: str
    reason: str
    shape: tuple | None  # None: not about one shape (e.g. "unavailable")
    tokens: int | None


@dataclass
class ShapeView:
    ep_size: int
    hidden: int
    topk: int
    num_experts: int
    dtype: str
    routing: str
    source: str  # "measured" | "predicted"
    tokens: list
    curves: dict  # label -> Curve (label = backend, or "backend[timing]" when a backend has several modes)
    winners: list  # [Winner], ascending tokens
    failed: dict  # backend -> one-line reason; never a winner

    @property
    def key(self) -> tuple:
        return tuple(getattr(self, k) for k in SHAPE_KEYS)


@dataclass
class TableView:
    """Everything a view shows about one table (profile file) or one sweep run."""

    kind: str  # "profile" | "run"
    label: str  # where it came from, e.g. "profiles/h200.json" or "sqlite:///a.db run 3"
    fingerprint: str | None
    schema: Any  # the profile's schema version; None for a run
    generated_at: str | None
    generated_by: str | None
    facts_hash: str | None
    facts: dict  # probe facts ({} when unknown)
    run: dict  # id, status, device_type, world_size, versions, timing, started_at, finished_at, git_sha
    backends: dict  # backend -> {"vllm_name":..., "sglang_name":...}
    shapes: list  # [ShapeView]
    failures: list  # [FailureView]
    notes: list = field(default_factory=list)  # what could not be read, one line each

    def shape(self, key: tuple) -> ShapeView | None:
        for s in self.shapes:
            if s.key == key:
                return s
        return None


# ----------------------------------------------------------------------------- helpers


def _num(v) -> float | None:
    """A positive finite float, else None (NaN, negative, strings, bools...)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) and v > 0 else None


def _pos_int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _text(v) -> str:
    return " ".join(str(v).split())


def _parse_time(v) -> _dt.datetime | None:
    if not isinstance(v, str) or not v:
        return None
    try:
        return _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        return None


def fmt_us(v: float | None) -> str:
    """µs with 3 significant figures at most: 0.412, 41.2, 412, 4120."""
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_pct(m: float | None) -> str:
    return "-" if m is None else f"{m * 100:.0f}%"


def token_range(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}{EN_DASH}{hi}"


def _preset_names() -> dict:
    try:
        from ..shapes import presets

        return {(p.num_experts, p.topk, p.hidden): name for name, p in presets().items()}
    except Exception:  # the view works without preset names
        return {}


def shape_label(shape, *, with_model: bool = True) -> str:
    """``deepseek-v3 E=256 k=8 H=7168 · bf16 · uniform · EP 2`` (model name when a preset matches)."""
    ep, hidden, topk, ne, dtype, routing = shape.key if hasattr(shape, "key") else shape
    model = _preset_names().get((ne, topk, hidden)) if with_model else None
    core = f"E={ne} k={topk} H={hidden}"
    return f"{model + ' ' if model else ''}{core} · {dtype} · {routing} · EP {ep}"


def shape_slug(shape) -> str:
    """A file-name-safe shape key: ``ep2_e256_k8_h7168_bf16_uniform``."""
    ep, hidden, topk, ne, dtype, routing = shape.key if hasattr(shape, "key") else shape
    raw = f"ep{ep}_e{ne}_k{topk}_h{hidden}_{dtype}_{routing}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw)


# ----------------------------------------------------------------------------- profiles

_FAILED_TEXT = re.compile(r"^(?P<kind>[a-z_]+)(?: at (?P<tokens>\d+) tokens/rank)?: (?P<reason>.*)$", re.S)


def _parse_failed_value(v) -> tuple:
    """A profile's ``failed[backend]`` -> (kind, reason, tokens). Schema 1 writes
    "kind[ at T tokens/rank]: reason"; a mapping {kind, reason, tokens} is read too."""
    if isinstance(v, Mapping):
        kind = v.get("kind") if isinstance(v.get("kind"), str) else "failed"
        reason = _text(v.get("reason") or v.get("message") or "no reason recorded")
        return kind, reason, _pos_int(v.get("tokens", v.get("tokens_per_rank")))
    text = _text(v) if v is not None else "no reason recorded"
    m = _FAILED_TEXT.match(text)
    if m is None:
        return "failed", text, None
    t = m.group("tokens")
    return m.group("kind"), m.group("reason"), int(t) if t else None


def _timing_of(curve_raw: Mapping, entry: Mapping, run: Mapping, backend: str) -> str | None:
    """Timing mode of one curve: the curve's own (schema 2), the entry's, the run's
    (schema 1: one mode per table; a mapping backend -> mode is read too)."""
    for holder in (curve_raw, entry):
        t = holder.get("timing") if isinstance(holder, Mapping) else None
        if isinstance(t, str):
            return t
        if isinstance(t, Mapping) and isinstance(t.get(backend), str):
            return t[backend]
    t = run.get("timing")
    if isinstance(t, Mapping):
        t = t.get(backend)
    return t if isinstance(t, str) else None


def _series(raw, n: int) -> list:
    if not isinstance(raw, list):
        return [None] * n
    out = [_num(v) for v in raw[:n]]
    return out + [None] * (n - len(out))


def _read_entry(e: Mapping, i: int, run: Mapping, notes: list) -> ShapeView | None:
    where = f"entries[{i}]"
    ints = [_pos_int(e.get(k)) for k in ("ep_size", "hidden", "topk", "num_experts")]
    strs = [e.get(k) if isinstance(e.get(k), str) and e.get(k) else None for k in ("dtype", "routing")]
    if strs[1] is None and "routing" not in e:
        strs[1] = "uniform"
    if None in ints or None in strs:
        notes.append(f"{where}: skipped (shape fields missing or invalid)")
        return None
    raw_tokens = e.get("tokens")
    if not isinstance(raw_tokens, list) or not raw_tokens or any(_pos_int(t) is None for t in raw_tokens):
        notes.append(f"{where}: skipped (no valid token list)")
        return None
    tokens = list(raw_tokens)
    n = len(tokens)
    raw_backends = e.get("backends") if isinstance(e.get("backends"), Mapping) else {}
    curves = {}
    for b, c in raw_backends.items():
        if not isinstance(c, Mapping):
            notes.append(f"{where}.backends.{b}: skipped (not an object)")
            continue
        curves[str(b)] = Curve(
            backend=str(b),
            timing=_timing_of(c, e, run, str(b)),
            median_us=_series(c.get("median_us"), n),
            p10_us=_series(c.get("p10_us"), n),
            p90_us=_series(c.get("p90_us"), n),
        )
    failed = {}
    raw_failed = e.get("failed") if isinstance(e.get("failed"), Mapping) else {}
    for b, v in raw_failed.items():
        kind, reason, t = _parse_failed_value(v)
        at = f" at {t} tokens/rank" if t else ""
        failed[str(b)] = f"{kind}{at}: {reason}"
    shape = ShapeView(
        *ints,
        *strs,
        source=e.get("source") if isinstance(e.get("source"), str) else "measured",
        tokens=tokens,
        curves=curves,
        winners=[],
        failed=failed,
    )
    raw_winners = e.get("winners")
    if isinstance(raw_winners, list):
        for w in raw_winners:
            if not isinstance(w, Mapping) or _pos_int(w.get("tokens")) is None or not isinstance(w.get("backend"), str):
                notes.append(f"{where}.winners: an unreadable winner skipped")
                continue
            margin = w.get("margin")
            margin = (
                float(margin)
                if isinstance(margin, (int, float)) and not isinstance(margin, bool) and math.isfinite(margin)
                else None
            )
            tie = w.get("tie")
            shape.winners.append(
                Winner(
                    tokens=w["tokens"],
                    backend=w["backend"],
                    median_us=_num(w.get("median_us")),
                    runner_up=w.get("runner_up") if isinstance(w.get("runner_up"), str) else None,
                    margin=margin,
                    tie=tie if isinstance(tie, bool) else None,
                    fastest=w.get("fastest") if isinstance(w.get("fastest"), str) else None,
                )
            )
        shape.winners.sort(key=lambda w: w.tokens)
        _fill_ties(shape)
    else:
        shape.winners = derive_winners(shape)
        notes.append(f"{where}: no winners in the table; derived from the medians")
    return shape


def _read_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ViewError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ViewError(f"{path}: is a directory, not a profile") from None
    except OSError as exc:
        raise ViewError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if raw.startswith(SQLITE_MAGIC):
        raise ViewError(f"{path}: is an SQLite database, not a profile (pass it as --db)")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ViewError(f"{path}: not a profile (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise ViewError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


def load_profile_view(path) -> TableView:
    """Read a profile JSON file (schema 1 or 2, read field by field) into a view."""
    path = Path(path)
    data = _read_json(path)
    if not isinstance(data, Mapping):
        raise ViewError(f"{path}: not a profile (top level is not a JSON object)")
    if not isinstance(data.get("entries"), list):
        raise ViewError(f"{path}: not a profile (no 'entries' array)")
    notes: list = []
    schema = data.get("schema")
    if schema not in (1, 2):
        notes.append(f"schema {schema!r} is not one this a2a-tune knows (1, 2); showing what could be read")
    hw = data.get("hardware") if isinstance(data.get("hardware"), Mapping) else {}
    run = dict(data.get("run")) if isinstance(data.get("run"), Mapping) else {}
    facts = hw.get("facts") if isinstance(hw.get("facts"), Mapping) else {}
    fingerprint = hw.get("fingerprint") if isinstance(hw.get("fingerprint"), str) else facts.get("fingerprint")
    shapes = []
    for i, e in enumerate(data["entries"]):
        if not isinstance(e, Mapping):
            notes.append(f"entries[{i}]: skipped (not an object)")
            continue
        s = _read_entry(e, i, run, notes)
        if s is not None:
            shapes.append(s)
    failures = [
        FailureView(b, *_split_failed(reason), shape=s.key, tokens=_parse_failed_value(reason)[2])
        for s in shapes
        for b, reason in s.failed.items()
    ]
    backends = data.get("backends") if isinstance(data.get("backends"), Mapping) else {}
    return TableView(
        kind="profile",
        label=str(path),
        fingerprint=fingerprint,
        schema=schema,
        generated_at=data.get("generated_at") if isinstance(data.get("generated_at"), str) else None,
        generated_by=data.get("generated_by") if isinstance(data.get("generated_by"), str) else None,
        facts_hash=hw.get("facts_hash") if isinstance(hw.get("facts_hash"), str) else facts.get("facts_hash"),
        facts=dict(facts),
        run=_normalise_run(run),
        backends={str(k): dict(v) for k, v in backends.items() if isinstance(v, Mapping)},
        shapes=shapes,
        failures=failures,
        notes=notes,
    )


def _split_failed(text: str) -> tuple:
    kind, reason, _ = _parse_failed_value(text)
    return kind, reason


def _normalise_run(run: Mapping) -> dict:
    versions = run.get("versions") if isinstance(run.get("versions"), Mapping) else {}
    return {
        "id": run.get("id"),
        "status": run.get("status"),
        "device_type": run.get("device_type"),
        "world_size": run.get("world_size"),
        "versions": {str(k): (None if v is None else str(v)) for k, v in versions.items()},
        "timing": run.get("timing"),
        "started_at": iso_timestamp(run.get("started_at")),
        "finished_at": iso_timestamp(run.get("finished_at")),
        "git_sha": run.get("git_sha"),
        "config": dict(run["config"]) if isinstance(run.get("config"), Mapping) else {},
    }


# ----------------------------------------------------------------------------- runs

_FAILURE_RANK = {"incorrect": 0, "unavailable": 1, "error": 2, "timeout": 3}


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
    if not p.exists():
        raise ViewError(f"no database at {p} (pass --db URL or --profile FILE)")
    if p.is_dir():
        raise ViewError(f"{p}: is a directory, not a database")
    try:
        with p.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
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
    except StoreError as exc:
        raise ViewError(str(exc)) from None
    return view_from_records(run, hw, measurements, failures, label=f"{shown} run {run.id}")


def view_from_records(run, hw, measurements: Iterable, failures: Iterable, *, label: str) -> TableView:
    """Build a view from store records (or objects with the same attributes)."""
    g = _getter
    points: dict = {}  # shape -> (backend, timing) -> tokens -> (median, p10, p90)
    for m in measurements:
        shape = tuple(g(m, k) for k in SHAPE_KEYS)
        t = g(m, "tokens_per_rank")
        med = _num(g(m, "median_us"))
        if _pos_int(t) is None or med is None:
            continue
        stats = (med, _num(g(m, "p10_us")), _num(g(m, "p90_us")))
        per_t = points.setdefault(shape, {}).setdefault((g(m, "backend"), g(m, "timing")), {})
        if t not in per_t or stats[0] < per_t[t][0]:  # a point measured twice keeps the lower median
            per_t[t] = stats
    failures = list(failures)
    fviews = [
        FailureView(
            backend=g(f, "backend"),
            kind=g(f, "kind") or "error",
            reason=_text(g(f, "reason") or "no reason recorded"),
            shape=tuple(g(f, k) for k in SHAPE_KEYS) if all(g(f, k) is not None for k in SHAPE_KEYS) else None,
            tokens=g(f, "tokens_per_rank"),
        )
        for f in failures
    ]
    shapes = []
    notes: list = []
    for key in sorted(points, key=lambda s: (s[0], str(s[4]), s[1], s[2], s[3], str(s[5]))):
        per_curve = points[key]
        # One timing mode per backend per shape, as select keeps it: the mode covering more
        # token counts, graph on a draw; the other mode is named in the notes.
        modes: dict = {}
        for (b, timing), per_t in per_curve.items():
            modes.setdefault(b, {})[timing] = per_t
        kept = {}
        for b, per_mode in modes.items():
            mode = max(per_mode, key=lambda m: (len(per_mode[m]), m == "graph", str(m)))
            kept[b] = (mode, per_mode[mode])
            for other in sorted(set(per_mode) - {mode}, key=str):
                notes.append(f"{shape_label(key)}: {b} also has {other} timings; showing {mode} (as select keeps it)")
        tokens = sorted({t for _, per_t in kept.values() for t in per_t})
        curves = {}
        for b, (timing, per_t) in sorted(kept.items()):
            cols = [per_t.get(t) for t in tokens]
            curves[b] = Curve(
                backend=b,
                timing=timing,
                median_us=[c[0] if c else None for c in cols],
                p10_us=[c[1] if c else None for c in cols],
                p90_us=[c[2] if c else None for c in cols],
            )
        measured = set(modes)
        failed: dict = {}
        for f in failures:
            if not all(g(f, k) is None or g(f, k) == v for k, v in zip(SHAPE_KEYS, key)):
                continue
            b, kind = g(f, "backend"), g(f, "kind")
            if kind in ("error", "timeout") and b in measured:
                continue  # just a hole in a measured curve
            rank = _FAILURE_RANK.get(kind, len(_FAILURE_RANK))
            if b not in failed or rank < failed[b][0]:
                t = g(f, "tokens_per_rank")
                at = f" at {t} tokens/rank" if t is not None else ""
                failed[b] = (rank, f"{kind}{at}: {_text(g(f, 'reason') or 'no reason recorded')}")
        shape = ShapeView(
            *key,
            source="measured",
            tokens=tokens,
            curves=curves,
            winners=[],
            failed={b: text for b, (_, text) in sorted(failed.items())},
        )
        shape.winners = derive_winners(shape, run_tie_preference(g(run, "config")))
        shapes.append(shape)
    versions = g(run, "versions") or {}
    timings = sorted({c.timing for s in shapes for c in s.curves.values() if c.timing}, key=str)
    run_dict = {
        "id": g(run, "id"),
        "status": g(run, "status"),
        "device_type": g(run, "device_type"),
        "world_size": g(run, "world_size"),
        "versions": versions,
        "timing": timings[0] if len(timings) == 1 else None,
        "started_at": g(run, "started_at"),
        "finished_at": g(run, "finished_at"),
        "git_sha": g(run, "git_sha"),
        "config": g(run, "config") or {},
    }
    status = g(run, "status")
    if status and status != "completed":
        notes.append(f"run {g(run, 'id')} is {status}: its measurements may be partial")
    if not shapes:
        notes.append(f"run {g(run, 'id')} has no measurements")
    facts = g(hw, "facts") if isinstance(g(hw, "facts"), Mapping) else {}
    return TableView(
        kind="run",
        label=label,
        fingerprint=g(hw, "fingerprint") or g(run, "fingerprint"),
        schema=None,
        generated_at=None,
        generated_by=None,
        facts_hash=g(hw, "facts_hash"),
        facts=dict(facts),
        run=_normalise_run(run_dict),
        backends={},
        shapes=shapes,
        failures=fviews,
        notes=notes,
    )


def _getter(obj, key, default=None):
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _in_spread(shape: ShapeView, fastest: str, other: str | None, j: int) -> bool | None:
    """The tie rule of select / lookup (a2a_tune.tuner.runtime.estimate.decide): ``other``'s median
    lies inside ``fastest``'s p10..p90 spread at token index j (None when unknown)."""
    f, o = shape.curves.get(fastest), shape.curves.get(other) if other else None
    if f is None or o is None:
        return None
    _, lo, hi = f.at(j)
    m = o.at(j)[0]
    if lo is None or hi is None or m is None:
        return None
    return lo <= m <= hi


def _fill_ties(shape: ShapeView) -> None:
    """Schema 1 winners carry no tie flag: apply the tie rule to the curves."""
    index = {t: j for j, t in enumerate(shape.tokens)}
    for w in shape.winners:
        if w.tie is None and w.tokens in index:
            w.tie = _in_spread(shape, w.fastest or w.backend, w.runner_up, index[w.tokens])


#: Tie preference of a view made from a database run when the run does not name its
#: backends: the engine default first, as select writes it. A run's config lists its
#: backends in registry order, which is select's order after the default (see
#: `run_tie_preference`).
VIEW_TIE_PREFERENCE = ("allgather_reducescatter",)


def run_tie_preference(config: Mapping | None) -> tuple:
    """select's tie preference for a run: the engine default, then the run's backends in order."""
    backends = [str(b) for b in (config or {}).get("backends", []) if isinstance(b, str)]
    return tuple(dict.fromkeys([*VIEW_TIE_PREFERENCE, *backends]))


def derive_winners(shape: ShapeView, preference: tuple = VIEW_TIE_PREFERENCE) -> list:
    """Per token count, among curves whose backend is not failed: the winner by the tie
    rule of select / lookup (:func:`a2a_tune.tuner.runtime.estimate.decide`), the fastest, the
    runner-up after it, margin = runner-up / fastest - 1, and the tie flag."""
    from ..runtime.estimate import decide

    winners = []
    for j, t in enumerate(shape.tokens):
        live = [label for label, c in shape.curves.items() if c.backend not in shape.failed and c.at(j)[0] is not None]
        if not live:
            continue
        medians = {b: shape.curves[b].at(j)[0] for b in live}
        chosen, fastest, tied = decide(
            medians,
            {b: shape.curves[b].at(j)[1] for b in live},
            {b: shape.curves[b].at(j)[2] for b in live},
            preference,
        )
        ranked = sorted(medians.items(), key=lambda kv: (kv[1], kv[0]))
        runner_up = next((b for b, _ in ranked if b != fastest), None)
        winners.append(
            Winner(
                tokens=t,
                backend=chosen,
                median_us=medians[chosen],
                runner_up=runner_up,
                margin=medians[runner_up] / medians[fastest] - 1 if runner_up else None,
                tie=len(tied) > 1,
                fastest=fastest,
            )
        )
    return winners


# ----------------------------------------------------------------------------- sources


def is_sqlite_file(path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
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


# ----------------------------------------------------------------------------- show


@dataclass
class WinnerRange:
    """Consecutive token counts of one shape with the same winner."""

    lo: int
    hi: int
    backend: str | None  # None: nothing measured there
    points: int
    margin_lo: float | None
    margin_hi: float | None
    runners_up: list  # distinct runner-ups, in order
    ties: list  # token counts where the table marks a tie
    median_lo: float | None
    median_hi: float | None

    @property
    def tokens(self) -> str:
        return token_range(self.lo, self.hi)

    @property
    def margin(self) -> str:
        if self.margin_lo is None:
            return "-"
        if fmt_pct(self.margin_lo) == fmt_pct(self.margin_hi):
            return fmt_pct(self.margin_lo)
        return f"{self.margin_lo * 100:.0f}{EN_DASH}{self.margin_hi * 100:.0f}%"

    def line(self) -> str:
        """``1–64: allgather_reducescatter (margin 12–80%)``."""
        if self.backend is None:
            return f"{self.tokens}: no backend measured"
        extra = f"margin {self.margin}" if self.margin_lo is not None else "only backend"
        if self.ties:
            extra += f"; tie at {_list_tokens(self.ties)}"
        return f"{self.tokens}: {self.backend} ({extra})"


def _list_tokens(ts: list) -> str:
    return ", ".join(str(t) for t in ts) if len(ts) <= 4 else f"{len(ts)} token counts"


def _tie_phrase(ts: list) -> str:
    """'1, 2 tokens/rank' or '7 token counts' (the count already names its unit)."""
    return _list_tokens(ts) + (" tokens/rank" if len(ts) <= 4 else "")


def winner_ranges(shape: ShapeView) -> list:
    """Collapse consecutive token buckets with the same winner into ranges."""
    by_t = {w.tokens: w for w in shape.winners}
    ranges: list = []
    for t in shape.tokens:
        w = by_t.get(t)
        b = w.backend if w else None
        cur = ranges[-1] if ranges else None
        if cur is None or cur.backend != b:
            cur = WinnerRange(t, t, b, 0, None, None, [], [], None, None)
            ranges.append(cur)
        cur.hi = t
        cur.points += 1
        if w is None:
            continue
        if w.margin is not None:
            cur.margin_lo = w.margin if cur.margin_lo is None else min(cur.margin_lo, w.margin)
            cur.margin_hi = w.margin if cur.margin_hi is None else max(cur.margin_hi, w.margin)
        if w.other and w.other not in cur.runners_up:
            cur.runners_up.append(w.other)
        if w.tie:
            cur.ties.append(t)
        if w.median_us is not None:
            cur.median_lo = w.median_us if cur.median_lo is None else min(cur.median_lo, w.median_us)
            cur.median_hi = w.median_us if cur.median_hi is None else max(cur.median_hi, w.median_us)
    return ranges


def _duration(run: Mapping) -> str | None:
    a, b = _parse_time(run.get("started_at")), _parse_time(run.get("finished_at"))
    if a is None or b is None:
        return None
    s = (b - a).total_seconds()
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h")


def _when(v) -> str | None:
    t = _parse_time(v) if isinstance(v, str) else v
    if t is None:
        return v
    if t.tzinfo is not None:
        t = t.astimezone(_dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M UTC")


def timing_summary(view: TableView) -> str | None:
    """'eager', or per mode the backends timed that way when a table mixes modes
    (schema 2: a timing mode per backend per entry)."""
    per_mode: dict = {}
    for s in view.shapes:
        for c in s.curves.values():
            per_mode.setdefault(c.timing or "unknown", set()).add(c.backend)
    if not per_mode:
        return view.run.get("timing")
    if len(per_mode) == 1:
        mode = next(iter(per_mode))
        return None if mode == "unknown" else mode
    return "; ".join(f"{mode}: {', '.join(sorted(bs))}" for mode, bs in sorted(per_mode.items()))


def provenance_lines(view: TableView) -> list:
    """(label, value) pairs saying where the numbers come from."""
    run = view.run
    rows = [
        (
            "fingerprint",
            f"{view.fingerprint or 'unknown'}" + (f"  (facts hash {view.facts_hash})" if view.facts_hash else ""),
        )
    ]
    rows.append(("source", view.label + (f"  (profile schema {view.schema})" if view.kind == "profile" else "")))
    bits = []
    if run.get("id") is not None:
        bits.append(f"run {run['id']}" + (f" ({run['status']})" if run.get("status") else ""))
    if run.get("device_type"):
        bits.append(f"{run.get('world_size') or '?'} {run['device_type']} rank(s)")
    timing = timing_summary(view)
    if timing:
        bits.append(f"timing {timing}")
    if bits:
        rows.append(("run", ", ".join(bits)))
    if run.get("started_at"):
        dur = _duration(run)
        rows.append(("measured", f"{_when(run['started_at'])}" + (f" ({dur})" if dur else "")))
    versions = run.get("versions") or {}
    if versions:
        order = ["torch", "nccl", "cuda", "driver", "triton", "flashinfer", "python", "a2a_tune"]
        keys = [k for k in order if k in versions] + sorted(k for k in versions if k not in order)
        rows.append(("versions", "  ".join(f"{k} {versions[k] if versions[k] is not None else '-'}" for k in keys)))
    if run.get("git_sha"):
        rows.append(("git", str(run["git_sha"])))
    config = run.get("config") or {}
    if isinstance(config.get("iters"), int):
        timed = f"{config.get('warmup', '?')} warm-up + {config['iters']} timed round trips per point"
        if isinstance(config.get("input_sets"), int):
            timed += f", {config['input_sets']} rotated input sets"
        rows.append(("timed", timed))
    if isinstance(config.get("argv"), list) and config["argv"]:
        rows.append(("command", "a2a-tune " + " ".join(str(a) for a in config["argv"])))
    if view.generated_at or view.generated_by:
        rows.append(
            (
                "table written",
                " ".join(
                    x for x in (_when(view.generated_at), f"by {view.generated_by}" if view.generated_by else None) if x
                ),
            )
        )
    return rows


def group_failures(view: TableView) -> list:
    """Failures grouped by (backend, kind, tokens, reason) -> (backend, kind, where, reason),
    where = 'every shape', 'no shape' (not about one point) or the shape labels."""
    groups: dict = {}
    for f in view.failures:
        groups.setdefault((f.backend, f.kind, f.tokens, f.reason), []).append(f.shape)
    all_keys = {s.key for s in view.shapes}
    rows = []
    for (backend, kind, tokens, reason), shapes in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)
    ):
        keys = {s for s in shapes if s is not None}
        if not keys:
            where = "every shape" if view.kind == "run" else "-"
        elif len(all_keys) > 1 and keys == all_keys:
            where = "every shape"
        else:
            where = "; ".join(shape_label(k) for k in sorted(keys, key=lambda k: tuple(str(x) for x in k)))
        if tokens is not None:
            where += f", {tokens} tokens/rank"
        rows.append((backend, kind, where, reason))
    return rows


def show_data(view: TableView) -> dict:
    """What ``show --json`` prints: provenance, collapsed winner ranges, failures, notes."""
    return {
        "source": view.label,
        "kind": view.kind,
        "fingerprint": view.fingerprint,
        "facts_hash": view.facts_hash,
        "schema": view.schema,
        "run": view.run,
        "shapes": [
            {
                **dict(zip(SHAPE_KEYS, s.key)),
                "source": s.source,
                "tokens": s.tokens,
                "ranges": [
                    {
                        "tokens": [r.lo, r.hi],
                        "winner": r.backend,
                        "margin": [r.margin_lo, r.margin_hi],
                        "runners_up": r.runners_up,
                        "ties": r.ties,
                        "median_us": [r.median_lo, r.median_hi],
                        "text": r.line(),
                    }
                    for r in winner_ranges(s)
                ],
                "failed": s.failed,
            }
            for s in view.shapes
        ],
        "failures": [{"backend": b, "kind": k, "where": w, "reason": r} for b, k, w, r in group_failures(view)],
        "notes": view.notes,
    }


def render_show(view: TableView, console) -> None:
    """Print the view with rich: provenance, one winners table per shape, failures."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    kind = "table" if view.kind == "profile" else "run"
    console.print(Text(f"a2a-tune {kind}: {view.fingerprint or 'unknown hardware'}", style="bold"))
    for k, v in provenance_lines(view):
        console.print(Text.assemble((f"  {k:<14}", "dim"), v), soft_wrap=True)
    for note in view.notes:
        console.print(Text(f"  note: {note}", style="yellow"), soft_wrap=True)
    if not view.shapes:
        console.print("no shapes in this table", style="yellow")
    for s in view.shapes:
        console.print()
        title = shape_label(s) + ("  (predicted)" if s.source != "measured" else "")
        console.print(Text(title, style="bold cyan"), soft_wrap=True)
        # Fits 80 columns with the longest backend names in both winner and runner-up.
        t = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 1), show_edge=False, pad_edge=False, collapse_padding=True)
        t.add_column("tokens", justify="right", no_wrap=True)
        t.add_column("winner", no_wrap=True)
        t.add_column("margin", justify="right", no_wrap=True)
        t.add_column("runner-up", min_width=13, overflow="fold")
        t.add_column("winner µs", justify="right", no_wrap=True)
        for r in winner_ranges(s):
            if r.backend is None:
                t.add_row(r.tokens, Text("no backend measured", style="yellow"), "-", "-", "-")
                continue
            margin = Text(r.margin)
            if r.ties:
                margin.append("*", style="bold yellow")
            med = (
                fmt_us(r.median_lo)
                if r.median_lo == r.median_hi
                else f"{fmt_us(r.median_lo)}{EN_DASH}{fmt_us(r.median_hi)}"
            )
            t.add_row(
                r.tokens, Text(r.backend, style="green"), margin, ", ".join(r.runners_up) or "none (only backend)", med
            )
        console.print(t)
        ties = [t_ for r in winner_ranges(s) for t_ in r.ties]
        if ties:
            console.print(
                Text.assemble(
                    ("  * tie at ", "yellow"), _tie_phrase(ties), (": the runner-up is within noise there", "dim")
                ),
                soft_wrap=True,
            )
        if s.failed:
            console.print(
                Text.assemble(("  never selected here: ", "red"), ", ".join(s.failed), " (see failures)"),
                soft_wrap=True,
            )
    console.print()
    rows = group_failures(view)
    if rows:
        # One failure per two lines (what, then why): long reasons wrap cleanly in a terminal.
        console.print(Text(f"failures ({len(rows)})", style="bold red"))
        for backend, kind, where, reason in rows:
            console.print(Text.assemble("  ", (backend, "bold"), " ", (kind, "red"), f"  ({where})"), soft_wrap=True)
            console.print(Text(f"      {reason}"), soft_wrap=True)
    else:
        console.print("no failures recorded", style="green")


# ----------------------------------------------------------------------------- diff


@dataclass
class PointChange:
    """A backend slower (regression) or faster (improvement) beyond noise at one point."""

    shape: tuple
    backend: str
    tokens: int
    a_median: float
    b_median: float
    ratio: float  # b / a
    a_p10: float | None
    a_p90: float | None
    b_p10: float | None
    b_p90: float | None
    medians_only: bool


@dataclass
class WinnerChange:
    shape: tuple
    tokens: int
    a_winner: str | None
    b_winner: str | None
    noise: bool
    why: str  # short: "1.52x faster in B", "spreads overlap in B", "old winner failed in B"
    speedup: float | None = None  # in B: old winner's median / new winner's median


@dataclass
class FailureChange:
    shape: tuple
    backend: str
    reason: str


@dataclass
class DiffResult:
    a: TableView
    b: TableView
    notes: list = field(default_factory=list)
    only_a: list = field(default_factory=list)  # shape keys
    only_b: list = field(default_factory=list)
    winner_changes: list = field(default_factory=list)
    regressions: list = field(default_factory=list)
    improvements: list = field(default_factory=list)
    new_failures: list = field(default_factory=list)
    fixed_failures: list = field(default_factory=list)
    compared_points: int = 0
    version_changes: dict = field(default_factory=dict)  # name -> (a, b)

    @property
    def clear_winner_changes(self) -> list:
        return [w for w in self.winner_changes if not w.noise]

    @property
    def regression_count(self) -> int:
        return len(self.regressions) + len(self.new_failures)

    def failing(self, fail_on: Iterable) -> list:
        """Which of ``fail_on`` ('regressions', 'winner-change') this diff trips."""
        hit = []
        fail_on = set(fail_on)
        if "regressions" in fail_on and self.regression_count:
            hit.append("regressions")
        if "winner-change" in fail_on and self.clear_winner_changes:
            hit.append("winner-change")
        return hit

    def to_dict(self) -> dict:
        def pc(p: PointChange) -> dict:
            d = dataclasses.asdict(p)
            d["shape"] = dict(zip(SHAPE_KEYS, p.shape))
            return d

        return {
            "a": {"source": self.a.label, "fingerprint": self.a.fingerprint, "run": self.a.run},
            "b": {"source": self.b.label, "fingerprint": self.b.fingerprint, "run": self.b.run},
            "version_changes": {k: list(v) for k, v in self.version_changes.items()},
            "notes": self.notes,
            "only_in_a": [dict(zip(SHAPE_KEYS, k)) for k in self.only_a],
            "only_in_b": [dict(zip(SHAPE_KEYS, k)) for k in self.only_b],
            "compared_points": self.compared_points,
            "winner_changes": [
                {**dataclasses.asdict(w), "shape": dict(zip(SHAPE_KEYS, w.shape))} for w in self.winner_changes
            ],
            "regressions": [pc(p) for p in self.regressions],
            "improvements": [pc(p) for p in self.improvements],
            "new_failures": [
                {**dataclasses.asdict(f), "shape": dict(zip(SHAPE_KEYS, f.shape))} for f in self.new_failures
            ],
            "fixed_failures": [
                {**dataclasses.asdict(f), "shape": dict(zip(SHAPE_KEYS, f.shape))} for f in self.fixed_failures
            ],
        }


def _match_curve(shape: ShapeView, label: str, backend: str) -> Curve | None:
    if label in shape.curves:
        return shape.curves[label]
    same = [c for c in shape.curves.values() if c.backend == backend]
    return same[0] if len(same) == 1 else None


def diff_views(a: TableView, b: TableView, *, tolerance: float = 0.0) -> DiffResult:
    """Compare baseline ``a`` with candidate ``b`` (rules in the module docstring).
    ``tolerance``: a slowdown must also exceed this fraction of A's median (0.05 = 5%)."""
    res = DiffResult(a=a, b=b)
    if a.fingerprint != b.fingerprint:
        res.notes.append(f"different hardware: A is {a.fingerprint or 'unknown'}, B is {b.fingerprint or 'unknown'}")
    elif a.facts_hash and b.facts_hash and a.facts_hash != b.facts_hash:
        res.notes.append(f"same fingerprint, different probe facts (hash {a.facts_hash} -> {b.facts_hash})")
    va, vb = a.run.get("versions") or {}, b.run.get("versions") or {}
    for k in sorted(set(va) | set(vb)):
        if va.get(k) != vb.get(k):
            res.version_changes[k] = (va.get(k), vb.get(k))
    a_keys = {s.key for s in a.shapes}
    b_keys = {s.key for s in b.shapes}
    res.only_a = [s.key for s in a.shapes if s.key not in b_keys]
    res.only_b = [s.key for s in b.shapes if s.key not in a_keys]
    timing_skips: dict = {}
    for sa in a.shapes:
        sb = b.shape(sa.key)
        if sb is None:
            continue
        # A backend A measured cleanly that fails in B is a regression; one A never ran
        # (e.g. newly added to the sweep, unavailable in B) is not.
        a_ok = {c.backend for c in sa.curves.values()} - set(sa.failed)
        b_ok = {c.backend for c in sb.curves.values()} - set(sb.failed)
        for backend, reason in sb.failed.items():
            if backend in a_ok:
                res.new_failures.append(FailureChange(sa.key, backend, reason))
        for backend, reason in sa.failed.items():
            if backend in b_ok:
                res.fixed_failures.append(FailureChange(sa.key, backend, reason))
        jb = {t: j for j, t in enumerate(sb.tokens)}
        for label, ca in sa.curves.items():
            cb = _match_curve(sb, label, ca.backend)
            if cb is None:
                continue
            if ca.timing and cb.timing and ca.timing != cb.timing:
                timing_skips[(ca.backend, ca.timing, cb.timing)] = (
                    timing_skips.get((ca.backend, ca.timing, cb.timing), 0) + 1
                )
                continue
            for j, t in enumerate(sa.tokens):
                if t not in jb:
                    continue
                am, a10, a90 = ca.at(j)
                bm, b10, b90 = cb.at(jb[t])
                if am is None or bm is None:
                    continue
                res.compared_points += 1
                ratio = bm / am
                spread = None not in (a10, a90, b10, b90)
                pc = PointChange(sa.key, label, t, am, bm, ratio, a10, a90, b10, b90, medians_only=not spread)
                if (b10 > a90 if spread else True) and ratio > 1 + tolerance:
                    res.regressions.append(pc)
                elif (b90 < a10 if spread else True) and ratio < 1 / (1 + tolerance):
                    res.improvements.append(pc)
        wa = {w.tokens: w for w in sa.winners}
        wb = {w.tokens: w for w in sb.winners}
        for t in sa.tokens:
            x, y = wa.get(t), wb.get(t)
            if t not in jb or (x is None and y is None):
                continue
            xa, yb = (x.backend if x else None), (y.backend if y else None)
            if xa == yb:
                continue
            res.winner_changes.append(_winner_change(sa.key, t, x, y, sb, jb[t]))
    for (backend, ta, tb), n in sorted(timing_skips.items()):
        res.notes.append(f"{backend}: timing mode {ta} in A, {tb} in B; {n} curve(s) not compared")
    return res


def _winner_change(key, t, x: Winner | None, y: Winner | None, sb: ShapeView, jb: int) -> WinnerChange:
    xa, yb = (x.backend if x else None), (y.backend if y else None)
    if xa is None:
        return WinnerChange(key, t, None, yb, False, "no winner in A")
    if yb is None:
        return WinnerChange(key, t, xa, None, False, "no winner in B")
    old_backend = sb.curves[xa].backend if xa in sb.curves else xa
    if old_backend in sb.failed:
        return WinnerChange(key, t, xa, yb, False, "old winner failed in B")
    old = _match_curve(sb, xa, old_backend)
    if old is None or old.at(jb)[0] is None:
        return WinnerChange(key, t, xa, yb, False, "old winner not measured in B")
    # Only B decides: a coin flip in A that B now settles clearly is a real change.
    tied = bool(y.tie and xa in (y.runner_up, y.fastest))
    om, o10, _ = old.at(jb)
    new = sb.curves.get(yb)
    nm, _, n90 = new.at(jb) if new else (y.median_us, None, None)
    overlap = o10 is not None and n90 is not None and o10 <= n90
    speedup = om / nm if nm else None
    if tied or overlap:
        why = "spreads overlap in B" if overlap else "marked a tie"
        return WinnerChange(key, t, xa, yb, True, why, speedup)
    return WinnerChange(key, t, xa, yb, False, "faster in B beyond noise", speedup)


def _runs(items: list, grid: Mapping, same) -> list:
    """Split ``items`` (each with .shape and .tokens, sorted) into runs of consecutive
    token counts of the shape's grid for which ``same(a, b)`` holds."""
    out: list = []
    for it in items:
        tokens = grid.get(it.shape, [])
        prev = out[-1][-1] if out else None
        if prev is not None and prev.shape == it.shape and same(prev, it) and prev.tokens in tokens:
            i = tokens.index(prev.tokens)
            if i + 1 < len(tokens) and tokens[i + 1] == it.tokens:
                out[-1].append(it)
                continue
        out.append([it])
    return out


def _ratio_range(lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return "-"
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}{EN_DASH}{hi:.2f}x"


def render_diff(res: DiffResult, console, *, fail_on: Iterable = ("regressions",)) -> None:
    """Print the diff with rich: what was compared, then per shape the winner changes,
    new failures and points slower / faster beyond noise, then one summary line."""
    from rich.table import Table
    from rich.text import Text

    def side(v: TableView) -> str:
        r = v.run
        bits = [v.label]
        if r.get("id") is not None and v.kind == "profile":
            bits.append(f"run {r['id']}")
        if r.get("started_at"):
            bits.append(_when(r["started_at"]))
        return ", ".join(str(b) for b in bits)

    def line(text, style=""):
        console.print(Text(text, style=style), soft_wrap=True)

    console.print(Text("a2a-tune diff", style="bold"))
    console.print(Text.assemble(("  A (baseline)  ", "dim"), side(res.a)), soft_wrap=True)
    console.print(Text.assemble(("  B (candidate) ", "dim"), side(res.b)), soft_wrap=True)
    if res.version_changes:
        changes = "  ".join(f"{k} {a or '-'} -> {b or '-'}" for k, (a, b) in res.version_changes.items())
        console.print(Text.assemble(("  versions      ", "dim"), changes), soft_wrap=True)
    for prefix, notes in (("note (A)", res.a.notes), ("note (B)", res.b.notes), ("note", res.notes)):
        for note in notes:
            line(f"  {prefix}: {note}", "yellow")
    for k in res.only_a:
        line(f"  only in A: {shape_label(k)}", "dim")
    for k in res.only_b:
        line(f"  only in B: {shape_label(k)}", "dim")

    grid = {s.key: s.tokens for s in res.a.shapes}
    order = {s.key: i for i, s in enumerate(res.a.shapes)}
    keyed = lambda it: (order.get(it.shape, 0), getattr(it, "backend", ""), it.tokens)  # noqa: E731
    changed = sorted(
        {x.shape for x in [*res.winner_changes, *res.regressions, *res.improvements, *res.new_failures]},
        key=lambda k: order.get(k, 0),
    )
    for key in changed:
        console.print()
        line(shape_label(key), "bold cyan")
        wcs = sorted((w for w in res.winner_changes if w.shape == key), key=keyed)
        if wcs:
            t = Table(title="winner changed", title_justify="left", title_style="bold", box=None, padding=(0, 1, 0, 2))
            t.add_column("tokens", justify="right", no_wrap=True)
            t.add_column("A winner", no_wrap=True)
            t.add_column("B winner", no_wrap=True)
            t.add_column("in B", overflow="fold")
            same = lambda p, q: (p.a_winner, p.b_winner, p.noise, p.why) == (q.a_winner, q.b_winner, q.noise, q.why)  # noqa: E731
            for run in _runs(wcs, grid, same):
                w = run[0]
                sp = [x.speedup for x in run if x.speedup]
                if w.noise:
                    detail = f"within noise ({w.why})"
                elif sp:
                    detail = f"new winner {_ratio_range(min(sp), max(sp))} faster"
                else:
                    detail = w.why
                t.add_row(
                    token_range(run[0].tokens, run[-1].tokens),
                    w.a_winner or "-",
                    w.b_winner or "-",
                    detail,
                    style="dim" if w.noise else "",
                )
            console.print(t)
        for f in (f for f in res.new_failures if f.shape == key):
            console.print(
                Text.assemble(("  newly failing in B: ", "bold red"), (f.backend, "bold"), f": {f.reason}"),
                soft_wrap=True,
            )
        for name, pts, style in (
            ("slower beyond noise", res.regressions, "bold red"),
            ("faster beyond noise", res.improvements, "bold green"),
        ):
            pts = sorted((p for p in pts if p.shape == key), key=keyed)
            if not pts:
                continue
            t = Table(title=name, title_justify="left", title_style=style, box=None, padding=(0, 1, 0, 2))
            t.add_column("backend", no_wrap=True)
            t.add_column("tokens", justify="right", no_wrap=True)
            t.add_column("B/A", justify="right", overflow="fold")
            t.add_column("A median µs", justify="right", overflow="fold")
            t.add_column("B median µs", justify="right", overflow="fold")
            for run in _runs(pts, grid, lambda p, q: p.backend == q.backend):
                p = run[0]
                ratio = _ratio_range(min(x.ratio for x in run), max(x.ratio for x in run))
                if any(x.medians_only for x in run):
                    ratio += " (medians only)"
                if len(run) == 1:
                    am = f"{fmt_us(p.a_median)} ({fmt_us(p.a_p10)}{EN_DASH}{fmt_us(p.a_p90)})"
                    bm = f"{fmt_us(p.b_median)} ({fmt_us(p.b_p10)}{EN_DASH}{fmt_us(p.b_p90)})"
                else:
                    am = f"{fmt_us(min(x.a_median for x in run))}{EN_DASH}{fmt_us(max(x.a_median for x in run))}"
                    bm = f"{fmt_us(min(x.b_median for x in run))}{EN_DASH}{fmt_us(max(x.b_median for x in run))}"
                t.add_row(p.backend, token_range(run[0].tokens, run[-1].tokens), ratio, am, bm)
            console.print(t)
    for f in res.fixed_failures:
        line(f"  no longer failing in B: {f.backend} at {shape_label(f.shape)} (was: {f.reason})", "green")
    console.print()
    summary = (
        f"{res.compared_points} point(s) compared: {len(res.regressions)} slower, {len(res.improvements)} faster, "
        f"{len(res.new_failures)} newly failing, {len(res.winner_changes)} winner change(s) "
        f"({len(res.clear_winner_changes)} beyond noise)"
    )
    hit = res.failing(fail_on)
    verdict = f" -> FAIL ({', '.join(hit)})" if hit else " -> OK"
    line(summary + verdict, "bold red" if hit else "bold green")
