"""The selection table on disk: schema versions 1, 2 and 3 -> one validated, read-only model.

The one reader of tables: written by :mod:`a2a_tune.tuner.select` (always the current
:data:`SCHEMA_VERSION`, checked here before writing), read by
:mod:`a2a_tune.tuner.runtime.lookup` at engine start-up, and by every other command that
reads a table (``show``, ``diff``, ``plot``, ``report``, ``evaluate``, ``tune-knobs``), so
each judges a table as the lookup does. Standard library only; it checks by hand exactly
what lookup relies on (jsonschema is too slow and heavy for an engine's start-up;
``select.validate_profile`` runs the published JSON Schema ``profiles/schema-v3.json`` as
well before writing).

Two modes, one set of rules. **Strict** (the default; what lookup uses): the first problem
raises :class:`ProfileError`. **Lenient** (``notes=[]``; the views): the same problems
still raise -- a view refuses what every engine would refuse -- and what the lookup
tolerates but an operator should hear about is appended to ``notes``, one line each: an
entry without winners, winners that disagree with the entry's curves (lookup answers from
the curves: :func:`a2a_tune.tuner.runtime.estimate.winners`).

**Ranges.** Every time is a number of µs in [:data:`MIN_US`, :data:`MAX_US`], every token
count (and the capacity) one the point allows (:func:`~a2a_tune.tuner.runtime.point.check_tokens`:
1..2^20, as the CLI, the store and lookup) and every shape size inside the point's bounds:
inside them every ratio, logarithm and power law the lookup computes is finite and non-zero
(a median of 5e-324 would round to 0 and divide by zero).

Schema 2 adds to schema 1 (see the JSON Schema for every field):

* per entry and backend ``timing``: ``"eager"`` or ``"graph"`` (CUDA-graph replay) -- one
  table may mix modes (capturable backends are timed as engines run them in decode);
  schema 1 had a single ``run.timing`` for the whole table;
* ``p10_us`` / ``p90_us`` checked too (they decide ties), with p10 <= median <= p90;
* per winner: ``fastest`` (lowest median), ``runner_up``, ``margin`` =
  runner-up median / fastest median - 1, ``tie`` and the winner's p10/p90;
* ``tie_preference``: the order that settles ties (see :mod:`a2a_tune.tuner.runtime.estimate`).
* optional per entry and backend ``knobs``: one object (knob name -> number, string or
  boolean) or null per token count, aligned with ``tokens``: the launch setting the knob
  search (:mod:`a2a_tune.tuner.knobs`) found fastest there; null: the backend's defaults.

Schema 3 adds to schema 2 optional figures per entry and backend, each an array aligned with
``tokens`` holding null where not measured (:data:`FIGURE_CURVES` in µs, :data:`FIGURE_COUNTS`
numbers >= 0; what each counts: :mod:`a2a_tune.tuner.figures`): ``dispatch_us`` and
``combine_us``, the bytes per rank per direction of each half (logical and over the link),
and ``workspace_mib``, the device memory the backend holds per rank. Schema 1 and 2 tables
have none: their entries carry the round trip alone.

Schema 1 files are converted on load: every backend gets ``run.timing`` ("graph" for
``graph`` / ``cuda_graph``, else "eager"), p10/p90 are used where valid (else the
spread is unknown: no ties), and the tie preference is the engine default
``allgather_reducescatter`` first, then the order of the ``backends`` section. Any other
version is refused with one line naming the field ``schema``.

Every problem is a :class:`ProfileError` whose ``str()`` is one line naming the file and
the JSON path of the field, e.g.
``h200.nvl18x2.node1.json: entries[3].backends.nccl_all2allv.median_us[2]: not a positive finite number``.
"""

from __future__ import annotations

from collections import namedtuple
from operator import le as _le
from types import MappingProxyType

from a2a_tune.tuner.runtime.estimate import US_DECIMALS, winners
from a2a_tune.tuner.runtime.fingerprint import normalize_fingerprint
from a2a_tune.tuner.runtime.measurement import FIGURES
from a2a_tune.tuner.runtime.point import (
    MAX_EP_SIZE,
    MAX_EXPERTS,
    MAX_HIDDEN,
    MAX_TOKENS_PER_RANK,
    MAX_TOPK,
    SHAPE_FIELDS,
    PointError,
    Shape,
    check_count,
)
from a2a_tune.tuner.runtime.text import one_line

__all__ = [
    "FALLBACK_BACKEND",
    "MAX_US",
    "MIN_US",
    "READABLE_SCHEMAS",
    "BackendNames",
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
]

#: vLLM's own default (``--all2all-backend``); the answer whenever the table cannot give one,
#: and the first choice when measurements cannot tell backends apart (a tie).
FALLBACK_BACKEND = "allgather_reducescatter"
#: The version select writes.
SCHEMA_VERSION = 3
#: The versions this reader loads (1 is converted on load).
READABLE_SCHEMAS = (1, 2, 3)
#: Schema 3's optional figures per entry and backend, by their table keys (declared once:
#: ``runtime.measurement.FIGURES``): times (µs) and counts (>= 0), one value per token count.
FIGURE_CURVES = tuple(f.table for f in FIGURES if f.table and f.is_time and not f.many)
FIGURE_COUNTS = tuple(f.table for f in FIGURES if f.table and not f.is_time and not f.many)
TIMING_MODES = ("eager", "graph")
#: The keys that identify a table entry: the point's one shape-field order (the store's
#: records and the lookup's arguments carry the same names).
SHAPE_KEYS = SHAPE_FIELDS
#: The range of a time a table may hold, in µs: 1 ns (the stored resolution) to 1000 s.
MIN_US = 10.0**-US_DECIMALS
MAX_US = 1e9
#: The largest value of each count a table holds: the point's bounds.
_COUNT_BOUNDS = {
    "ep_size": MAX_EP_SIZE,
    "hidden": MAX_HIDDEN,
    "topk": MAX_TOPK,
    "num_experts": MAX_EXPERTS,
    "tokens": MAX_TOKENS_PER_RANK,
}

_INF = float("inf")
#: The largest count figure a table may hold (bytes, MiB): 2**63, so sums and comparisons of
#: a few of them stay finite floats.
MAX_FIGURE = float(2**63)
_NUMBER_TYPES = frozenset({float, int})
_NUMBER_OR_NONE = frozenset({float, int, type(None)})
#: Timing-mode spellings that mean CUDA-graph replay (schema-1 run.timing; select's input).
GRAPH_WORDS = frozenset({"graph", "cuda_graph", "cudagraph", "cuda-graph"})


class ProfileError(ValueError):
    """A profile that cannot be used. ``str()`` is one line: ``[file: ][field: ]problem``."""

    def __init__(self, problem: str, *, field: str | None = None, path: str | None = None):
        self.problem = one_line(problem)  # names and values from the file: one safe line
        self.field = field
        self.path = path
        super().__init__(self.problem)

    def __str__(self) -> str:
        parts = [p for p in (self.path, self.field) if p]  # a field names the table's keys
        return one_line(": ".join(parts + [self.problem]))


def round_us(v: float) -> float:
    """A time in µs as a table stores it: to the nanosecond."""
    return round(float(v), US_DECIMALS)


def describe_shape(s: Shape) -> str:
    return Shape(*s).describe()


# Records are named tuples, not dataclasses: importing dataclasses costs ~10 ms (it
# imports inspect), which every engine would pay at start-up.


class ProfileEntry(
    namedtuple("ProfileEntry", "shape source tokens median_us p10_us p90_us timing failed knobs figures")
):
    """One validated entry: a shape and each backend's curves over tokens per rank.

    ``shape``: :data:`Shape`; ``source``: "measured" or "predicted"; ``tokens``: ascending
    token counts per rank; ``median_us`` / ``p10_us`` / ``p90_us``: backend -> tuple of
    float or None aligned with ``tokens``; ``timing``: backend -> "eager" | "graph";
    ``failed``: backend -> one-line reason (never selected); ``knobs``: backend -> tuple
    aligned with ``tokens`` of read-only mappings or None (backends with knobs only);
    ``figures``: backend -> {figure name -> tuple aligned with ``tokens``} for the schema-3
    figures the table holds (backends with any). Mappings are read-only.
    """

    __slots__ = ()


class BackendNames(namedtuple("BackendNames", "vllm_name sglang_name trtllm_name engine_options")):
    """What the engines call one backend: each engine's literal for it (None: the engine has
    none) and ``engine_options``: engine -> tuple of the options it needs beside the literal."""

    __slots__ = ()

    def literal(self, engine: str):
        """The literal of ``engine`` ("vllm", "sglang", "trtllm") for this backend, or None."""
        return {"vllm": self.vllm_name, "sglang": self.sglang_name, "trtllm": self.trtllm_name}.get(engine)


_NO_OPTIONS = MappingProxyType({})


class Profile(namedtuple("Profile", "path schema fingerprint backends tie_preference entries by_shape capacity")):
    """A validated profile: what lookup needs, and the capacity the table was measured at.

    ``schema``: the file's version (1 is converted on load); ``backends``: backend ->
    :class:`BackendNames`; ``tie_preference``: backends, most preferred first;
    ``entries``: tuple of :class:`ProfileEntry`; ``by_shape``: Shape -> ProfileEntry;
    ``capacity``: ``run.capacity`` (tokens per rank the fixed-capacity backends were built
    for) or None.
    """

    __slots__ = ()


# ----------------------------------------------------------------------- small checks


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_us(v) -> bool:
    """A time a table may hold (NaN fails both comparisons)."""
    return (type(v) is float or type(v) is int) and MIN_US <= v <= MAX_US


def _count(v, field: str, kind: str = "tokens") -> int:
    """``v`` if it is a count of ``kind`` the point allows, else ProfileError at ``field``
    with the point's own one-line message (the fast path raises nothing)."""
    upper = _COUNT_BOUNDS[kind]
    if type(v) is int and 1 <= v <= upper:
        return v
    try:
        check_count(v, "tokens per rank" if kind == "tokens" else kind, upper)
    except PointError as exc:
        raise ProfileError(str(exc), field=field) from None
    return v


def _us_problem(v) -> str:
    if (type(v) is float or type(v) is int) and 0 < v < _INF:
        return f"{v!r} us is outside the range a table may hold ({MIN_US:g}..{MAX_US:g} us)"
    return "not a positive finite number"


def _jtype(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, str):
        return "string"
    if _is_num(v):
        return "number"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _obj(v, where: str) -> dict:
    if not isinstance(v, dict):
        raise ProfileError(f"expected a JSON object, got {_jtype(v)}", field=where)
    return v


def _opt_str(v, where: str):
    if v is not None and not isinstance(v, str):
        raise ProfileError(f"expected a string or null, got {_jtype(v)}", field=where)
    return v


def _curve(raw, n: int, where: str, key: str) -> tuple:
    """A strict curve ``where.key``: an array of n values, each null or a time in range
    -> (the values as a tuple, True if none of them is null)."""
    if type(raw) is not list or len(raw) != n:
        raise ProfileError(f"expected an array of {n} values (one per token count)", field=f"{where}.{key}")
    # Fast path (a table has thousands of curves; this is most of a cold lookup): only
    # numbers (type(), not isinstance: bools are ints), all in range, and a finite sum (so
    # no NaN among them: min and max skip it).
    types = set(map(type, raw))
    if types <= _NUMBER_TYPES:
        if min(raw) >= MIN_US and max(raw) <= MAX_US and sum(raw) < _INF:
            return tuple(raw), True
    elif types <= _NUMBER_OR_NONE:
        values = [v for v in raw if v is not None]
        if not values or (min(values) >= MIN_US and max(values) <= MAX_US and sum(values) < _INF):
            return tuple(raw), False
    for j, v in enumerate(raw):
        if v is not None and not _is_us(v):
            raise ProfileError(_us_problem(v), field=f"{where}.{key}[{j}]")
    raise ProfileError("not a positive finite number", field=f"{where}.{key}")  # unreachable


def _counts(raw, n: int, where: str, key: str) -> tuple:
    """A schema-3 count figure ``where.key``: an array of n values, each null or a finite number >= 0."""
    if type(raw) is not list or len(raw) != n:
        raise ProfileError(f"expected an array of {n} values (one per token count)", field=f"{where}.{key}")
    values = [v for v in raw if v is not None]
    if set(map(type, values)) <= _NUMBER_TYPES and all(0 <= v <= MAX_FIGURE for v in values):
        return tuple(raw)
    j = next(j for j, v in enumerate(raw) if v is not None and not (_is_num(v) and 0 <= v <= MAX_FIGURE))
    v, field = raw[j], f"{where}.{key}[{j}]"
    if _is_num(v) and v > MAX_FIGURE:  # finite, but sums and budgets of it would overflow
        shown = f"an integer of {len(str(v))} digits" if type(v) is int else f"{v:g}"
        raise ProfileError(f"{shown} is over the largest figure a table may hold ({MAX_FIGURE:.3g})", field=field)
    raise ProfileError(f"expected a finite number >= 0 or null, got {one_line(v, 40)}", field=field)


def _lenient_curve(raw, n: int) -> tuple:
    """Schema 1 p10/p90 (never checked by schema-1 readers): valid values or None."""
    if not isinstance(raw, list) or len(raw) != n:
        return (None,) * n
    return tuple(v if _is_us(v) else None for v in raw)


# ------------------------------------------------------------------------------ parse


def parse_profile(data, path: str | None = None, *, notes: list | None = None) -> Profile:
    """Validate decoded profile JSON (schema 1, 2 or 3) -> :class:`Profile`.

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
    top = _obj(data, "top level")
    if "schema" not in top:
        raise ProfileError("missing", field="schema")
    schema = top["schema"]
    if type(schema) is not int or schema not in READABLE_SCHEMAS:
        raise ProfileError(
            f"unsupported version {schema!r} (this a2a-tune reads schemas "
            f"{', '.join(map(str, READABLE_SCHEMAS))}; regenerate the table with `a2a-tune select`)",
            field="schema",
        )
    hw = _obj(top.get("hardware"), "hardware")
    fp = hw.get("fingerprint")
    if not isinstance(fp, str):
        raise ProfileError(f"expected a string, got {_jtype(fp)}", field="hardware.fingerprint")
    try:
        fp = normalize_fingerprint(fp)
    except ValueError as exc:
        raise ProfileError(str(exc), field="hardware.fingerprint") from None
    run = top.get("run")
    capacity = run.get("capacity") if isinstance(run, dict) else None
    if capacity is not None:
        _count(capacity, "run.capacity")

    backends = {}
    for name, spec in _obj(top.get("backends"), "backends").items():
        where = f"backends.{name}"
        spec = _obj(spec, where)
        backends[name] = BackendNames(
            _opt_str(spec.get("vllm_name"), f"{where}.vllm_name"),
            _opt_str(spec.get("sglang_name"), f"{where}.sglang_name"),
            _opt_str(spec.get("trtllm_name"), f"{where}.trtllm_name"),
            _engine_options(spec.get("engine_options"), f"{where}.engine_options"),
        )

    if schema == 1:
        timing = _v1_timing(top.get("run"))
        preference = _default_preference(backends)
    else:
        timing = None
        preference = _preference(top.get("tie_preference"), backends)

    raw_entries = top.get("entries")
    if not isinstance(raw_entries, list):
        raise ProfileError(f"expected an array, got {_jtype(raw_entries)}", field="entries")
    if not raw_entries:
        raise ProfileError("empty table (no entries)", field="entries")

    entries = []
    by_shape = {}
    for i, raw in enumerate(raw_entries):
        entry = _parse_entry(raw, f"entries[{i}]", backends, timing, figures=schema >= 3)
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
    )


def _engine_options(raw, where: str):
    """``engine_options``: absent/null or an object engine -> array of strings (the options an
    engine needs beside the literal, e.g. ``{"sglang": ["--deepep-mode", "low_latency"]}``)."""
    if raw is None:
        return _NO_OPTIONS
    out = {}
    for engine, opts in _obj(raw, where).items():
        if not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
            raise ProfileError(f"expected an array of strings, got {_jtype(opts)}", field=f"{where}.{engine}")
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
        raise ProfileError(f"expected an array of backend names, got {_jtype(raw)}", field="tie_preference")
    seen = set()
    for j, b in enumerate(raw):
        if not isinstance(b, str) or b not in backends:
            raise ProfileError(f"unknown backend {b!r} (not in 'backends')", field=f"tie_preference[{j}]")
        if b in seen:
            raise ProfileError(f"{b!r} listed twice", field=f"tie_preference[{j}]")
        seen.add(b)
    # Backends the list leaves out rank after it, in the 'backends' section's order.
    return tuple(raw) + tuple(b for b in backends if b not in seen)


def _parse_entry(raw, where: str, backends: dict, v1_timing: str | None, *, figures: bool = False) -> ProfileEntry:
    e = _obj(raw, where)
    ints = []
    for key in SHAPE_KEYS[:4]:
        ints.append(_count(e.get(key), f"{where}.{key}", key))
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
        _count(t, f"{where}.tokens[{j}]")
        if j and t <= tokens[j - 1]:
            raise ProfileError("token counts must be strictly ascending", field=f"{where}.tokens[{j}]")
    n = len(tokens)

    medians, p10s, p90s, timings, knobs, extra = {}, {}, {}, {}, {}, {}
    for name, curve in _obj(e.get("backends"), f"{where}.backends").items():
        bwhere = f"{where}.backends.{name}"
        if name not in backends:
            raise ProfileError("backend not declared in the top-level 'backends'", field=bwhere)
        curve = _obj(curve, bwhere)
        med, med_complete = _curve(curve.get("median_us"), n, bwhere, "median_us")
        if v1_timing is not None:
            timings[name] = v1_timing
            lo, hi = _lenient_curve(curve.get("p10_us"), n), _lenient_curve(curve.get("p90_us"), n)
        else:
            mode = curve.get("timing")
            if mode not in TIMING_MODES:
                raise ProfileError(
                    f"expected one of {', '.join(map(repr, TIMING_MODES))}, got {mode!r}", field=f"{bwhere}.timing"
                )
            timings[name] = mode
            lo, lo_complete = _curve(curve.get("p10_us"), n, bwhere, "p10_us")
            hi, hi_complete = _curve(curve.get("p90_us"), n, bwhere, "p90_us")
            # map(le) runs in C: this check is per point of every curve.
            if not (med_complete and lo_complete and hi_complete and all(map(_le, lo, med)) and all(map(_le, med, hi))):
                for j, (a, m, b) in enumerate(zip(lo, med, hi)):
                    if m is not None and ((a is not None and a > m) or (b is not None and b < m)):
                        raise ProfileError(
                            f"median {m} outside its p10..p90 spread [{a}, {b}]", field=f"{bwhere}.median_us[{j}]"
                        )
        medians[name], p10s[name], p90s[name] = med, lo, hi
        if "knobs" in curve:
            knobs[name] = _knobs(curve["knobs"], n, f"{bwhere}.knobs")
        if figures:
            found = {k: _curve(curve[k], n, bwhere, k)[0] for k in FIGURE_CURVES if k in curve}
            found.update({k: _counts(curve[k], n, bwhere, k) for k in FIGURE_COUNTS if k in curve})
            if found:
                extra[name] = MappingProxyType(found)

    failed = {}
    for name, reason in _obj(e.get("failed", {}), f"{where}.failed").items():
        if not isinstance(reason, str):
            raise ProfileError(f"expected a string reason, got {_jtype(reason)}", field=f"{where}.failed.{name}")
        failed[name] = reason

    _check_winners(e.get("winners", []), where, set(tokens), medians, failed, v1=v1_timing is not None)

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
    )


_KNOB_VALUE_TYPES = (int, float, str, bool)


def _knobs(raw, n: int, where: str) -> tuple:
    """``knobs``: an array of n values, each null or an object of knob name -> scalar."""
    if type(raw) is not list or len(raw) != n:
        raise ProfileError(f"expected an array of {n} values (one per token count)", field=where)
    out = []
    for j, setting in enumerate(raw):
        if setting is None:
            out.append(None)
            continue
        if type(setting) is not dict:
            raise ProfileError(
                f"expected an object of knob settings or null, got {_jtype(setting)}", field=f"{where}[{j}]"
            )
        for k, v in setting.items():
            if not k or type(v) not in _KNOB_VALUE_TYPES or (type(v) is float and not -_INF < v < _INF):
                raise ProfileError(
                    f"knob {k!r}: expected a number, string or boolean, got {_jtype(v)}", field=f"{where}[{j}]"
                )
        out.append(MappingProxyType(dict(setting)))
    return tuple(out)


def _check_winners(winners, where: str, token_set: set, medians: dict, failed: dict, *, v1: bool) -> None:
    """Winners are informational for lookup (it re-derives them from the curves with the
    same rules), but a table whose winners name unknown backends or token counts is
    corrupt: refuse it."""
    if not isinstance(winners, list):
        raise ProfileError(f"expected an array, got {_jtype(winners)}", field=f"{where}.winners")
    live = medians.keys() - failed.keys()
    for j, w in enumerate(winners):
        # Fast path: one expression per winner; the detailed checks below only name the field.
        if type(w) is dict:
            t, b, mu, ru, m = w.get("tokens"), w.get("backend"), w.get("median_us"), w.get("runner_up"), w.get("margin")
            if (
                type(t) is int
                and t in token_set
                and type(b) is str
                and b in live
                and (type(mu) is float or type(mu) is int)
                and MIN_US <= mu <= MAX_US
                and (ru is None or (type(ru) is str and ru in medians))
                and (m is None or ((type(m) is float or type(m) is int) and 0 <= m < _INF))
                and (v1 or (type(w.get("fastest")) is str and w["fastest"] in live and type(w.get("tie")) is bool))
            ):
                continue
        _winner_error(w, f"{where}.winners[{j}]", token_set, medians, failed, v1=v1)


def _winner_error(w, wwhere: str, token_set: set, medians: dict, failed: dict, *, v1: bool) -> None:
    w = _obj(w, wwhere)
    if type(w.get("tokens")) is not int or w.get("tokens") not in token_set:
        raise ProfileError(f"{w.get('tokens')!r} is not one of the entry's token counts", field=f"{wwhere}.tokens")
    for key in ("backend",) if v1 else ("backend", "fastest"):
        b = w.get(key)
        if not isinstance(b, str) or b not in medians:
            raise ProfileError(f"unknown backend {b!r}", field=f"{wwhere}.{key}")
        if b in failed:
            raise ProfileError(f"backend {b!r} is listed in 'failed'", field=f"{wwhere}.{key}")
    if not _is_us(w.get("median_us")):
        raise ProfileError(_us_problem(w.get("median_us")), field=f"{wwhere}.median_us")
    ru = w.get("runner_up")
    if ru is not None and (not isinstance(ru, str) or ru not in medians):
        raise ProfileError(f"unknown backend {ru!r}", field=f"{wwhere}.runner_up")
    margin = w.get("margin")
    if margin is not None and not (_is_num(margin) and margin == margin and 0 <= margin < _INF):
        raise ProfileError("not a finite number >= 0 or null", field=f"{wwhere}.margin")
    if not v1 and not isinstance(w.get("tie"), bool):
        raise ProfileError(f"expected true or false, got {_jtype(w.get('tie'))}", field=f"{wwhere}.tie")
    raise ProfileError("invalid winner", field=wwhere)  # unreachable unless the fast path and these disagree


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
    written = {w["tokens"]: w for w in raw}  # checked by _check_winners
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
