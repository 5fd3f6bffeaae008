import pytest

from a2a_tune.tuner.timing import quantile, summarize


def test_quantile_interpolates_between_order_statistics():
    s = [10.0, 20.0, 30.0, 40.0]
    assert quantile(s, 0.0) == 10.0
    assert quantile(s, 1.0) == 40.0
    assert quantile(s, 0.5) == 25.0
    assert quantile(s, 0.1) == pytest.approx(13.0)


def test_summarize_median_spread_and_ci_bracket_the_median():
    samples = [float(v) for v in range(1, 101)]  # 1..100, shuffled order must not matter
    st = summarize(samples[::-1])
    assert st.n == 100
    assert st.median_us == 50.5
    assert st.p10_us == pytest.approx(10.9)
    assert st.p90_us == pytest.approx(90.1)
    assert st.ci_low_us < st.median_us < st.ci_high_us
    # 95% order-statistic interval for n=100 spans ranks ~40..60
    assert 38 <= st.ci_low_us <= 42 and 59 <= st.ci_high_us <= 63


def test_summarize_single_sample():
    st = summarize([7.0])
    assert (st.median_us, st.p10_us, st.p90_us, st.ci_low_us, st.ci_high_us) == (7.0,) * 5


def test_summarize_rejects_empty():
    with pytest.raises(ValueError):
        summarize([])
