"""A backend's expected time over the token counts an engine will see, and the tie rule.

Standard library only (the runtime lookup imports it); :mod:`a2a_tune.tuner.select` uses
the same :func:`decide` for the winners it writes, so a table's winner at a measured token
count is exactly what lookup answers there.

**Curve between measurements.** A backend's curve (median, p10 or p90 µs per token count
per rank) is interpolated piecewise-linearly in log(tokens)-log(µs), i.e. as a power law
between the two measured token counts that bracket the request; below the first / above
the last measured count the end value is used (clamped). A backend competes only where
the points it needs were measured for it: both bracketing points, the point itself when
the request is on the grid, the end point when clamped. (Over a range, lookup also compares,
but never chooses, a backend whose missing counts lie between measured ones: :func:`bridge_gaps`.)

Design notes: docs/architecture.md, "Module notes", `tuner/runtime/estimate.py`.
"""

from __future__ import annotations

import bisect
import math
from collections import namedtuple

__all__ = [
    "MARGIN_DECIMALS",
    "TIE_MAX_MARGIN",
    "US_DECIMALS",
    "Winner",
    "bridge_gaps",
    "decide",
    "expected",
    "where_text",
    "winners",
]

#: A tie never spans more than this fraction above the fastest median (see the tie rule).
TIE_MAX_MARGIN = 0.03
#: Decimals of a time in µs that a table stores and the tie rule compares (1 ns).
US_DECIMALS = 3
#: Decimals of a winner's margin.
MARGIN_DECIMALS = 4


def _point_plan(grid: tuple, t: int):
    """How a curve yields its value at t: (j, None, 0.0) for one grid point, else
    (j0, j1, f) with value = v0 * (v1 / v0) ** f."""
    n = len(grid)
    if t <= grid[0]:
        return 0, None, 0.0
    if t >= grid[-1]:
        return n - 1, None, 0.0
    hi = bisect.bisect_left(grid, t)
    if grid[hi] == t:
        return hi, None, 0.0
    lo = hi - 1
    return lo, hi, math.log(t / grid[lo]) / math.log(grid[hi] / grid[lo])


def _at(curve: tuple, plan):
    j0, j1, f = plan
    v0 = curve[j0]
    if j1 is None or v0 is None:
        return v0
    v1 = curve[j1]
    if v1 is None:
        return None
    return math.exp(math.log(v0) + f * (math.log(v1) - math.log(v0)))


def _power_integral(v0: float, slope: float, u0: float, a: float, b: float) -> float:
    """∫_a^b v0 · exp(slope · (u - u0)) du (a power law in t = e^u)."""
    if abs(slope) < 1e-12:
        return v0 * (b - a)
    return v0 * (math.exp(slope * (b - u0)) - math.exp(slope * (a - u0))) / slope


def _log_uniform_mean(grid: tuple, curve: tuple, a: float, b: float):
    """Mean of the log-log interpolant over u = ln t uniform on [ln a, ln b]; None if a
    needed point is missing."""
    ua, ub = math.log(a), math.log(b)
    us = [math.log(g) for g in grid]
    total = 0.0
    # Clamped below the first measured point.
    if ua < us[0]:
        if curve[0] is None:
            return None
        total += curve[0] * (min(ub, us[0]) - ua)
    # Power-law segments between measured points.
    for i in range(len(grid) - 1):
        lo, hi = max(ua, us[i]), min(ub, us[i + 1])
        if lo >= hi:
            continue
        v0, v1 = curve[i], curve[i + 1]
        if v0 is None or v1 is None:
            return None
        slope = (math.log(v1) - math.log(v0)) / (us[i + 1] - us[i])
        total += _power_integral(v0, slope, us[i], lo, hi)
    # Clamped above the last measured point.
    if ub > us[-1]:
        if curve[-1] is None:
            return None
        total += curve[-1] * (ub - max(ua, us[-1]))
    return total / (ub - ua)


def expected(grid: tuple, curves, dist) -> dict:
    """{backend: expected value} over ``dist`` for every curve that competes (see above)."""
    kind = dist[0]
    out = {}
    if kind == "point" or (kind == "log-uniform" and dist[1] >= dist[2]):
        plan = _point_plan(grid, dist[1])
        for b, curve in curves.items():
            v = _at(curve, plan)
            if v is not None:
                out[b] = v
    elif kind == "log-uniform":
        for b, curve in curves.items():
            v = _log_uniform_mean(grid, curve, dist[1], dist[2])
            if v is not None:
                out[b] = v
    elif kind == "discrete":
        plans = [(_point_plan(grid, t), w) for t, w in dist[1]]
        for b, curve in curves.items():
            total = 0.0
            for plan, w in plans:
                v = _at(curve, plan)
                if v is None:
                    break
                total += w * v
            else:
                out[b] = total
    else:
        raise ValueError(f"unknown distribution {kind!r}")
    return out


def bridge_gaps(grid: tuple, curve: tuple):
    """``curve`` with each missing value between two measured ones filled in by the
    log-log interpolant of those two; None when it has no such gap. (Missing values before
    the first or after the last measured one stay missing.)"""
    known = [j for j, v in enumerate(curve) if v is not None]
    if not any(b - a > 1 for a, b in zip(known, known[1:])):
        return None
    out = list(curve)
    for a, b in zip(known, known[1:]):
        for j in range(a + 1, b):
            out[j] = _at(curve, (a, b, math.log(grid[j] / grid[a]) / math.log(grid[b] / grid[a])))
    return tuple(out)


def _count(n: int) -> str:
    """A token count for a message: as is, or its power of two when it is huge (a workload or
    an engine may pass any integer; thousands of digits are no use in a line)."""
    return str(n) if n.bit_length() <= 64 else f"~2^{n.bit_length() - 1}"


def where_text(grid: tuple, dist) -> str:
    """One phrase saying which token counts the answer is for, and how the table covers them."""
    kind = dist[0]
    if kind == "point" or (kind == "log-uniform" and dist[1] >= dist[2]):
        t = dist[1]
        j0, j1, _ = _point_plan(grid, t)
        if j1 is not None:
            return f"interpolated at {_count(t)} tokens/rank between {grid[j0]} and {grid[j1]}"
        if grid[j0] == t:
            return f"at {t} tokens/rank (measured)"
        return f"clamped to {grid[j0]} tokens/rank (requested {_count(t)})"
    lo, hi = (dist[1], dist[2]) if kind == "log-uniform" else (dist[1][0][0], dist[1][-1][0])
    text = (
        f"tokens/rank {_count(lo)}..{_count(hi)} log-uniform"
        if kind == "log-uniform"
        else f"workload of {len(dist[1])} token counts {_count(lo)}..{_count(hi)} tokens/rank"
    )
    if lo < grid[0] or hi > grid[-1]:
        text += f" (measured {grid[0]}..{grid[-1]}; clamped outside)"
    return text


def decide(medians: dict, p10: dict, p90: dict, preference) -> tuple:
    """(chosen, fastest, tied) by the tie rule (module docstring).

    ``medians``: backend -> expected median (competing backends only, > 0);
    ``p10`` / ``p90``: backend -> expected spread bound or None; ``preference``: backends,
    most preferred first (others rank after them, by name). ``tied`` lists the fastest and
    every backend inside its spread, fastest first.
    """
    ranked = sorted(medians.items(), key=lambda kv: (kv[1], kv[0]))
    fastest, m = ranked[0]
    lo = p10.get(fastest)
    hi = p90.get(fastest)
    lo = m if lo is None or lo > m else lo
    hi = m if hi is None or hi < m else min(hi, m * (1 + TIE_MAX_MARGIN))
    tied = tuple(b for b, v in ranked if lo <= v <= hi)
    if len(tied) == 1:
        return fastest, fastest, tied
    rank = {b: i for i, b in enumerate(preference)}
    chosen = min(tied, key=lambda b: (rank.get(b, len(rank)), b))
    return chosen, fastest, tied


class Winner(namedtuple("Winner", "tokens backend median_us fastest runner_up margin tie")):
    """The winner at one token count: ``backend`` (chosen by the tie rule) and its median,
    the ``fastest`` backend, the ``runner_up`` after it (None: nothing else competed),
    ``margin`` = runner-up / fastest - 1 (None likewise) and ``tie`` (the fastest's spread
    held another backend, so ``tie_preference`` chose)."""

    __slots__ = ()

    @property
    def other(self):
        """The backend the winner was chosen over: the fastest when a tie gave the win to a
        preferred backend, else the runner-up."""
        return self.fastest if self.fastest != self.backend else self.runner_up


def winners(tokens, median_us, p10_us, p90_us, failed, preference) -> list:
    """[:class:`Winner`] per token count where a backend competes (module docstring).

    ``median_us`` / ``p10_us`` / ``p90_us``: backend -> values aligned with ``tokens`` (None:
    not measured there); ``failed``: backends never chosen; ``preference``: as for :func:`decide`.
    """
    out = []
    for j, t in enumerate(tokens):
        medians = {
            b: round(curve[j], US_DECIMALS)
            for b, curve in median_us.items()
            if b not in failed and curve[j] is not None
        }
        if not medians:
            continue
        chosen, fastest, tied = decide(
            medians,
            {b: p10_us[b][j] for b in medians},
            {b: p90_us[b][j] for b in medians},
            preference,
        )
        runner_up = min(((v, b) for b, v in medians.items() if b != fastest), default=(None, None))[1]
        margin = round(medians[runner_up] / medians[fastest] - 1, MARGIN_DECIMALS) if runner_up else None
        out.append(Winner(t, chosen, medians[chosen], fastest, runner_up, margin, len(tied) > 1))
    return out
