"""The selection table on disk: schema versions 1 to 4 <-> one validated, read-only model.

The one reader AND writer of tables: :func:`parse_profile` reads any readable schema into a
:class:`Profile`; :func:`to_dict` / :func:`to_json` write a Profile as the current
:data:`SCHEMA_VERSION` (the one upgrade path is ``to_json(parse_profile(old))``,
:func:`upgrade`), and :mod:`a2a_tune.tuner.select` builds Profiles and writes them the same
way, so a table read and written again is byte-identical. Read by
:mod:`a2a_tune.tuner.runtime.lookup` at engine start-up and by every command that reads a
table, so each judges a table as the lookup does.

Standard library only: it checks by hand exactly what lookup relies on (jsonschema is too slow
for an engine's start-up; select checks the published ``profiles/schema-v<N>.json`` when it
writes). **Strict** (the default; lookup): the first problem raises :class:`ProfileError`.
**Lenient** (``notes=[]``; the views): the same problems raise, and what lookup tolerates but
an operator should hear about (missing winners, winners that disagree with the curves) is
appended to ``notes``. Every time is in [:data:`MIN_US`, :data:`MAX_US`] µs and every count
inside the point's bounds. A table of a newer schema says to upgrade a2a-tune.

What each schema added, and how older files are converted on load: docs/architecture.md
("Schemas"). Every problem is a :class:`ProfileError` whose ``str()`` is one line naming the
file and the JSON path of the field, e.g.
``h200.nvl18x2.node1.json: entries[3].backends.nccl_all2allv.median_us[2]: not a positive finite number``.
"""

from __future__ import annotations

from collections import namedtuple
from operator import le as _le
from types import MappingProxyType

from a2a_tune.tuner.runtime import engines
from a2a_tune.tuner.runtime.estimate import US_DECIMALS, winners
from a2a_tune.tuner.runtime.fingerprint import normalize_fingerprint
from a2a_tune.tuner.runtime.measurement import FIGURES
from a2a_tune.tuner.runtime.point import MAX_TOKENS_PER_RANK, SHAPE_FIELDS, Shape
from a2a_tune.tuner.runtime.table_fields import (
    MAX_US,
    MIN_US,
    ProfileError,
    check_winners,
    count_at,
    counts_at,
    curve_at,
    jtype,
    knobs_at,
    lenient_curve,
    obj_at,
    opt_str,
)
from a2a_tune.tuner.runtime.text import one_line

__all__ = [
    "FALLBACK_BACKEND",
    "MAX_US",
    "MIN_US",
    "READABLE_SCHEMAS",
    "BackendNames",
    "FABRICS",
    "Failed",
    "FIGURE_COUNTS",
    "FIGURE_CURVES",
    "SCHEMA_VERSION",
    "SHAPE_KEYS",
    "TIMING_MODES",
    "Profile",
    "ProfileEntry",
    "ProfileError",
    "Shape",
    "describe_shape",
    "entry_winners",
    "parse_profile",
    "round_us",
    "table_fingerprint",
    "to_dict",
    "json_text",
    "to_json",
    "upgrade",
]

#: vLLM's own default (``--all2all-backend``); the answer whenever the table cannot give one,
#: and the first choice when measurements cannot tell backends apart (a tie).
#: (Our backend of that name stands for it: it is the engine default's own literal.)
FALLBACK_BACKEND = engines.DEFAULT["vllm"]
#: The version select writes.
SCHEMA_VERSION = 4
#: The versions this reader loads (1 to 3 are converted on load).
READABLE_SCHEMAS = (1, 2, 3, 4)
#: What an entry's EP groups span (schema 4 ``fabric``), from the probe's facts: one NVLink
#: island (one node's NVLink), one multi-node NVLink domain (e.g. a GB200 NVL72 rack), or
#: nodes with no NVLink between them (the network). The kernels' ``SPANS`` (what a backend's
#: reach is compared with) are these.
FABRICS = ("island", "domain", "network")
#: Schema 3's optional figures per entry and backend, by their table keys (declared once:
#: ``runtime.measurement.FIGURES``): times (µs) and counts (>= 0), one value per token count.
FIGURE_CURVES = tuple(f.table for f in FIGURES if f.table and f.is_time and not f.many)
FIGURE_COUNTS = tuple(f.table for f in FIGURES if f.table and not f.is_time and not f.many)
TIMING_MODES = ("eager", "graph")
#: The keys that identify a table entry: the point's one shape-field order (the store's
#: records and the lookup's arguments carry the same names).
SHAPE_KEYS = SHAPE_FIELDS
#: Timing-mode spellings that mean CUDA-graph replay (schema-1 run.timing; select's input).
GRAPH_WORDS = frozenset({"graph", "cuda_graph", "cudagraph", "cuda-graph"})


def round_us(v: float) -> float:
    """A time in µs as a table stores it: to the nanosecond."""
    return round(float(v), US_DECIMALS)


def describe_shape(s: Shape) -> str:
    return Shape(*s).describe()


_NONE = MappingProxyType({})

# Records are named tuples, not dataclasses: importing dataclasses costs ~10 ms (it
# imports inspect), which every engine would pay at start-up.


class Failed(namedtuple("Failed", "kind tokens reason")):
    """Why a backend is never chosen for an entry: ``kind`` ("incorrect", "crashed",
    "unavailable", "not_applicable", "error", "timeout"), ``tokens`` (the token count per rank
    it failed at; None: the whole shape) and ``reason`` (one line). ``str()`` is one line."""

    __slots__ = ()

    def __str__(self) -> str:
        at = f" at {self.tokens} tokens/rank" if self.tokens is not None else ""
        return f"{self.kind}{at}: {self.reason}"


class ProfileEntry(
    namedtuple(
        "ProfileEntry",
        "shape source tokens median_us p10_us p90_us timing failed knobs figures provenance fabric origin failed_origin",
        defaults=(_NONE, _NONE),
    )
):
    """One validated entry: a shape and each backend's curves over tokens per rank.

    ``shape``: :data:`Shape`; ``source``: "measured" or "predicted"; ``tokens``: ascending
    token counts per rank; ``median_us`` / ``p10_us`` / ``p90_us``: backend -> tuple of
    float or None aligned with ``tokens``; ``timing``: backend -> "eager" | "graph";
    ``failed``: backend -> :class:`Failed` (never selected); ``knobs``: backend -> tuple
    aligned with ``tokens`` of read-only mappings or None (backends with knobs only);
    ``figures``: backend -> {figure name -> tuple aligned with ``tokens``} for the schema-3
    figures the table holds (backends with any); ``provenance``: tuple of read-only mappings
    {run, date, facts_hash, status}, newest first (schema 4; empty before); ``fabric``: one
    of :data:`FABRICS` or None (not recorded); ``origin``: backend -> tuple aligned with
    ``tokens`` of the index in ``provenance`` of the run each point comes from (None: not
    measured) and ``failed_origin``: backend -> that index for its failure; a backend absent
    there comes from ``provenance[0]``. Mappings are read-only.
    """

    __slots__ = ()

    def origin_of(self, backend: str) -> tuple:
        """The provenance index of each point of ``backend``'s curve (None: not measured)."""
        got = self.origin.get(backend)
        if got is not None:
            return got
        return tuple(None if m is None else 0 for m in self.median_us.get(backend, ()))


class BackendNames(namedtuple("BackendNames", "literals closest engine_options")):
    """What the engines call one backend: ``literals``, engine -> its literal (None: the engine
    has none); ``closest``, engine -> the literal of the engine's backend doing the same job,
    where it has none (informational: never answered in this one's place);
    ``engine_options``: engine -> tuple of the options it needs beside the literal. Keyed by
    :data:`a2a_tune.tuner.runtime.engines.ENGINES` (a table may name engines this version
    does not know: kept, never answered)."""

    __slots__ = ()

    def literal(self, engine: str):
        """The literal of ``engine`` ("vllm", "sglang", "trtllm") for this backend, or None."""
        return self.literals.get(engine)

    @classmethod
    def of(cls, literals=None, closest=None, engine_options=None) -> BackendNames:
        """From plain mappings (engine -> literal / closest literal / options)."""
        opts = {e: tuple(o) for e, o in (engine_options or {}).items()}
        return cls(
            MappingProxyType(dict(literals or {})), MappingProxyType(dict(closest or {})), MappingProxyType(opts)
        )


_NO_OPTIONS = MappingProxyType({})


class Profile(namedtuple("Profile", "path schema fingerprint backends tie_preference entries by_shape capacity meta")):
    """A validated profile: what lookup needs, and the capacity the table was measured at.

    ``schema``: the file's version (1 is converted on load); ``backends``: backend ->
    :class:`BackendNames`; ``tie_preference``: backends, most preferred first;
    ``entries``: tuple of :class:`ProfileEntry`; ``by_shape``: Shape -> ProfileEntry;
    ``capacity``: ``run.capacity`` (tokens per rank the fixed-capacity backends were built
    for) or None; ``meta``: what the file says beside the entries, written back as read
    (``generated_by``, ``generated_at``, ``hardware`` without the fingerprint, ``run``).
    """

    __slots__ = ()

    def partial_runs(self) -> tuple:
        """Ids of the unfinished runs (running, interrupted, failed) some entry comes from:
        such a table was selected with ``--partial`` and may lack what those runs had left."""
        return tuple(
            sorted(
                {p.get("run") for e in self.entries for p in e.provenance if p.get("status") != "completed"},
                key=str,
            )
        )

    def with_entries(self, entries) -> Profile:
        """This profile holding ``entries`` instead (``by_shape`` follows them)."""
        entries = tuple(entries)
        return self._replace(entries=entries, by_shape=MappingProxyType({e.shape: e for e in entries}))


# ------------------------------------------------------------------------------ parse


def parse_profile(data, path: str | None = None, *, notes: list | None = None) -> Profile:
    """Validate decoded profile JSON (schema 1 to 4) -> :class:`Profile`.

    Raises :class:`ProfileError` naming the first bad field. ``notes``: a list for the
    lenient mode (module docstring): what lookup tolerates is appended there, one line each.
    """
    try:
        return _parse(data, path, notes)
    except ProfileError as exc:
        if exc.path is None and path is not None:
            exc.path = path
        raise


def _parse(data, path, notes) -> Profile:
    top = obj_at(data, "top level")
    if "schema" not in top:
        raise ProfileError("missing", field="schema")
    schema = top["schema"]
    if type(schema) is int and schema > SCHEMA_VERSION:
        raise ProfileError(
            f"version {schema} is from a newer a2a-tune (this one reads schemas "
            f"{', '.join(map(str, READABLE_SCHEMAS))}); upgrade a2a-tune to read it",
            field="schema",
        )
    if type(schema) is not int or schema not in READABLE_SCHEMAS:
        raise ProfileError(
            f"unsupported version {schema!r} (this a2a-tune reads schemas "
            f"{', '.join(map(str, READABLE_SCHEMAS))}; regenerate the table with `a2a-tune select`)",
            field="schema",
        )
    hw = obj_at(top.get("hardware"), "hardware")
    fp = table_fingerprint(hw.get("fingerprint"))
    run = top.get("run")
    capacity = run.get("capacity") if isinstance(run, dict) else None
    if capacity is not None:
        count_at(capacity, "run.capacity")

    backends = {}
    for name, spec in obj_at(top.get("backends"), "backends").items():
        where = f"backends.{name}"
        spec = obj_at(spec, where)
        if schema >= 4:
            literals = _literals(spec.get("engines"), f"{where}.engines", nullable=True)
            closest = _literals(spec.get("closest"), f"{where}.closest", nullable=False)
        else:  # one field per engine
            literals = {e: opt_str(spec.get(f"{e}_name"), f"{where}.{e}_name") for e in engines.ENGINES}
            closest = {"vllm": spec["vllm_closest"]} if isinstance(spec.get("vllm_closest"), str) else {}
        options = _engine_options(spec.get("engine_options"), f"{where}.engine_options")
        backends[name] = BackendNames(MappingProxyType(literals), MappingProxyType(closest), options)

    if schema == 1:
        timing = _v1_timing(top.get("run"))
        preference = _default_preference(backends)
    else:
        timing = None
        preference = _preference(top.get("tie_preference"), backends)

    raw_entries = top.get("entries")
    if not isinstance(raw_entries, list):
        raise ProfileError(f"expected an array, got {jtype(raw_entries)}", field="entries")
    if not raw_entries:
        raise ProfileError("empty table (no entries)", field="entries")

    legacy = _legacy_source(run, hw) if schema < 4 else ()
    entries = []
    by_shape = {}
    for i, raw in enumerate(raw_entries):
        entry = _parse_entry(raw, f"entries[{i}]", backends, timing, schema, legacy)
        if entry.shape in by_shape:
            j = entries.index(by_shape[entry.shape])
            raise ProfileError(f"same shape as entries[{j}]", field=f"entries[{i}]")
        by_shape[entry.shape] = entry
        entries.append(entry)
    if notes is not None:
        for i, (raw, entry) in enumerate(zip(raw_entries, entries)):
            notes.extend(_winner_notes(raw.get("winners"), entry, preference, f"entries[{i}]", v1=schema == 1))
    return Profile(
        path=path,
        schema=schema,
        fingerprint=fp,
        backends=MappingProxyType(backends),
        tie_preference=preference,
        entries=tuple(entries),
        by_shape=MappingProxyType(by_shape),
        capacity=capacity,
        meta=MappingProxyType(
            {
                "generated_by": top.get("generated_by"),
                "generated_at": top.get("generated_at"),
                "hardware": {k: v for k, v in hw.items() if k != "fingerprint"},
                "run": dict(run) if isinstance(run, dict) else {},
            }
        ),
    )


def _legacy_source(run, hw: dict) -> tuple:
    """An older table's provenance: the one run it was selected from (select took completed
    runs), as its ``run`` section names it; () if it names none."""
    run = run if isinstance(run, dict) else {}
    if type(run.get("id")) not in (int, str):
        return ()
    date, facts_hash = run.get("started_at"), hw.get("facts_hash")
    source = {
        "run": run["id"],
        "date": date if isinstance(date, str) else None,
        "facts_hash": facts_hash if isinstance(facts_hash, str) else None,
        "status": "completed",
    }
    return (MappingProxyType(source),)


def _literals(raw, where: str, *, nullable: bool) -> dict:
    """Schema 4 ``engines`` / ``closest``: absent or an object engine -> literal (or null)."""
    if raw is None:
        return {}
    out = {}
    for engine, literal in obj_at(raw, where).items():
        if not (isinstance(literal, str) and literal) and not (nullable and literal is None):
            wanted = "a non-empty string" + (" or null" if nullable else "")
            raise ProfileError(f"expected {wanted}, got {jtype(literal)}", field=f"{where}.{engine}")
        out[engine] = literal
    return out


def _engine_options(raw, where: str):
    """``engine_options``: absent/null or an object engine -> array of strings (the options an
    engine needs beside the literal, e.g. ``{"sglang": ["--deepep-mode", "low_latency"]}``)."""
    if raw is None:
        return _NO_OPTIONS
    out = {}
    for engine, opts in obj_at(raw, where).items():
        if not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
            raise ProfileError(f"expected an array of strings, got {jtype(opts)}", field=f"{where}.{engine}")
        out[engine] = tuple(opts)
    return MappingProxyType(out)


def _v1_timing(run) -> str:
    t = run.get("timing") if isinstance(run, dict) else None
    return "graph" if isinstance(t, str) and t.strip().lower() in GRAPH_WORDS else "eager"


def _default_preference(backends: dict) -> tuple:
    """Schema 1: the engine default first, then the ``backends`` section's order."""
    first = [FALLBACK_BACKEND] if FALLBACK_BACKEND in backends else []
    return tuple(first + [b for b in backends if b != FALLBACK_BACKEND])


def _preference(raw, backends: dict) -> tuple:
    if not isinstance(raw, list):
        raise ProfileError(f"expected an array of backend names, got {jtype(raw)}", field="tie_preference")
    seen = set()
    for j, b in enumerate(raw):
        if not isinstance(b, str) or b not in backends:
            raise ProfileError(f"unknown backend {b!r} (not in 'backends')", field=f"tie_preference[{j}]")
        if b in seen:
            raise ProfileError(f"{b!r} listed twice", field=f"tie_preference[{j}]")
        seen.add(b)
    # Backends the list leaves out rank after it, in the 'backends' section's order.
    return tuple(raw) + tuple(b for b in backends if b not in seen)


def _parse_entry(
    raw, where: str, backends: dict, v1_timing: str | None, schema: int, legacy_source: tuple = ()
) -> ProfileEntry:
    e = obj_at(raw, where)
    ints = []
    for key in SHAPE_KEYS[:4]:
        ints.append(count_at(e.get(key), f"{where}.{key}", key))
    strs = []
    for key in SHAPE_KEYS[4:]:
        v = e.get(key)
        if not isinstance(v, str) or not v:
            raise ProfileError(f"not a non-empty string ({v!r})", field=f"{where}.{key}")
        strs.append(v)
    shape = Shape(*ints, *strs)

    source = e.get("source", "measured")
    if source not in ("measured", "predicted"):
        raise ProfileError(f"expected 'measured' or 'predicted', got {source!r}", field=f"{where}.source")

    tokens = e.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ProfileError("expected a non-empty array of token counts", field=f"{where}.tokens")
    for j, t in enumerate(tokens):
        count_at(t, f"{where}.tokens[{j}]")
        if j and t <= tokens[j - 1]:
            raise ProfileError("token counts must be strictly ascending", field=f"{where}.tokens[{j}]")
    n = len(tokens)

    medians, p10s, p90s, timings, knobs, extra, origin_raw = {}, {}, {}, {}, {}, {}, {}
    for name, curve in obj_at(e.get("backends"), f"{where}.backends").items():
        bwhere = f"{where}.backends.{name}"
        if name not in backends:
            raise ProfileError("backend not declared in the top-level 'backends'", field=bwhere)
        curve = obj_at(curve, bwhere)
        med, med_complete = curve_at(curve.get("median_us"), n, bwhere, "median_us")
        if v1_timing is not None:
            timings[name] = v1_timing
            lo, hi = lenient_curve(curve.get("p10_us"), n), lenient_curve(curve.get("p90_us"), n)
        else:
            mode = curve.get("timing")
            if mode not in TIMING_MODES:
                raise ProfileError(
                    f"expected one of {', '.join(map(repr, TIMING_MODES))}, got {mode!r}", field=f"{bwhere}.timing"
                )
            timings[name] = mode
            lo, lo_complete = curve_at(curve.get("p10_us"), n, bwhere, "p10_us")
            hi, hi_complete = curve_at(curve.get("p90_us"), n, bwhere, "p90_us")
            # map(le) runs in C: this check is per point of every curve.
            if not (med_complete and lo_complete and hi_complete and all(map(_le, lo, med)) and all(map(_le, med, hi))):
                for j, (a, m, b) in enumerate(zip(lo, med, hi)):
                    if m is not None and ((a is not None and a > m) or (b is not None and b < m)):
                        raise ProfileError(
                            f"median {m} outside its p10..p90 spread [{a}, {b}]", field=f"{bwhere}.median_us[{j}]"
                        )
        medians[name], p10s[name], p90s[name] = med, lo, hi
        if "knobs" in curve:
            knobs[name] = knobs_at(curve["knobs"], n, f"{bwhere}.knobs")
        if schema >= 3:
            found = {k: curve_at(curve[k], n, bwhere, k)[0] for k in FIGURE_CURVES if k in curve}
            found.update({k: counts_at(curve[k], n, bwhere, k) for k in FIGURE_COUNTS if k in curve})
            if found:
                extra[name] = MappingProxyType(found)
        if "from" in curve and schema >= 4:
            origin_raw[name] = curve["from"]

    failed = {}
    for name, why in obj_at(e.get("failed", {}), f"{where}.failed").items():
        failed[name] = _failed(why, f"{where}.failed.{name}", schema)
    provenance, fabric, origin, failed_origin = legacy_source, None, {}, {}
    if schema >= 4:
        provenance = _provenance(e.get("provenance", []), f"{where}.provenance")
        for name, raw_from in origin_raw.items():
            origin[name] = _origin(raw_from, n, len(provenance), medians[name], f"{where}.backends.{name}.from")
        for name, why in e.get("failed", {}).items():
            if "from" in why:
                failed_origin[name] = _origin_index(why["from"], len(provenance), f"{where}.failed.{name}.from")
        fabric = e.get("fabric")
        if fabric is not None and fabric not in FABRICS:
            raise ProfileError(
                f"expected one of {', '.join(map(repr, FABRICS))} or null, got {one_line(repr(fabric), 80)}",
                field=f"{where}.fabric",
            )

    check_winners(e.get("winners", []), where, set(tokens), medians, failed, v1=v1_timing is not None)

    return ProfileEntry(
        shape=shape,
        source=source,
        tokens=tuple(tokens),
        median_us=MappingProxyType(medians),
        p10_us=MappingProxyType(p10s),
        p90_us=MappingProxyType(p90s),
        timing=MappingProxyType(timings),
        failed=MappingProxyType(failed),
        knobs=MappingProxyType(knobs),
        figures=MappingProxyType(extra),
        provenance=provenance,
        fabric=fabric,
        origin=MappingProxyType(origin),
        failed_origin=MappingProxyType(failed_origin),
    )


def _origin_index(v, runs: int, where: str) -> int:
    if type(v) is not int or not 0 <= v < runs:
        raise ProfileError(
            f"expected the index of one of the entry's {runs} provenance record(s), got {v!r}", field=where
        )
    return v


def _origin(raw, n: int, runs: int, medians: tuple, where: str) -> tuple:
    """A curve's ``from``: per token count, the provenance index of its run (null: not measured)."""
    if type(raw) is not list or len(raw) != n:
        raise ProfileError(f"expected an array of {n} values (one per token count)", field=where)
    for j, (v, m) in enumerate(zip(raw, medians)):
        if (v is None) != (m is None):
            raise ProfileError("null exactly where the median is null", field=f"{where}[{j}]")
        if v is not None:
            _origin_index(v, runs, f"{where}[{j}]")
    return tuple(raw)


def _failed(raw, where: str, schema: int) -> Failed:
    """Schema 4: an object {kind, tokens, reason}. Before: select's text
    ``"kind[ at T tokens/rank]: reason"``, converted here once (other text: kind "error")."""
    if schema < 4:
        if not isinstance(raw, str):
            raise ProfileError(f"expected a string reason, got {jtype(raw)}", field=where)
        import re

        m = re.match(r"([a-z_]+)(?: at (\d+) tokens/rank)?: (.*)\Z", raw, re.S)
        if m is None:
            return Failed("error", None, raw)
        return Failed(m[1], int(m[2]) if m[2] and int(m[2]) <= MAX_TOKENS_PER_RANK else None, m[3])
    raw = obj_at(raw, where)
    kind, tokens, reason = raw.get("kind"), raw.get("tokens"), raw.get("reason")
    if not isinstance(kind, str) or not kind:
        raise ProfileError(f"expected a non-empty string, got {jtype(kind)}", field=f"{where}.kind")
    if tokens is not None:
        count_at(tokens, f"{where}.tokens")
    if not isinstance(reason, str):
        raise ProfileError(f"expected a string, got {jtype(reason)}", field=f"{where}.reason")
    return Failed(kind, tokens, reason)


_PROVENANCE_TYPES = {"run": (int, str), "date": (str, type(None)), "facts_hash": (str, type(None)), "status": (str,)}


def _provenance(raw, where: str) -> tuple:
    """Schema 4 ``provenance``: an array of {run, date, facts_hash, status}, newest first."""
    if type(raw) is not list:
        raise ProfileError(f"expected an array, got {jtype(raw)}", field=where)
    out = []
    for j, p in enumerate(raw):
        p = obj_at(p, f"{where}[{j}]")
        for key, types in _PROVENANCE_TYPES.items():
            if type(p.get(key)) not in types:
                raise ProfileError(f"unexpected {jtype(p.get(key))}", field=f"{where}[{j}].{key}")
        out.append(MappingProxyType({k: p[k] for k in _PROVENANCE_TYPES}))
    return tuple(out)


def table_fingerprint(fp) -> str:
    """``fp`` as a table holds it (:func:`~a2a_tune.tuner.runtime.fingerprint.normalize_fingerprint`),
    or :class:`ProfileError` naming ``hardware.fingerprint``: the reader's check, and select's."""
    if not isinstance(fp, str):
        raise ProfileError(f"expected a string, got {jtype(fp)}", field="hardware.fingerprint")
    try:
        return normalize_fingerprint(fp)
    except ValueError as exc:
        raise ProfileError(str(exc), field="hardware.fingerprint") from None


# ------------------------------------------------------------------ winners (lenient)


def entry_winners(entry: ProfileEntry, preference) -> list:
    """The entry's :class:`~a2a_tune.tuner.runtime.estimate.Winner` per token count: what
    lookup answers at each measured count (the tie rule over the curves)."""
    return winners(entry.tokens, entry.median_us, entry.p10_us, entry.p90_us, entry.failed, preference)


def _winner_notes(raw, entry: ProfileEntry, preference, where: str, *, v1: bool) -> list:
    """Lenient mode: one note when the entry's written winners are missing or differ from
    what its curves give (the table was edited, or written by an older rule)."""
    if raw is None:
        return [f"{where}: no winners in the table; derived from its curves"]
    written = {w["tokens"]: w for w in raw}  # checked by check_winners
    differ = []
    for w in entry_winners(entry, preference):
        got = written.get(w.tokens)
        if (
            got is None
            or got["backend"] != w.backend
            or (not v1 and (got["fastest"], got["tie"]) != (w.fastest, w.tie))
        ):
            differ.append(w.tokens)
    if not differ:
        return []
    shown = ", ".join(map(str, differ[:6])) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
    return [
        f"{where}: the table's winners differ from its curves at {shown} tokens/rank; "
        "shown as its curves give them (what the lookup answers)"
    ]


# ------------------------------------------------------------------------------ write


def to_dict(profile: Profile) -> dict:
    """``profile`` as the current schema's JSON object: what :func:`parse_profile` reads back
    as the same Profile. Winners are written as the curves give them (the rule lookup
    applies); a spread that does not hold the median (schema 1 only) is left out."""
    meta = profile.meta
    out: dict = {"schema": SCHEMA_VERSION}
    for key in ("generated_by", "generated_at"):
        if meta.get(key) is not None:
            out[key] = meta[key]
    out["hardware"] = {**meta.get("hardware", {}), "fingerprint": profile.fingerprint}
    run = dict(meta.get("run") or {})
    run.pop("timing", None)  # schema 1's one mode: per backend per entry since schema 2
    if "versions" in run:
        versions = run["versions"] if isinstance(run["versions"], dict) else {}
        run["versions"] = {str(k): (None if v is None else str(v)) for k, v in versions.items()}
    out["run"] = run
    out["backends"] = {b: _names_out(n) for b, n in profile.backends.items()}
    out["tie_preference"] = list(profile.tie_preference)
    out["entries"] = [_entry_out(e, profile.tie_preference) for e in profile.entries]
    return out


def _names_out(names: BackendNames) -> dict:
    out = {"engines": dict(names.literals)}
    if names.closest:
        out["closest"] = dict(names.closest)
    if names.engine_options:
        out["engine_options"] = {e: list(o) for e, o in names.engine_options.items()}
    return out


def _entry_out(e: ProfileEntry, preference) -> dict:
    out = dict(zip(SHAPE_KEYS, e.shape))
    curves = {}
    for b, med in e.median_us.items():
        lo = [v if v is not None and m is not None and v <= m else None for v, m in zip(e.p10_us[b], med)]
        hi = [v if v is not None and m is not None and v >= m else None for v, m in zip(e.p90_us[b], med)]
        curve = {"timing": e.timing[b], "median_us": list(med), "p10_us": lo, "p90_us": hi}
        if b in e.knobs:
            curve["knobs"] = [None if k is None else dict(k) for k in e.knobs[b]]
        curve.update({k: list(v) for k, v in e.figures.get(b, {}).items()})
        if len(e.provenance) > 1:  # one run: every point is its own
            curve["from"] = list(e.origin_of(b))
        curves[b] = curve
    out.update(source=e.source, tokens=list(e.tokens), backends=curves)
    out["winners"] = [w._asdict() for w in entry_winners(e, preference)]
    out["failed"] = {b: f._asdict() for b, f in e.failed.items()}
    if len(e.provenance) > 1:
        for b, f in out["failed"].items():
            f["from"] = e.failed_origin.get(b, 0)
    if e.provenance:
        out["provenance"] = [dict(p) for p in e.provenance]
    if e.fabric is not None:
        out["fabric"] = e.fabric
    return out


def to_json(profile: Profile) -> str:
    """The table file's text: :func:`to_dict`, keys sorted, one line per curve / winner / flat
    object (so ``diff`` of two tables shows one changed line per changed curve), a final
    newline. ``to_json(parse_profile(json.loads(text))) == text`` for a file it wrote."""
    return json_text(to_dict(profile))


def json_text(table: dict) -> str:
    """A table object (:func:`to_dict`) as the file's text (:func:`to_json`)."""
    return _dumps(table) + "\n"


def upgrade(data) -> dict:
    """A table of any readable schema as the current one: the conversion on load, written
    back (:func:`to_dict`). Raises :class:`ProfileError` if ``data`` does not load."""
    return to_dict(parse_profile(data))


def _scalar(v) -> str:
    import json

    return json.dumps(v, allow_nan=False, ensure_ascii=False)


def _dumps(v, level: int = 0) -> str:
    """Pretty JSON with sorted keys: ``json.dumps(indent=2, sort_keys=True)`` but an object or
    array of scalars stays on one line."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(v, dict):
        if not v:
            return "{}"
        keys = sorted(v, key=str)
        if all(not isinstance(v[k], (dict, list, tuple)) for k in keys):
            return "{" + ", ".join(f"{_scalar(str(k))}: {_scalar(v[k])}" for k in keys) + "}"
        body = ",\n".join(f"{inner}{_scalar(str(k))}: {_dumps(v[k], level + 1)}" for k in keys)
        return "{\n" + body + "\n" + pad + "}"
    if isinstance(v, (list, tuple)):
        if not v:
            return "[]"
        if all(not isinstance(x, (dict, list, tuple)) for x in v):
            return "[" + ", ".join(_scalar(x) for x in v) + "]"
        body = ",\n".join(f"{inner}{_dumps(x, level + 1)}" for x in v)
        return "[\n" + body + "\n" + pad + "]"
    return _scalar(v)
