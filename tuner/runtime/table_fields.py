"""How each field of a selection table is checked: the small, fast checks
:mod:`a2a_tune.tuner.runtime.table` builds its reader from, and :class:`ProfileError`, the one
line every refusal is.

Standard library only. Every time is a number of µs in [:data:`MIN_US`, :data:`MAX_US`], every
count inside the point's bounds (module docstring of :mod:`~a2a_tune.tuner.runtime.table`). The
fast paths (``type()``, ``map``, ``min``/``max``) run once per curve of every table an engine
loads; the slow paths only name the field.
"""

from __future__ import annotations

from types import MappingProxyType

from a2a_tune.tuner.runtime import point
from a2a_tune.tuner.runtime.estimate import US_DECIMALS
from a2a_tune.tuner.runtime.point import PointError, check_count
from a2a_tune.tuner.runtime.text import one_line

#: The range of a time a table may hold, in µs: 1 ns (the stored resolution) to 1000 s.
MIN_US = 10.0**-US_DECIMALS
MAX_US = 1e9
#: The largest value of each count a table holds: the point's bounds.
_COUNT_BOUNDS = {
    "ep_size": point.MAX_EP_SIZE,
    "hidden": point.MAX_HIDDEN,
    "topk": point.MAX_TOPK,
    "num_experts": point.MAX_EXPERTS,
    "tokens": point.MAX_TOKENS_PER_RANK,
}

INF = float("inf")
#: The largest count figure a table may hold (bytes, MiB): 2**63, so sums and comparisons of
#: a few of them stay finite floats.
MAX_FIGURE = float(2**63)
_NUMBER_TYPES = frozenset({float, int})
_NUMBER_OR_NONE = frozenset({float, int, type(None)})


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


# ----------------------------------------------------------------------- small checks


def is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_us(v) -> bool:
    """A time a table may hold (NaN fails both comparisons)."""
    return (type(v) is float or type(v) is int) and MIN_US <= v <= MAX_US


def count_at(v, field: str, kind: str = "tokens") -> int:
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


def us_problem(v) -> str:
    if (type(v) is float or type(v) is int) and 0 < v < INF:
        return f"{v!r} us is outside the range a table may hold ({MIN_US:g}..{MAX_US:g} us)"
    return "not a positive finite number"


def jtype(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, str):
        return "string"
    if is_num(v):
        return "number"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def obj_at(v, where: str) -> dict:
    if not isinstance(v, dict):
        raise ProfileError(f"expected a JSON object, got {jtype(v)}", field=where)
    return v


def opt_str(v, where: str):
    if v is not None and not isinstance(v, str):
        raise ProfileError(f"expected a string or null, got {jtype(v)}", field=where)
    return v


def curve_at(raw, n: int, where: str, key: str) -> tuple:
    """A strict curve ``where.key``: an array of n values, each null or a time in range
    -> (the values as a tuple, True if none of them is null)."""
    if type(raw) is not list or len(raw) != n:
        raise ProfileError(f"expected an array of {n} values (one per token count)", field=f"{where}.{key}")
    # Fast path (a table has thousands of curves; this is most of a cold lookup): only
    # numbers (type(), not isinstance: bools are ints), all in range, and a finite sum (so
    # no NaN among them: min and max skip it).
    types = set(map(type, raw))
    if types <= _NUMBER_TYPES:
        if min(raw) >= MIN_US and max(raw) <= MAX_US and sum(raw) < INF:
            return tuple(raw), True
    elif types <= _NUMBER_OR_NONE:
        values = [v for v in raw if v is not None]
        if not values or (min(values) >= MIN_US and max(values) <= MAX_US and sum(values) < INF):
            return tuple(raw), False
    for j, v in enumerate(raw):
        if v is not None and not is_us(v):
            raise ProfileError(us_problem(v), field=f"{where}.{key}[{j}]")
    raise ProfileError("not a positive finite number", field=f"{where}.{key}")  # unreachable


def counts_at(raw, n: int, where: str, key: str) -> tuple:
    """A schema-3 count figure ``where.key``: an array of n values, each null or a finite number >= 0."""
    if type(raw) is not list or len(raw) != n:
        raise ProfileError(f"expected an array of {n} values (one per token count)", field=f"{where}.{key}")
    values = [v for v in raw if v is not None]
    if set(map(type, values)) <= _NUMBER_TYPES and all(0 <= v <= MAX_FIGURE for v in values):
        return tuple(raw)
    j = next(j for j, v in enumerate(raw) if v is not None and not (is_num(v) and 0 <= v <= MAX_FIGURE))
    v, field = raw[j], f"{where}.{key}[{j}]"
    if is_num(v) and v > MAX_FIGURE:  # finite, but sums and budgets of it would overflow
        shown = f"an integer of {len(str(v))} digits" if type(v) is int else f"{v:g}"
        raise ProfileError(f"{shown} is over the largest figure a table may hold ({MAX_FIGURE:.3g})", field=field)
    raise ProfileError(f"expected a finite number >= 0 or null, got {one_line(v, 40)}", field=field)


def lenient_curve(raw, n: int) -> tuple:
    """Schema 1 p10/p90 (never checked by schema-1 readers): valid values or None."""
    if not isinstance(raw, list) or len(raw) != n:
        return (None,) * n
    return tuple(v if is_us(v) else None for v in raw)


_KNOB_VALUE_TYPES = (int, float, str, bool)


def knobs_at(raw, n: int, where: str) -> tuple:
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
                f"expected an object of knob settings or null, got {jtype(setting)}", field=f"{where}[{j}]"
            )
        for k, v in setting.items():
            if not k or type(v) not in _KNOB_VALUE_TYPES or (type(v) is float and not -INF < v < INF):
                raise ProfileError(
                    f"knob {k!r}: expected a number, string or boolean, got {jtype(v)}", field=f"{where}[{j}]"
                )
        out.append(MappingProxyType(dict(setting)))
    return tuple(out)


def check_winners(winners, where: str, token_set: set, medians: dict, failed: dict, *, v1: bool) -> None:
    """Winners are informational for lookup (it re-derives them from the curves with the
    same rules), but a table whose winners name unknown backends or token counts is
    corrupt: refuse it."""
    if not isinstance(winners, list):
        raise ProfileError(f"expected an array, got {jtype(winners)}", field=f"{where}.winners")
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
                and (m is None or ((type(m) is float or type(m) is int) and 0 <= m < INF))
                and (v1 or (type(w.get("fastest")) is str and w["fastest"] in live and type(w.get("tie")) is bool))
            ):
                continue
        _winner_error(w, f"{where}.winners[{j}]", token_set, medians, failed, v1=v1)


def _winner_error(w, wwhere: str, token_set: set, medians: dict, failed: dict, *, v1: bool) -> None:
    w = obj_at(w, wwhere)
    if type(w.get("tokens")) is not int or w.get("tokens") not in token_set:
        raise ProfileError(f"{w.get('tokens')!r} is not one of the entry's token counts", field=f"{wwhere}.tokens")
    for key in ("backend",) if v1 else ("backend", "fastest"):
        b = w.get(key)
        if not isinstance(b, str) or b not in medians:
            raise ProfileError(f"unknown backend {b!r}", field=f"{wwhere}.{key}")
        if b in failed:
            raise ProfileError(f"backend {b!r} is listed in 'failed'", field=f"{wwhere}.{key}")
    if not is_us(w.get("median_us")):
        raise ProfileError(us_problem(w.get("median_us")), field=f"{wwhere}.median_us")
    ru = w.get("runner_up")
    if ru is not None and (not isinstance(ru, str) or ru not in medians):
        raise ProfileError(f"unknown backend {ru!r}", field=f"{wwhere}.runner_up")
    margin = w.get("margin")
    if margin is not None and not (is_num(margin) and margin == margin and 0 <= margin < INF):
        raise ProfileError("not a finite number >= 0 or null", field=f"{wwhere}.margin")
    if not v1 and not isinstance(w.get("tie"), bool):
        raise ProfileError(f"expected true or false, got {jtype(w.get('tie'))}", field=f"{wwhere}.tie")
    raise ProfileError("invalid winner", field=wwhere)  # unreachable unless the fast path and these disagree
