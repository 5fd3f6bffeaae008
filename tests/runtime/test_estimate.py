"""Expected times over a load, and the tie rule (runtime/estimate.py): log-log interpolation,
clamping at the ends, which curves compete, the exact log-uniform mean, workloads, the tie
cap, and the winners select writes."""

from __future__ import annotations

import math

import pytest

from a2a_tune.tuner.runtime.estimate import (
    TIE_MAX_MARGIN,
    bridge_gaps,
    decide,
    expected,
    where_text,
    winners,
)

GRID = (1, 4, 16, 64)
LINEAR = (10.0, 40.0, 160.0, 640.0)  # 10 us per token: a power law of slope 1
FLAT = (50.0, 50.0, 50.0, 50.0)


def test_on_the_grid_the_measured_value():
    assert expected(GRID, {"a": LINEAR, "b": FLAT}, ("point", 16)) == {"a": 160.0, "b": 50.0}


def test_between_two_counts_a_power_law_through_them():
    # log-log interpolation is exact for a power law: 10 us per token at any count in range
    for t in (2, 3, 7, 33, 63):
        assert expected(GRID, {"a": LINEAR}, ("point", t))["a"] == pytest.approx(10.0 * t)
    # and for a curve that is not one, the geometric mean at the log-midpoint
    v = expected(GRID, {"c": (1.0, 100.0, 100.0, 100.0)}, ("point", 2))["c"]
    assert v == pytest.approx(10.0)


def test_outside_the_measured_range_the_end_value():
    assert expected(GRID, {"a": LINEAR}, ("point", 0)) == {"a": 10.0}
    assert expected(GRID, {"a": LINEAR}, ("point", 10**6)) == {"a": 640.0}
    assert expected(GRID, {"a": LINEAR}, ("point", 10**400)) == {"a": 640.0}  # no float overflow


def test_a_curve_competes_only_where_its_points_were_measured():
    gap = (10.0, None, 160.0, 640.0)
    tail = (10.0, 40.0, 160.0, None)
    curves = {"gap": gap, "tail": tail}
    assert set(expected(GRID, curves, ("point", 4))) == {"tail"}  # on the grid, not measured there
    assert set(expected(GRID, curves, ("point", 8))) == {"tail"}  # a bracketing point is missing
    assert set(expected(GRID, curves, ("point", 32))) == {"gap"}  # tail lacks 64
    assert set(expected(GRID, curves, ("point", 1000))) == {"gap"}  # clamped to a point it lacks
    assert set(expected(GRID, curves, ("log-uniform", 1, 64))) == set()  # a range needs every point


def test_the_log_uniform_mean_is_the_exact_integral():
    # The mean of 10 t over ln t uniform on [ln a, ln b] is 10 (b - a) / ln(b / a).
    for a, b in ((1, 64), (2, 50), (1, 5)):
        got = expected(GRID, {"a": LINEAR}, ("log-uniform", a, b))["a"]
        assert got == pytest.approx(10 * (b - a) / math.log(b / a), rel=1e-9)
    # Beyond the grid the clamped end value is averaged in: flat 640 over [64, 256].
    got = expected(GRID, {"a": LINEAR}, ("log-uniform", 1, 256))["a"]
    want = (10 * 63 / 1.0 + 640 * math.log(4)) / math.log(256)  # ∫ 10 e^u du over [0, ln 64] + flat part
    assert got == pytest.approx(want, rel=1e-9)
    # An empty range is its point.
    assert expected(GRID, {"a": LINEAR}, ("log-uniform", 16, 16)) == {"a": 160.0}


def test_a_workload_is_the_weighted_mean_of_its_points():
    dist = ("discrete", ((1, 0.5), (16, 0.25), (64, 0.25)))
    assert expected(GRID, {"a": LINEAR}, dist)["a"] == pytest.approx(0.5 * 10 + 0.25 * 160 + 0.25 * 640)
    assert expected(GRID, {"t": (10.0, 40.0, 160.0, None)}, dist) == {}  # needs 64 for its last point


def test_an_unknown_distribution_is_refused():
    with pytest.raises(ValueError, match="unknown distribution 'bucket'"):
        expected(GRID, {"a": LINEAR}, ("bucket", 1))


def test_where_text_says_how_the_table_covers_the_load():
    assert where_text(GRID, ("point", 16)) == "at 16 tokens/rank (measured)"
    assert where_text(GRID, ("point", 8)) == "interpolated at 8 tokens/rank between 4 and 16"
    assert where_text(GRID, ("point", 100)) == "clamped to 64 tokens/rank (requested 100)"
    assert where_text(GRID, ("log-uniform", 1, 32)) == "tokens/rank 1..32 log-uniform"
    assert (
        where_text(GRID, ("log-uniform", 1, 128)) == "tokens/rank 1..128 log-uniform (measured 1..64; clamped outside)"
    )
    assert where_text(GRID, ("discrete", ((2, 0.5), (8, 0.5)))) == "workload of 2 token counts 2..8 tokens/rank"
    # A count with thousands of digits is named by its power of two, not echoed.
    text = where_text(GRID, ("point", 10**4000))
    assert text == "clamped to 64 tokens/rank (requested ~2^13287)"


def test_bridge_gaps_fills_only_between_measured_counts():
    assert bridge_gaps(GRID, LINEAR) is None  # nothing missing
    assert bridge_gaps(GRID, (10.0, 40.0, 160.0, None)) is None  # a tail stays missing
    bridged = bridge_gaps(GRID, (None, 40.0, None, 640.0))
    assert bridged[0] is None and bridged[1] == 40.0 and bridged[3] == 640.0
    assert bridged[2] == pytest.approx(160.0)  # the power law through 4 and 64


# ------------------------------------------------------------------------------ tie rule


def test_the_fastest_wins_outside_its_spread():
    chosen, fastest, tied = decide({"a": 10.0, "b": 12.0}, {"a": 9.9}, {"a": 10.1}, ["b", "a"])
    assert (chosen, fastest, tied) == ("a", "a", ("a",))


def test_inside_the_spread_the_preferred_backend_wins():
    chosen, fastest, tied = decide({"a": 10.0, "b": 10.2}, {"a": 9.0}, {"a": 11.0}, ["b", "a"])
    assert (chosen, fastest, tied) == ("b", "a", ("a", "b"))
    # not listed in the preference: after those listed, by name
    assert decide({"x": 10.0, "w": 10.1}, {"x": 9.0}, {"x": 11.0}, ["a"])[0] == "w"


def test_a_tie_never_spans_more_than_the_cap():
    slower = 10.0 * (1 + TIE_MAX_MARGIN) + 0.01  # inside a wide p90, beyond the cap
    assert decide({"a": 10.0, "b": slower}, {"a": 5.0}, {"a": 20.0}, ["b"])[0] == "a"
    assert decide({"a": 10.0, "b": 10.0 * (1 + TIE_MAX_MARGIN)}, {"a": 5.0}, {"a": 20.0}, ["b"])[0] == "b"


def test_without_a_spread_only_an_equal_median_ties():
    assert decide({"a": 10.0, "b": 10.001}, {}, {}, ["b"])[0] == "a"
    assert decide({"a": 10.0, "b": 10.0}, {}, {}, ["b"])[0] == "b"


def test_winners_per_count_skip_failed_and_unmeasured_backends():
    tokens = (1, 8)
    med = {"a": (10.0, 50.0), "b": (20.0, None), "bad": (1.0, 1.0)}
    lo = {b: tuple(v and v * 0.99 for v in c) for b, c in med.items()}
    hi = {b: tuple(v and v * 1.01 for v in c) for b, c in med.items()}
    w1, w8 = winners(tokens, med, lo, hi, {"bad": "incorrect: wrong sums"}, ["a", "b"])
    assert (w1.backend, w1.runner_up, w1.margin, w1.tie) == ("a", "b", 1.0, False)
    assert (w8.backend, w8.runner_up, w8.margin) == ("a", None, None)  # nothing else competed
    assert w1.other == "b"
