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
    return regret_on(search, curves, t)


@pytest.mark.parametrize("grid", [GRID, DEFAULT_TOKENS["cuda"]], ids=["powers-of-2", "gpu-default"])
def test_finds_the_crossover_with_a_third_of_the_grid(grid):
    s = run(AdaptiveSearch(grid, BACKENDS))
    # the crossover (t = 311) is pinned between neighbouring grid counts
    small = max(t for t in grid if s.winner(t) == "fast_small")
    large = min(t for t in grid if s.winner(t) == "fast_large")
    assert small < 311 < large and grid.index(large) == grid.index(small) + 1
    full = len(grid) * len(BACKENDS)
    assert s.measured() <= full / 3, (s.measured(), full)
    for t in grid:
        assert s.winner(t) in (None, full_grid_winner(t))
    # held-out points between grid counts: the table built from these measurements loses < 1%
    worst = max(regret(s, t) for t in (3, 24, 96, 300, 384, 700, 3000, 12000))
    assert worst < 0.01


def test_a_backend_beaten_at_both_ends_is_measured_only_there():
    s = run(AdaptiveSearch(GRID, BACKENDS))
    for b in ("slow", "slower"):
        assert sorted(t for (t, bb) in s.medians if bb == b) == [GRID[0], GRID[-1]]
    # the bandwidth-bound backend loses 14x at 1 token but wins at the other end: kept
    assert (256, "fast_large") in s.medians


def test_no_crossover_means_coarse_grid_only():
    s = run(AdaptiveSearch(GRID, ("a", "b")), measure=lambda t: {"a": 1.0 + t, "b": 1.2 + 1.3 * t})
    assert s.measured() == 2 * len(s.coarse())  # b is never 1.5x beaten: kept, but nothing to bisect


def test_failed_points_do_not_win():
    s = run(AdaptiveSearch((1, 2, 4), ("a", "b")), measure=lambda t: {"a": None if t == 4 else 1.0, "b": 5.0})
    assert s.winner(4) == "b" and s.winner(1) == "a"


# ------------------------------------------------------------- refinement beyond the grid


def stepped(t: int) -> dict[str, float]:
    # `steps` is the faster backend up to 300 tokens, where its cost jumps (a kernel changing
    # its launch shape); the smooth log-log interpolation of its 256- and 512-token times
    # hides the jump, so a grid-only table keeps it up to ~500 tokens
    return {"steps": 10 + 0.1 * t + (10 if t > 300 else 0), "smooth": 15 + 0.09 * t}


def test_refinement_pins_a_step_between_grid_points():
    held_out = range(257, 512, 7)
    plain = run(AdaptiveSearch(GRID, ("steps", "smooth")), measure=stepped)
    refined = run(AdaptiveSearch(GRID, ("steps", "smooth"), refine_ratio=1.2), measure=stepped)

    def worst(s):
        return max(regret_on(s, stepped, t) for t in held_out)

    assert worst(plain) > 0.10  # the grid alone picks `steps` well past its jump
    extra = sorted({t for t, _ in refined.medians} - set(GRID))
    assert extra and all(256 < t < 512 for t in extra)  # only inside the disagreeing interval
    assert len(extra) <= 4
    pts = sorted({t for t, _ in refined.medians})
    lo = max(t for t in pts if t <= 300)
    hi = min(t for t in pts if t > 300)
    assert hi / lo <= 1.2  # the jump is pinned to within the refine ratio
    # every held-out count outside the pinned bracket is now answered right
    assert max(regret_on(refined, stepped, t) for t in held_out if not lo < t < hi) == 0


def test_refinement_leaves_clear_leads_alone_and_measures_close_races_down_to_the_ratio():
    # no crossover and a clear lead everywhere: nothing beyond the grid
    s = run(AdaptiveSearch(GRID, ("a", "b"), refine_ratio=1.2), measure=lambda t: {"a": 1.0 + t, "b": 1.5 + 1.6 * t})
    assert {t for t, _ in s.medians} <= set(GRID)
    # a close race (0.5% apart everywhere, the lead flipping at 256..512): the table's choice
    # rests on the tie rule, so the race is measured down to the refine ratio everywhere
    from a2a_tune.tuner.adaptive import refinement_count

    flip = lambda t: {"a": 100.0, "b": 100.5 if t <= 256 else 99.5}  # noqa: E731
    s = run(AdaptiveSearch(GRID, ("a", "b"), coarse_step=1, refine_ratio=1.2), measure=flip)
    counts = sorted({t for t, _ in s.medians})
    for lo, hi in zip(counts, counts[1:]):
        assert hi <= 1.2 * lo or not lo < refinement_count(lo, hi) < hi, (lo, hi)
    # a clear 10% lead everywhere is no race: nothing between the grid counts
    lead = lambda t: {"a": 100.0, "b": 110.0 if t <= 256 else 109.5}  # noqa: E731
    s = run(AdaptiveSearch(GRID, ("a", "b"), coarse_step=1, refine_ratio=1.2), measure=lead)
    assert {t for t, _ in s.medians} == set(GRID)


def test_a_close_race_with_a_step_between_grid_points_is_caught():
    # as FlashInfer's round trip on 2xH200: `waves` runs in waves of 264 tokens (two CTAs per
    # SM on 132 SMs), up to 8% slower than `smooth` just past a wave boundary and level with
    # it just below one -- where the power-of-2 grid points sit
    def waves(t: int) -> dict[str, float]:
        smooth = 10 + 0.1 * t
        return {"smooth": smooth, "waves": smooth * (0.99 + 0.09 * (-t % 264) / 264)}

    plain = run(AdaptiveSearch(GRID, ("smooth", "waves"), coarse_step=1), measure=waves)
    refined = run(AdaptiveSearch(GRID, ("smooth", "waves"), coarse_step=1, refine_ratio=1.2), measure=waves)
    held_out = range(520, 1024, 8)
    assert max(regret_on(plain, waves, t) for t in held_out) > 0.05
    assert max(regret_on(refined, waves, t) for t in held_out) < 0.03


def test_refinement_counts_are_round_and_strictly_inside():
    from a2a_tune.tuner.adaptive import refinement_count

    assert refinement_count(256, 384) == 320
    assert refinement_count(768, 1024) == 896
    assert refinement_count(256, 320) == 288
    assert refinement_count(3, 4) == 3  # no count strictly inside: the search stops there
    s = AdaptiveSearch((3, 4), ("a", "b"), coarse_step=1, refine_ratio=1.2)
    run(s, measure=lambda t: {"a": 1.0 if t == 3 else 2.0, "b": 1.5})
    assert {t for t, _ in s.medians} == {3, 4}


def regret_on(search: AdaptiveSearch, curve, t: int) -> float:
    """`regret` for any curve: the pick of the log-log interpolated table at t vs the best."""
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
    return curve(t)[chosen] / min(curve(t).values()) - 1


def reversal_inside_a_coarse_interval(t: int) -> dict[str, float]:
    # `a` leads by 4% at the coarse counts 96 and 768 of the GPU grid (every 6th count) but
    # trails by 8% from 150 to 600 tokens: both ends agree, neither is a close race by the
    # 3% of neighbouring counts
    base = 10 + 0.1 * t
    return {"a": base * (1.08 if 150 < t < 600 else 0.96), "b": base}


def test_a_coarse_interval_is_a_race_up_to_a_wider_margin():
    grid = DEFAULT_TOKENS["cuda"]
    held_out = range(170, 590, 10)  # away from the two steps, which refinement pins to <= 1.2x
    s = run(AdaptiveSearch(grid, ("a", "b"), refine_ratio=1.2), measure=reversal_inside_a_coarse_interval)
    assert max(regret_on(s, reversal_inside_a_coarse_interval, t) for t in held_out) < 0.01

    class NarrowRaces(AdaptiveSearch):  # the 3% of neighbouring counts for every interval
        def _race_margin(self, lo, hi):
            return self.contest_margin

    narrow = run(NarrowRaces(grid, ("a", "b"), refine_ratio=1.2), measure=reversal_inside_a_coarse_interval)
    assert max(regret_on(narrow, reversal_inside_a_coarse_interval, t) for t in held_out) > 0.05


def test_a_change_of_winner_measures_every_close_backend_a_race_only_the_racers():
    # a and b cross between 256 and 512; c trails the winner by 10% everywhere
    def crossing(t: int) -> dict[str, float]:
        a, b = 10 + 0.5 * t, 150 + 0.05 * t
        return {"a": a, "b": b, "c": 1.10 * min(a, b)}

    s = run(AdaptiveSearch(GRID, ("a", "b", "c"), coarse_step=1, refine_ratio=1.2), measure=crossing)
    refined = {t for t, _ in s.medians} - set(GRID)
    assert refined and all((t, "c") in s.medians for t in refined)  # within 1.3x: measured where the winner changes

    def racing(t: int) -> dict[str, float]:
        a = 10 + 0.1 * t
        return {"a": a, "b": a * 1.01, "c": a * 1.10}

    s = run(AdaptiveSearch(GRID, ("a", "b", "c"), coarse_step=1, refine_ratio=1.2), measure=racing)
    refined = {t for t, _ in s.medians} - set(GRID)
    assert refined and not any((t, "c") in s.medians for t in refined)  # 10% behind: not in the race
