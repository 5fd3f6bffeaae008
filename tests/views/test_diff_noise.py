"""`diff` tells change from noise (issue 30): a stored pair of back-to-back CPU rehearsals of
one plan does not trip it, though its inner spreads alone would; a planted 20% slowdown of one
backend in the shipped 2xH200 table is reported, at every point where that backend's spread is
narrower than the slowdown. Stored fixtures only: nothing here is timed."""

from __future__ import annotations

import pytest
from paths import FIXTURES, REPO
from planted_slowdown import slowed
from typer.testing import CliRunner

from a2a_tune.tuner.cli import app
from a2a_tune.tuner.views.diff import MIN_EFFECT, beyond_noise, diff_views
from a2a_tune.tuner.views.load import load_profile_view

H200 = REPO / "profiles" / "h200.nvl18x2.node1.json"
# Two `a2a-tune run --device cpu --preset mixtral-8x7b --tokens 1,16,64` back to back on the
# loaded 2-core CI machine (BENCHMARKS.md, "diff: change or noise": pair 9).
PAIR = FIXTURES / "diff" / "cpu_pair_a.json", FIXTURES / "diff" / "cpu_pair_b.json"


def test_back_to_back_rehearsals_are_not_a_regression():
    a, b = (load_profile_view(p) for p in PAIR)
    # The pair holds a point whose inner spreads do not overlap, 3.5x apart: the old rule's FAIL.
    apart = [
        (s.key, name, j)
        for s in a.shapes
        for name, ca in s.curves.items()
        for j in range(len(s.tokens))
        if b.shape(s.key).curves[name].at(j)[1] > ca.at(j)[2]
    ]
    assert apart, "the fixture no longer shows what it is kept for"
    res = diff_views(a, b)
    assert res.regressions == [] and res.improvements == [] and res.failing(["regressions"]) == []
    r = CliRunner().invoke(app, ["diff", *map(str, PAIR)], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "-> OK" in r.stdout, r.stdout


@pytest.mark.parametrize("backend", ["nvlink_one_sided", "allgather_reducescatter"])
def test_a_planted_20_percent_slowdown_of_one_backend_is_reported(tmp_path, backend):
    slow = slowed(H200, tmp_path / "slow.json", backend, 1.2)
    res = diff_views(load_profile_view(H200), load_profile_view(slow))
    assert {p.backend for p in res.regressions} == {backend} and res.improvements == []
    assert all(p.ratio == pytest.approx(1.2) for p in res.regressions)
    a = load_profile_view(H200)
    tight = [  # the points where the slowdown is larger than the spread of either side
        (s.key, t)
        for s in a.shapes
        if backend in s.curves
        for j, t in enumerate(s.tokens)
        if s.curves[backend].at(j)[0] is not None
        and beyond_noise(*s.curves[backend].at(j), *(1.2 * v for v in s.curves[backend].at(j)))
    ]
    assert tight and sorted((p.shape, p.tokens) for p in res.regressions) == sorted(tight)
    r = CliRunner().invoke(app, ["diff", str(H200), str(slow)], env={"COLUMNS": "200"})
    assert r.exit_code == 1 and "FAIL (regressions)" in r.stdout, r.stdout


def test_the_rule_needs_both_the_spread_and_the_minimum_effect():
    # 3.5x slower, inner spreads apart, but B's p10..p90 (1.04x its median) is wider than the shift
    assert beyond_noise(100, 60, 250, 350, 330, 700) == 0
    # 20% slower with 1% spreads: change
    assert beyond_noise(100, 99.5, 100.5, 120, 119.4, 120.6) == 1
    assert beyond_noise(120, 119.4, 120.6, 100, 99.5, 100.5) == -1
    # 5% slower with 0.5% spreads: beyond the spreads, under the minimum effect
    assert MIN_EFFECT > 0.05 and beyond_noise(100, 99.8, 100.2, 105, 104.8, 105.2) == 0
    assert beyond_noise(100, 99.8, 100.2, 105, 104.8, 105.2, min_effect=0.02) == 1
    # medians only: the minimum effect alone
    assert beyond_noise(100, None, None, 115, None, None) == 1


def _planted(src, out, backend: str, tokens: int, median: float, p10: float, p90: float):
    """`src` with `backend`'s figures at `tokens` replaced (winners left as the table has them)."""
    import json

    data = json.loads(src.read_text())
    for entry in data["entries"]:
        if tokens in entry["tokens"] and backend in entry["backends"]:
            j, curve = entry["tokens"].index(tokens), entry["backends"][backend]
            curve["median_us"][j], curve["p10_us"][j], curve["p90_us"][j] = median, p10, p90
    out.write_text(json.dumps(data))
    return out


def test_a_slowdown_the_slower_runs_own_noise_would_hide_is_reported(tmp_path):
    """Issue 37: a backend that sleeps 2 ms per dispatch went from 1407 µs (p10 1321, p90 1733)
    to 6638 µs (p10 3949, p90 10294): 4.7x slower, B's p10 above A's p90, but B's own spread
    (6345 µs) wider than the shift (5231 µs), so `diff` said "0 slower -> OK". Planted at one
    point of the stored back-to-back pair, whose other points stay noise."""
    a = _planted(PAIR[0], tmp_path / "a.json", "nccl_all2allv", 16, 1407.0, 1321.0, 1733.0)
    b = _planted(PAIR[1], tmp_path / "b.json", "nccl_all2allv", 16, 6638.0, 3949.0, 10294.0)
    res = diff_views(load_profile_view(a), load_profile_view(b))
    assert [(p.backend, p.tokens) for p in res.regressions] == [("nccl_all2allv", 16)]
    assert res.improvements == []
    for width in (80, 200):
        r = CliRunner().invoke(app, ["diff", str(a), str(b)], env={"COLUMNS": str(width)})
        assert r.exit_code == 1 and "1 slower" in r.stdout and "FAIL (regressions)" in r.stdout, r.stdout


def test_distributions_apart_by_more_than_a_spread_are_a_change_and_noise_is_not():
    # the issue's point: the gap B p10 / A p90 (2.3x) is wider than A's own spread (1.3x)
    assert beyond_noise(1407, 1321, 1733, 6638, 3949, 10294) == 1
    assert beyond_noise(6638, 3949, 10294, 1407, 1321, 1733) == -1  # the mirror: faster
    # back-to-back noise: inner spreads just apart (1.3x), each run's spread wider than the gap
    assert beyond_noise(100, 60, 250, 350, 330, 700) == 0
    # the distributions overlap: never a change, however far the medians moved
    assert beyond_noise(1400, 1300, 4000, 6600, 3900, 10300) == 0
