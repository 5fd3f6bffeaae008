"""How good is a table? Measure held-out points and compare the table's choice with the best.

Held-out points: token counts between the table's (geometric midpoints) for its shapes. Each
is measured for every backend by the ordinary sweep (correctness gate included), then:
regret(point) = time of the backend the lookup picks / time of the fastest there - 1, and the
same for two fixed policies: always `allgather_reducescatter` (the engines' default) and
always the single backend that is fastest over all the points. Beside them, each engine's
own rule (vLLM's default and its proposed GB200/GB300 one, TensorRT-LLM's priority list,
SGLang's default) against the table's answer for that engine (:mod:`a2a_tune.tuner.policies`).

The points are a stored run's measurements, or the table's own (:func:`table_measurements`):
every backend's median at each token count it holds (in-sample for the table, not for the
engines' rules).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .runtime.lookup import FALLBACK_BACKEND, load_profile, lookup
from .runtime.point import POINT_FIELDS, Point
from .runtime.table import Profile
from .shapes import ModelShape

HELD_OUT_MOST = 8  # default held-out counts (their cost: BENCHMARKS.md, "Figures moved from the code")


def held_out_tokens(table_tokens: Iterable[int], most: int | None = HELD_OUT_MOST) -> tuple[int, ...]:
    """Geometric midpoints between consecutive token counts of the table (not on its grid).

    At most `most` of them (None: all), spread evenly over the range with both ends kept: a
    28-count grid has 23 midpoints, and every one costs a measurement per backend and shape."""
    ts = sorted(set(table_tokens))
    mids = sorted({round(math.sqrt(a * b)) for a, b in zip(ts, ts[1:])} - set(ts))
    if most is None or len(mids) <= most:
        return tuple(mids)
    if most <= 1:
        return tuple(mids[:most])
    return tuple(sorted({mids[round(i * (len(mids) - 1) / (most - 1))] for i in range(most)}))


class EvaluationError(ValueError):
    """A table and options that give nothing to measure (one line)."""


def held_out_plan(
    table: Profile,
    path: Path,
    *,
    device: str,
    world: int,
    tokens: tuple[int, ...] | None = None,
    backends: tuple[str, ...] = (),
    warmup: int | None = None,
    iters: int | None = None,
    capacity: int | None = None,
):
    """The sweep plan that measures the table's shapes at each of its EP sizes that `world`
    ranks hold (:func:`sizes_measurable`: each on groups of consecutive ranks) at `tokens`
    (None: :func:`held_out_tokens` of the table's token counts at those sizes). The backends
    default to every one, and warm-up and iterations to the sweep's for `device`. Without
    `capacity`, the table's ``run.capacity`` applies, so the points are measured as the
    table's own were. Raises :class:`EvaluationError`."""
    from .plans import DEFAULT_ITERS, PlanError, SweepPlan, check_capacity

    sizes, left_out = sizes_measurable(table, world)
    if not sizes:
        raise EvaluationError(
            f"{path} has no entries for an EP size {world} ranks hold (its sizes: {', '.join(map(str, left_out))})"
        )
    entries = [e for e in table.entries if e.shape.ep_size in sizes]
    here = [e.shape for e in entries]
    shapes = {ModelShape.of(s) for s in here}
    held = tokens or held_out_tokens(t for e in entries for t in e.tokens)
    if not held:
        raise EvaluationError(f"{path.name}: its token counts leave no held-out midpoint; give --tokens")
    try:
        capacity = check_capacity(capacity, held, table.capacity)  # measured as the table's own points
    except PlanError as exc:
        raise EvaluationError(str(exc)) from None
    default_warmup, default_iters = DEFAULT_ITERS[device]
    return SweepPlan(
        shapes=tuple(sorted(shapes, key=lambda s: s.name)),
        tokens=held,
        dtypes=tuple(sorted({s.dtype for s in here})),
        routings=tuple(sorted({s.routing for s in here})),
        backends=tuple(backends),
        warmup=default_warmup if warmup is None else warmup,
        iters=default_iters if iters is None else iters,
        capacity=capacity,
        ep_sizes=sizes,
    )


def sizes_measurable(table: Profile, world: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the table's EP sizes that `world` ranks hold: each divides it, so its groups tile the
    ranks; the table's other sizes), each ascending: what an evaluation on `world` ranks scores,
    and what it leaves out (said, never silently)."""
    table_sizes = sorted({e.shape.ep_size for e in table.entries})
    held = tuple(s for s in table_sizes if s <= world and world % s == 0)
    return held, tuple(s for s in table_sizes if s not in held)


def left_out_note(sizes: tuple[int, ...], world: int) -> str:
    """The line an evaluation on `world` ranks says of the table's EP `sizes` it does not score."""
    where = ", ".join(f"EP {s}" for s in sizes)
    return f"not scored: the table's {where} entries (sizes that do not divide the {world} ranks here)"


@dataclass
class Evaluation:
    points: list[dict[str, Any]] = field(default_factory=list)  # one per (shape, tokens)
    policies: dict[str, dict[str, float]] = field(default_factory=dict)  # policy -> mean/worst regret
    # policy -> points where its backend was not measured (a run of a subset of the backends):
    # left out of its mean and worst, and said so, never silently
    unscored: dict[str, int] = field(default_factory=dict)
    # policy -> points where its backend failed (error, timeout, wrong result): no time, and
    # worse than any regret; counted apart
    failed: dict[str, int] = field(default_factory=dict)
    outside: int = 0  # measured points of shapes the table has no entry for: not scored
    engines: list = field(default_factory=list)  # [policies.PolicyScore]: each engine's rule vs the table
    notes: list = field(default_factory=list)  # what a reader must know to read the scores, one line each

    def summary(self) -> dict[str, dict[str, float]]:
        return self.policies

    def worst(self, n: int = 5) -> list[dict[str, Any]]:
        """The n points where the table's pick cost most (regret > 0), worst first."""
        return sorted((p for p in self.points if p.get("table")), key=lambda p: -p["table"])[:n]


def _point(r) -> Point:
    """The point of a measurement or failure record (its shape is a table entry's)."""
    return Point(*(getattr(r, k) for k in POINT_FIELDS))


def table_measurements(profile: str) -> list:
    """The table's own points as measurement records (shape keys, tokens_per_rank, backend,
    median_us): every backend's median at each token count, failed backends left out."""
    from types import SimpleNamespace

    out = []
    for e in load_profile(profile).entries:
        for b, curve in e.median_us.items():
            if b in e.failed:
                continue
            for t, v in zip(e.tokens, curve):
                if v is not None:
                    out.append(SimpleNamespace(**e.shape.at(t)._asdict(), backend=b, median_us=v))
    return out


def evaluate(measurements: Iterable[Any], profile: str, failures: Iterable[Any] = ()) -> Evaluation:
    """Regret of the table `profile` on measured points (store measurement and failure records).

    Only points of shapes the table has an entry for are scored (a lookup elsewhere answers
    a nearest shape or the fallback: not the table's own choice); the others are counted.
    Raises :class:`~a2a_tune.tuner.runtime.table.ProfileError` for a table the lookup refuses."""
    shapes = set(load_profile(profile).by_shape)
    ev = Evaluation()
    by_point: dict[Point, dict[str, float]] = {}
    for m in measurements:
        if isinstance(m.median_us, (int, float)) and 0 < m.median_us < math.inf:  # never a ratio over 0
            by_point.setdefault(_point(m), {})[m.backend] = m.median_us
    for point in [p for p in by_point if p.shape not in shapes]:
        del by_point[point]
        ev.outside += 1
    broken = {(f.backend, _point(f)) for f in failures if f.kind in ("error", "timeout", "crashed", "incorrect")}
    totals: dict[str, float] = {}
    for times in by_point.values():
        for b, t in times.items():
            totals[b] = totals.get(b, 0.0) + t
    complete = [b for b in totals if all(b in t for t in by_point.values())]
    best_single = min(complete, key=totals.get) if complete else None
    for point, times in sorted(by_point.items()):
        best = min(times.values())
        choice = lookup(**point.shape._asdict(), tokens=point.tokens_per_rank, profile=profile, quiet=True)
        picked = {"table": choice.backend, f"always {FALLBACK_BACKEND}": FALLBACK_BACKEND}
        if best_single:
            picked[f"always {best_single}"] = best_single
        row = {
            "shape": point.shape,
            "tokens": point.tokens_per_rank,
            "best": min(times, key=times.get),
        }
        for policy, backend in picked.items():
            t = times.get(backend)
            if t is None and (backend, point) in broken:
                ev.failed[policy] = ev.failed.get(policy, 0) + 1
            row[policy] = (t / best - 1) if t is not None else None  # None: no time here
        row["table_backend"] = choice.backend
        ev.points.append(row)
    for policy in ev.points[0].keys() - {"shape", "tokens", "best", "table_backend"} if ev.points else ():
        regrets = [p[policy] for p in ev.points if p.get(policy) is not None]
        missing = len(ev.points) - len(regrets) - ev.failed.get(policy, 0)
        if missing:
            ev.unscored[policy] = missing
        if regrets:
            ev.policies[policy] = {"mean": sum(regrets) / len(regrets), "worst": max(regrets), "points": len(regrets)}
    from .policies import registry_names

    names = registry_names()  # the registered backends' engine names: the scores and the note read them
    ev.engines = _engine_scores(by_point, profile, names)
    if f"always {FALLBACK_BACKEND}" in ev.policies and (why := _default_note(profile, by_point, names)):
        ev.notes.append(why)
    return ev


def _default_note(profile: str, by_point: dict, registered: dict) -> str | None:
    """Why "always allgather_reducescatter" and the engines' default (below it) score apart:
    the engines' literal runs more than that one backend of ours (vLLM's allgather_reducescatter:
    our eager backend and its padded, graph-captured twin), and a policy is given the fastest.
    Only backends measured at these points are named: the score never saw the others."""
    names = {**registered, **load_profile(profile).backends}
    measured = {b for times in by_point.values() for b in times}
    mine = names.get(FALLBACK_BACKEND)
    literal = mine.literal("vllm") if mine is not None else None
    twins = sorted(
        b
        for b, n in names.items()
        if b != FALLBACK_BACKEND and b in measured and literal and n.literal("vllm") == literal
    )
    if not twins:
        return None
    return (
        f"always {FALLBACK_BACKEND}: that backend of ours alone; the engines' defaults below run "
        f"vLLM's {literal!r}, scored as the faster of {', '.join([FALLBACK_BACKEND, *twins])} at each point"
    )


def _engine_scores(by_point: dict, profile: str, names: dict) -> list:
    from .policies import Point, score_table

    points = [Point(point[:6], point[6], times) for point, times in sorted(by_point.items())]
    return score_table(profile, points, names=names)
