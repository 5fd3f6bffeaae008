"""The adaptive token search on synthetic curves: same winners as the full grid, fewer points."""

import math

import pytest

from a2a_tune.tuner.adaptive import AdaptiveSearch
from a2a_tune.tuner.sweep import DEFAULT_TOKENS

GRID = tuple(2**i for i in range(15))  # 1 .. 16384, powers of 2


BACKENDS = ("fast_small", "fast_large", "slow", "slower")


def curves(t: int) -> dict[str, float]:
    # as on 2xH200: a latency-bound backend and a bandwidth-bound one crossing between 256 and
    # 512 tokens, and two that are never competitive
    return {
        "fast_small": 10 + 0.5 * t,
        "fast_large": 150 + 0.05 * t,
        "slow": 2000 + 1.0 * t,
        "slower": 4000 + 2.0 * t,
    }


def run(search: AdaptiveSearch, measure=curves) -> AdaptiveSearch:
    while points := search.next_points():
        for t, b in points:
            search.observe(t, b, measure(t)[b])
    return search


def full_grid_winner(t: int) -> str:
    c = curves(t)
    return min(c, key=c.get)


def regret(search: AdaptiveSearch, t: int) -> float:
    """Time of the backend the search's table would pick at t (log-log interpolation) / best - 1."""
    pts = sorted({tt for (tt, _) in search.medians})
    lo = max(p for p in pts if p <= t)
    hi = min(p for p in pts if p >= t)

    def at(b: str) -> float:
        a, c = search.medians.get((lo, b)), search.medians.get((hi, b))
        if a is None or c is None:
            return math.inf
        if lo == hi:
            return a
        f = (math.log(t) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return math.exp(math.log(a) + f * (math.log(c) - math.log(a)))

    chosen = min(search.backends, key=at)
    return curves(t)[chosen] / min(curves(t).values()) - 1


@pytest.mark.parametrize("grid", [GRID, DEFAULT_TOKENS["cuda"]], ids=["powers-of-2", "gpu-default"])
def test_finds_the_crossover_with_a_third_of_the_grid(grid):
    s = run(AdaptiveSearch(grid, BACKENDS))
    assert s.winner(256) == "fast_small" and s.winner(512) == "fast_large"
    full = len(grid) * len(BACKENDS)
    assert s.measured() <= full / 3, (s.measured(), full)
    for t in grid:
        assert s.winner(t) in (None, full_grid_winner(t))
    # held-out points between grid points: the table built from these points loses < 1%
    worst = max(regret(s, t) for t in (3, 24, 96, 300, 384, 700, 3000, 12000))
    assert worst < 0.01


def test_a_backend_beaten_at_both_ends_is_measured_only_there():
    s = run(AdaptiveSearch(GRID, BACKENDS))
    for b in ("slow", "slower"):
        assert sorted(t for (t, bb) in s.medians if bb == b) == [GRID[0], GRID[-1]]
    # the bandwidth-bound backend loses 14x at 1 token but wins at the other end: kept
    assert (256, "fast_large") in s.medians


def test_no_crossover_means_coarse_grid_only():
    s = run(AdaptiveSearch(GRID, ("a", "b")), measure=lambda t: {"a": 1.0 + t, "b": 1.5 + 1.6 * t})
    assert s.measured() == 2 * len(s.coarse())  # b is never 3x beaten: kept, but nothing to bisect


def test_failed_points_do_not_win():
    s = run(AdaptiveSearch((1, 2, 4), ("a", "b")), measure=lambda t: {"a": None if t == 4 else 1.0, "b": 5.0})
    assert s.winner(4) == "b" and s.winner(1) == "a"
