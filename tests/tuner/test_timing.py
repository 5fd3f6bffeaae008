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


def _fake_clock_backend(now: list, dispatch_s: float, combine_s: float):
    """A backend on CPU whose halves take a fixed time on a fake clock (no real sleeping: a
    loaded host overshoots by more than the test measures)."""
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    class Halves:
        device = torch.device("cpu")
        group = dist.group.WORLD
        dtype = torch.bfloat16
        calls: list = []

        def dispatch(self, x, topk_ids, topk_weights):
            now[0] += dispatch_s
            self.calls.append("dispatch")
            return SimpleNamespace(x=x)

        def combine_buffer(self, d):
            return None

        def combine(self, out, d):
            now[0] += combine_s
            self.calls.append("combine")
            return out

        def gave_up(self) -> bool:
            return False

    return Halves()


@pytest.mark.parametrize("dispatch_us, combine_us", [(3000.0, 5000.0), (100.0, 50.0)])
def test_dispatch_and_combine_are_cut_apart_in_the_round_trips_sample_scheme(
    dispatch_us, combine_us, tmp_path, monkeypatch
):
    """Cut between the halves, the samples add up to the round trip's: R round trips a sample
    (R = 1 at 8 ms, 2 at 150 µs: ~300 µs a sample), the lead-in outside, one value per sample."""
    import time

    import torch
    import torch.distributed as dist

    from a2a_tune.kernels.reference import RankInputs
    from a2a_tune.tuner.timing import time_halves, time_round_trips

    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        backend = _fake_clock_backend(now, dispatch_us / 1e6, combine_us / 1e6)
        inputs = [RankInputs(torch.zeros(2, 4), torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, 1))] * 2
        d, c = time_halves(backend, inputs, warmup=1, iters=4)
        round_trip, _ = time_round_trips(backend, inputs, warmup=1, iters=4)
    finally:
        dist.destroy_process_group()
    assert d == pytest.approx([dispatch_us] * 4) and c == pytest.approx([combine_us] * 4)
    assert [a + b for a, b in zip(d, c)] == pytest.approx(round_trip)
    assert backend.calls[:2] == ["dispatch", "combine"]  # the cut chain is the same chain


def test_a_chain_that_cannot_be_cut_leaves_the_round_trip_alone(tmp_path, monkeypatch):
    """Timing the halves fails (here: the backend raises on its next dispatch): no split, no error."""
    import torch
    import torch.distributed as dist

    from a2a_tune.kernels.reference import RankInputs
    from a2a_tune.tuner.launch import RankContext
    from a2a_tune.tuner.measure import _halves

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        backend = _fake_clock_backend([0.0], 0.0, 0.0)
        backend.dispatch = lambda *a: (_ for _ in ()).throw(RuntimeError("capture not supported"))
        inputs = [RankInputs(torch.zeros(2, 4), torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, 1))]
        ctx = RankContext(0, 1, 0, torch.device("cpu"), None)
        assert _halves(ctx, backend, inputs, warmup=0, iters=2, graph=False) == ([], [])
    finally:
        dist.destroy_process_group()


def test_an_eager_halfs_head_start_is_twice_the_hosts_queueing_of_a_half_within_bounds():
    """The device spins while the host queues a half (timing.py): twice the longest host launch
    of a half + 20 µs, so the half starts with the host ahead; never above 5 ms a half."""
    from a2a_tune.tuner.timing import HEAD_START_MAX_US, head_start_us

    assert head_start_us([40.0, 130.0, 90.0]) == 280.0
    assert head_start_us([]) == 20.0
    assert head_start_us([1e6]) == HEAD_START_MAX_US


def test_an_eager_gpu_backend_that_reads_the_host_is_not_split(tmp_path, monkeypatch):
    """timing.unsplit_reason: eager on a GPU, a backend whose dispatch reads the device from the
    host is not timed apart, and nothing of the halves' timer runs; the same backend on CPU
    ranks, a capturable one and an eager one without a host read are split. The shipped eager
    backends say whether they read the host."""
    import types

    import torch

    from a2a_tune.tuner import measure
    from a2a_tune.tuner.launch import RankContext
    from a2a_tune.tuner.timing import HOST_READ_UNSPLIT, unsplit_reason

    def backend(device: str, capturable: bool, reads_host: bool = True):
        return types.SimpleNamespace(
            device=torch.device(device), graph_capturable=capturable, reads_host=reads_host, gave_up=lambda: False
        )

    assert unsplit_reason(backend("cuda", False), graph=False) == HOST_READ_UNSPLIT
    assert unsplit_reason(backend("cuda", False, reads_host=False), graph=False) == ""  # NCCL EP: eager, no read
    assert "reads the device from the host" in HOST_READ_UNSPLIT
    assert unsplit_reason(backend("cuda", True), graph=False) == ""
    assert unsplit_reason(backend("cuda", True), graph=True) == ""
    assert unsplit_reason(backend("cpu", False), graph=False) == ""
    timed = []
    monkeypatch.setattr(measure, "time_halves", lambda *a, **k: timed.append(1) or ([1.0], [2.0]))
    monkeypatch.setattr(measure, "all_ranks_ok", lambda ok, ctx: ok)
    ctx = RankContext(0, 1, 0, torch.device("cuda"), None)
    assert measure._halves(ctx, backend("cuda", False), [], warmup=0, iters=2, graph=False) == ([], [])
    assert not timed
    assert measure._halves(ctx, backend("cuda", True), [], warmup=0, iters=2, graph=False) == ([1.0], [2.0])
    from a2a_tune.kernels import get_backend

    reads = {n: get_backend(n).reads_host for n in ("allgather_reducescatter", "nccl_all2allv", "nccl_ep_low_latency")}
    assert reads == {"allgather_reducescatter": True, "nccl_all2allv": True, "nccl_ep_low_latency": False}
