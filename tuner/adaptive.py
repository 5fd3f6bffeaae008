"""Adaptive token search: find where the backends' ranking changes with few measurements.

Instead of timing every backend at every token count of the grid, measure a coarse subset
(every 6th grid count, both ends included), then bisect (over grid indices) every interval
whose two ends have different winners -- or, with refinement on, whose top two are close at
both ends (below) -- until the change is pinned between neighbouring grid counts. Backends
clearly beaten are dropped early: the two ends of the grid are measured first, and a
backend that took at least `drop_factor` × the best time at both ends is not measured in
between (a backend's cost is close to latency + bytes / bandwidth, so its ratio to another
backend moves monotonically with the token count); inside an interval, only backends within
`keep_within` × the best at one of its ends are measured. Their curves keep
gaps there, and the lookup never picks a backend where it has none. The risk: a winner
change that reverses inside one coarse interval is missed; the race rule below bounds it
for close races, and the `evaluate` command measures held-out points to bound the rest.

Pure logic: the caller measures. `next_points()` says which cases (token count, backend) to
measure next; `observe()` takes the medians back. All ranks run the same search on the
same (all-reduced) numbers, so they take the same decisions without talking.

Design notes: docs/architecture.md, "Module notes", `tuner/adaptive.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .runtime.estimate import TIE_MAX_MARGIN

#: Default ``refine_ratio`` of GPU sweeps: stop splitting a crossover once its ends are <= 20% apart.
REFINE_RATIO = 1.2


@dataclass
class AdaptiveSearch:
    grid: tuple[int, ...]  # ascending token counts the full sweep would measure
    backends: tuple[str, ...]
    keep_within: float = 1.3
    drop_factor: float = 1.5
    coarse_step: int = 6
    refine_ratio: float | None = None  # split neighbouring grid counts (off-grid counts) while hi/lo > this
    # ... or whose top two are this close at both ends (a race: wider for coarse intervals)
    contest_margin: float = TIE_MAX_MARGIN
    medians: dict[tuple[int, str], float | None] = field(default_factory=dict)  # (tokens, backend) -> µs; None: failed
    _pending: list[tuple[int, str]] = field(default_factory=list)
    _intervals: list[tuple[int, int]] = field(default_factory=list)  # token-count pairs still to split
    _coarse_done: int = 0  # coarse counts handed out so far

    def coarse(self) -> list[int]:
        idx = sorted(set(range(0, len(self.grid), self.coarse_step)) | {len(self.grid) - 1})
        return [self.grid[i] for i in idx]

    def next_points(self) -> list[tuple[int, str]]:
        """(tokens, backend) pairs to measure next; empty when the search is done."""
        coarse = self.coarse()
        order = [coarse[0], coarse[-1], *coarse[1:-1]]  # both ends first: they decide the drops
        while self._coarse_done < len(order):
            t = order[self._coarse_done]
            self._coarse_done += 1
            alive = self.backends if self._coarse_done <= 2 else self._alive(coarse[0], coarse[-1])
            self._pending = [(t, b) for b in alive if (t, b) not in self.medians]
            if self._coarse_done == len(order):
                self._intervals = list(zip(coarse, coarse[1:]))
            if self._pending:
                return list(self._pending)
        while True:
            self._pending = []
            split: list[tuple[int, int]] = []
            for lo, hi in self._intervals:
                disagree = self.winner(lo) != self.winner(hi)
                contested = self._contested(lo, hi)
                if not (disagree or contested) or (mid := self._midpoint(lo, hi)) is None:
                    continue
                split += [(lo, mid), (mid, hi)]
                # a race alone: only the racers; a change of winner: every backend close to it
                race_only = contested and not disagree
                for b in self.contenders(lo, hi, self._race_margin(lo, hi) if race_only else None):
                    if (mid, b) not in self.medians:
                        self._pending.append((mid, b))
            self._intervals = split
            if self._pending or not split:
                return list(self._pending)

    def _midpoint(self, lo: int, hi: int) -> int | None:
        """Where to split a disagreeing or racing interval: its middle grid count; between
        neighbouring grid counts, a refinement count (module docstring); None: pinned down."""
        inside = [t for t in self.grid if lo < t < hi]
        if inside:
            return inside[(len(inside) - 1) // 2]
        if self.refine_ratio is None or hi <= self.refine_ratio * lo:
            return None
        mid = refinement_count(lo, hi)
        return mid if lo < mid < hi else None

    def _contested(self, lo: int, hi: int) -> bool:
        """At both ends the runner-up within `_race_margin` of the winner: the table's choice
        in between rests on the tie rule and on interpolation, which a backend whose cost
        steps in between fools (module docstring). Only with refinement on."""
        if self.refine_ratio is None:
            return False
        race = self._race_margin(lo, hi)
        return all(len(self._times(t)) >= 2 and self.margin(t) <= race for t in (lo, hi))

    def _race_margin(self, lo: int, hi: int) -> float:
        """`contest_margin` between neighbouring grid counts, growing with the log of the number
        of grid intervals between lo and hi: a coarse interval hides more (a backend can lead at
        both ends and trail in between: FlashInfer's steps, BENCHMARKS.md)."""
        steps = 1 + sum(1 for t in self.grid if lo < t < hi)
        return self.contest_margin * (1 + math.log2(steps))

    def _times(self, tokens: int) -> dict[str, float]:
        """backend -> median at one measured count, failed backends left out."""
        return {b: m for (t, b), m in self.medians.items() if t == tokens and m is not None}

    def margin(self, tokens: int) -> float:
        """Runner-up / winner - 1 at a measured count (0 with fewer than two backends timed)."""
        times = sorted(self._times(tokens).values())
        return times[1] / times[0] - 1 if len(times) > 1 and times[0] > 0 else 0.0

    def observe(self, tokens: int, backend: str, median_us: float | None) -> None:
        self.medians[(tokens, backend)] = median_us

    def winner(self, tokens: int) -> str | None:
        times = self._times(tokens)
        return min(times, key=lambda b: (times[b], b)) if times else None

    def _alive(self, first: int, last: int) -> list[str]:
        """Backends not at least drop_factor x the best at both ends of the grid."""
        alive = []
        for b in self.backends:
            beaten = all(
                (m := self.medians.get((t, b))) is None
                or (best := self._best(t)) is None
                or m >= self.drop_factor * best
                for t in (first, last)
            )
            if not beaten:
                alive.append(b)
        return alive

    def contenders(self, lo_tokens: int, hi_tokens: int, within: float | None = None) -> list[str]:
        """Backends worth measuring between two measured token counts: within `keep_within` (or
        1 + `within`) of the best at either end."""
        factor = self.keep_within if within is None else 1 + within
        keep = []
        for b in self.backends:
            for t in (lo_tokens, hi_tokens):
                best = self._best(t)
                mine = self.medians.get((t, b))
                if best is not None and mine is not None and mine <= factor * best:
                    keep.append(b)
                    break
        return keep

    def _best(self, tokens: int) -> float | None:
        return min(self._times(tokens).values(), default=None)

    def measured(self) -> int:
        return len(self.medians)


def refinement_count(lo: int, hi: int) -> int:
    """The geometric mean of lo and hi, rounded to a multiple of the largest power of two
    <= 1/8 of it (320 between 256 and 384, 896 between 768 and 1024): counts engines pad
    steps to, and a token count the table can name; the plain rounded mean when that
    multiple falls outside (lo, hi)."""
    g = math.sqrt(lo * hi)
    step = 2 ** max(0, math.floor(math.log2(g / 8))) if g >= 8 else 1
    mid = round(g / step) * step
    return mid if lo < mid < hi else round(g)
