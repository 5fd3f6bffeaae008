"""Adaptive token search: find where the backends' ranking changes with few measurements.

Instead of timing every backend at every token count of the grid, measure a coarse subset
(every 5th grid point, both ends included), then bisect (over grid indices) every interval
whose two ends have different winners, until the change is pinned between neighbouring grid
points. Backends clearly beaten are dropped early: the two ends of the grid are measured
first, and a backend that took at least `drop_factor` × the best time at both ends is not
measured in between (a backend's cost is close to latency + bytes / bandwidth, so its ratio
to another backend moves monotonically with the token count); inside an interval, only
backends within `keep_within` × the best at one of its ends are measured. Their curves keep gaps there, and the lookup never picks a backend where it has
none. The risk: a winner change that reverses inside one coarse interval is missed; the
`evaluate` command measures held-out points to bound that regret.

Pure logic: the caller measures. `next_points()` says what to measure next; `observe()`
takes the medians back. All ranks run the same search on the same (all-reduced) numbers, so
they take the same decisions without talking.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AdaptiveSearch:
    grid: tuple[int, ...]  # ascending token counts the full sweep would measure
    backends: tuple[str, ...]
    keep_within: float = 1.3
    drop_factor: float = 2.0
    coarse_step: int = 5
    medians: dict[tuple[int, str], float | None] = field(default_factory=dict)  # (tokens, backend) -> µs; None: failed
    _pending: list[tuple[int, str]] = field(default_factory=list)
    _intervals: list[tuple[int, int]] = field(default_factory=list)  # grid index pairs still to split
    _coarse_done: int = 0  # coarse points handed out so far

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
                idx = [self.grid.index(c) for c in coarse]
                self._intervals = list(zip(idx, idx[1:]))
            if self._pending:
                return list(self._pending)
        while True:
            self._pending = []
            split: list[tuple[int, int]] = []
            for lo, hi in self._intervals:
                if hi - lo < 2 or self.winner(self.grid[lo]) == self.winner(self.grid[hi]):
                    continue
                mid = (lo + hi) // 2
                split += [(lo, mid), (mid, hi)]
                for b in self.contenders(self.grid[lo], self.grid[hi]):
                    if (self.grid[mid], b) not in self.medians:
                        self._pending.append((self.grid[mid], b))
            self._intervals = split
            if self._pending or not split:
                return list(self._pending)

    def observe(self, tokens: int, backend: str, median_us: float | None) -> None:
        self.medians[(tokens, backend)] = median_us

    def winner(self, tokens: int) -> str | None:
        times = {b: m for (t, b), m in self.medians.items() if t == tokens and m is not None}
        return min(times, key=lambda b: (times[b], b)) if times else None

    def _alive(self, first: int, last: int) -> list[str]:
        """Backends not at least drop_factor x the best at both ends of the grid."""
        alive = []
        for b in self.backends:
            beaten = all(
                (m := self.medians.get((t, b))) is None or (best := self._best(t)) is None or m >= self.drop_factor * best
                for t in (first, last)
            )
            if not beaten:
                alive.append(b)
        return alive

    def contenders(self, lo_tokens: int, hi_tokens: int) -> list[str]:
        """Backends worth measuring between two measured points: close to the best at either end."""
        keep = []
        for b in self.backends:
            for t in (lo_tokens, hi_tokens):
                best = self._best(t)
                mine = self.medians.get((t, b))
                if best is not None and mine is not None and mine <= self.keep_within * best:
                    keep.append(b)
                    break
        return keep

    def _best(self, tokens: int) -> float | None:
        times = [m for (t, _), m in self.medians.items() if t == tokens and m is not None]
        return min(times) if times else None

    def measured(self) -> int:
        return len(self.medians)
