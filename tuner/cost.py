"""What a sweep plan will take on this machine, from what this machine measured before.

A case (one backend at one point) costs a fixed part (the gate, building inputs, storing) and a
part that grows with the data its round trips move: ``overhead + per_element * elements``, with
``elements = tokens per rank x hidden x top-k x (warm-up + timed round trips)``, per payload
dtype (a quantized payload costs more per element to make on CPU). On CPU ranks every rank
shares the host's cores, so a case costs that times the ranks busy at once (the world: every
group of a size runs together); on GPUs a rank has its device. The numbers are fitted (least
squares) to the last run's per-case wall times (the gaps between its stored measurements) and
kept per device type and dtype in ``$XDG_CACHE_HOME/a2a-tune/cost.json``, with the ranks'
start-up (the sweep's time before its second case), per rank on CPU. A dtype not timed here yet
is estimated as the one that was, and the estimate says so; without any run measured here,
:data:`GUESS` stands in, and the estimate says that.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["GUESS", "Cost", "fit", "load", "plan_cases", "remember", "seconds"]


@dataclass(frozen=True)
class Cost:
    """Seconds: per-case `overhead`, `per_element`, ranks' `startup`; CPU: per busy rank."""

    overhead: float
    per_element: float
    startup: float
    source: str  # where the numbers come from, for the estimate's line


#: Stand-ins before any run here. cpu: fitted to a Quick-start run (60 bf16 cases, 28 s) on the
#: 2-core CI machine, 2026-12-07; cuda: the 2xH200 full run (1140 cases in 308 s).
GUESS = {
    "cpu": Cost(overhead=0.13, per_element=2.1e-9, startup=2.1, source="a guess: no run measured here yet"),
    "cuda": Cost(overhead=0.25, per_element=0.0, startup=30.0, source="a guess: no run measured here yet"),
}


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "a2a-tune" / "cost.json"


def plan_cases(plan, rows) -> list[tuple[str, int, int]]:
    """(dtype, elements, cases) of a plan's points (`SweepPlan.cases`), the cases being the
    backends usable at the point's EP size (`rows`: tuner.plans.plan_sizes)."""
    rounds = plan.warmup + plan.iters
    backends = {row.ep_size: row.backends for row in rows}
    return [
        (case.shape.dtype, t * case.shape.hidden * case.shape.topk * rounds, backends[case.ep_size])
        for case in plan.cases()
        for t in case.tokens
    ]


def seconds(costs: dict, cases: Iterable[tuple[str, int, int]], device: str, world: int) -> tuple[float, str]:
    """The plan's estimated wall time (start-up, then every case) and where its numbers come
    from: `costs` maps a dtype to its Cost (:func:`load`)."""
    busy = world if device == "cpu" else 1
    cases = list(cases)
    first = next(iter(costs.values()))
    work, unknown, used = 0.0, [], []
    for dtype, e, n in cases:
        c = costs.get(dtype)
        if c is None:
            c = costs.get("bf16", first)
            unknown += [dtype] if dtype not in unknown else []
        used += [c] if c not in used else []
        work += n * (c.overhead + c.per_element * e)
    used = sorted(used or [first], key=list(costs.values()).index)  # the most recent first
    total = max(c.startup for c in used) * busy + work * busy
    source = used[0].source + (f"; {', '.join(unknown)} not timed here yet" if unknown else "")
    return total, source


def fit(times: Sequence[tuple], rounds: int, device: str, world: int, wall: float | None) -> dict:
    """The cost model fitted to one run, per dtype: `times` (the store's case_times), round
    trips per case, its device and world, the sweep's wall seconds (for the start-up)."""
    if len(times) < 2:
        return {}
    busy = world if device == "cpu" else 1
    span = (times[-1][5] - times[0][5]).total_seconds()  # start-up: all before the second case
    startup = max((wall - span) / busy, 0.0) if wall is not None else GUESS[device].startup
    source = f"from {len(times)} cases timed here {times[-1][5]:%Y-%m-%d %H:%M} UTC"
    per_dtype: dict = {}
    for (*_, last), (tokens, hidden, topk, _, dtype, at) in zip(times, times[1:]):
        x, y = tokens * hidden * topk * rounds, max((at - last).total_seconds(), 0.0) / busy
        per_dtype.setdefault(dtype, []).append((x, y))
    out = {}
    for dtype, points in per_dtype.items():
        xs, ys = [x for x, _ in points], [y for _, y in points]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = max(sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0, 0.0)
        out[dtype] = Cost(max(my - slope * mx, 0.0), slope, startup, source)
    return out


def remember(device: str, costs: dict) -> None:
    """Keep `costs` (dtype -> Cost) for `device`, over what was kept for those dtypes
    (atomically; a cache: a failure to write is ignored)."""
    path = _cache_file()
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
        data = data if isinstance(data, dict) else {}
        kept = data.get(device) if isinstance(data.get(device), dict) else {}
        data[device] = {**kept, **{dtype: asdict(c) for dtype, c in costs.items()}}
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(data, f, indent=2)
        os.replace(f.name, path)
    except (OSError, ValueError):
        pass


def load(device: str) -> dict:
    """dtype -> Cost kept for `device`, the most recent first; else {"bf16": GUESS[device]}."""
    try:
        kept = json.loads(_cache_file().read_text())[device]
        costs = {
            dtype: Cost(**{k: c[k] for k in ("overhead", "per_element", "startup", "source")})
            for dtype, c in kept.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {"bf16": GUESS[device]}
    if not costs:
        return {"bf16": GUESS[device]}
    return dict(sorted(costs.items(), key=lambda kv: kv[1].source[-20:], reverse=True))
