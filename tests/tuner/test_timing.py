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


def test_each_sample_starts_after_an_untimed_lead_in(tmp_path, monkeypatch):
    """The lead-in (which absorbs the ranks' start skew) runs before every sample, outside its time.

    The clock is a fake that only the lead-in and the launch move: the test is about what the
    sample brackets, and a real sleep on a loaded host can overshoot by more than it measures."""
    import time
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from a2a_tune.tuner.timing import _timed_samples

    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        backend = SimpleNamespace(device=torch.device("cpu"), group=dist.group.WORLD)
        calls: list[str] = []

        def lead_in(i):
            calls.append("lead-in")
            now[0] += 0.050  # a late peer: 50 ms that must not show in the sample

        def launch(i):
            calls.append(f"sample {i}")
            now[0] += 0.002 * (i + 1)  # R = 2 round trips: 1, 2, 3 ms each

        device_us, host_us = _timed_samples(backend, iters=3, reps=2, launch=launch, lead_in=lead_in)
    finally:
        dist.destroy_process_group()
    assert calls == ["lead-in", "sample 0", "lead-in", "sample 1", "lead-in", "sample 2"]
    assert device_us == host_us == pytest.approx([1000.0, 2000.0, 3000.0])  # per round trip, never the 50 ms


def test_cpu_ranks_run_one_intra_op_thread_each(monkeypatch):
    """W ranks' spin-waiting OpenMP workers on shared cores starve each other: with torch's default
    threads, round trips on CPU ranks under load varied by orders of magnitude (BENCHMARKS.md)."""
    import socket

    import torch
    import torch.distributed as dist

    from a2a_tune.tuner.launch import _init

    def threads_in_a_rank() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            monkeypatch.setenv("MASTER_PORT", str(s.getsockname()[1]))
        _init(0, 1, 0, "cpu")
        try:
            return torch.get_num_threads()
        finally:
            dist.destroy_process_group()
            torch.set_num_threads(before)

    before = torch.get_num_threads()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    assert threads_in_a_rank() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's own setting is kept
    assert threads_in_a_rank() == 2
