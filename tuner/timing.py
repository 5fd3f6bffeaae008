"""Timing dispatch + combine round trips, and the statistics every measurement stores.

What is timed: `combine(dispatch(x))`, the received rows passed straight back as the expert
output. One sample = R round trips launched back to back between two CUDA events, divided by R;
R fills ~`SAMPLE_TARGET_US` and is the same on every rank. Before each sample the ranks meet at a
barrier, then an untimed lead-in absorbs their start skew; a sample is the max over ranks; input
sets rotate so repeated round trips do not replay a warm L2. Two modes:

* eager (`time_round_trips`): launched from Python with the host queued ahead, as an engine's
  prefill step; the host wall time per round trip (`host_us`) is stored beside the device time.
* graph (`time_graph_round_trips`): the R round trips captured in one CUDA graph, one replay a
  sample, as engines run decode (`graph_capturable` backends only).

**Dispatch and combine apart** (`time_halves`): the same samples in the same mode, each half cut
by `_Cuts`, the max over ranks taken per half. Graph: an external event captured between the
halves, so a half is its device time (work a dispatch leaves on a side stream is charged to
combine). Eager: the host runs behind the device, so events chained across the halves would time
the host; each half runs alone, the device drained and the ranks aligned, then a spin on the
device (`head_start_us`: twice the host's time to queue a half) while the host queues it, so it
runs as in a round trip, the host ahead and the GPU busy: from an event behind the spin to one
behind its work, its device work, not the other half's work nor the host's launch gaps
(dispatch + combine <= the round trip), where the host never waits on the device inside a half:
a GPU backend that reads the device from the host is not split (`unsplit_reason`). On CPU
(gloo): the host clock, no spin. Why, measured: docs/method.md, BENCHMARKS.md ("Eager halves").
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from a2a_tune.kernels import All2AllBackend
from a2a_tune.kernels.reference import RankInputs


@dataclass(frozen=True)
class Stats:
    median_us: float
    p10_us: float
    p90_us: float
    ci_low_us: float  # ~95% confidence interval of the median, from order statistics
    ci_high_us: float
    n: int


def quantile(sorted_samples: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted samples."""
    if not sorted_samples:
        raise ValueError("no samples")
    pos = q * (len(sorted_samples) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> Stats:
    """Median, p10/p90 and a distribution-free 95% CI of the median (binomial order statistics)."""
    s = sorted(samples)
    n = len(s)
    half_width = 1.96 * math.sqrt(n) / 2  # ranks n/2 -/+ 1.96 sqrt(n)/2 bracket the median
    lo = max(0, math.floor(n / 2 - half_width))
    hi = min(n - 1, math.ceil(n / 2 + half_width))
    return Stats(statistics.median(s), quantile(s, 0.1), quantile(s, 0.9), s[lo], s[hi], n)


SAMPLE_TARGET_US = 300.0
MAX_ROUND_TRIPS = 32
MAX_GRAPH_ROUND_TRIPS = 64  # a replayed round trip can be ~5 µs: keep samples near the target


def round_trip(backend: All2AllBackend, inputs: RankInputs, cut=None) -> None:
    """One dispatch + combine as every timer runs it; `cut()` (time_halves) runs after each half."""
    d = backend.dispatch(inputs.x, inputs.topk_ids, inputs.topk_weights)
    if cut is not None:
        cut()
    # An engine's experts write their output somewhere anyway: into the backend's own buffer
    # when it offers one (the same write, no staging copy), else into their own tensor.
    out = backend.combine_buffer(d)
    if out is None:
        out = d.x if getattr(d, "x_scale", None) is None else _expert_out_like(backend, d.x)
    backend.combine(out, d)
    if cut is not None:
        cut()


def _expert_out_like(backend: All2AllBackend, received: torch.Tensor) -> torch.Tensor:
    """A stand-in expert output in the activation dtype for quantized payloads: an engine's
    GEMM writes bf16 rows; converting the fp8 rows here would time a cast no engine does."""
    shape = (received.shape[0], backend.shape.hidden)  # [N, H]: NVFP4 rows hold H/2 bytes
    cached = getattr(backend, "_timing_expert_out", None)
    if cached is None or tuple(cached.shape) != shape:
        cached = torch.randn(shape, device=received.device).to(backend.dtype)
        backend._timing_expert_out = cached
    return cached


def _round_trips(backend: All2AllBackend, input_sets: Sequence[RankInputs], first: int, count: int, cut=None) -> None:
    for j in range(first, first + count):
        round_trip(backend, input_sets[j % len(input_sets)], cut)


def _sync(backend: All2AllBackend) -> None:
    if backend.device.type == "cuda":
        torch.cuda.synchronize(backend.device)


def _round_trips_per_sample(backend: All2AllBackend, input_sets: Sequence[RankInputs]) -> int:
    """R such that R round trips take ~SAMPLE_TARGET_US, agreed on by every rank (max)."""
    dist.barrier(group=backend.group)
    _sync(backend)
    t0 = time.perf_counter()
    _round_trips(backend, input_sets, 0, 4)
    _sync(backend)
    one_us = (time.perf_counter() - t0) * 1e6 / 4
    return _agreed_round_trips(backend, one_us, MAX_ROUND_TRIPS)


def _agreed_max(backend: All2AllBackend, value: float) -> float:
    """`value`'s max over the ranks (collective)."""
    agreed = torch.tensor([value], dtype=torch.float64, device=backend.device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=backend.group)
    return float(agreed.item())


def _agreed_round_trips(backend: All2AllBackend, one_us: float, most: int) -> int:
    """R round trips of `one_us` each filling ~SAMPLE_TARGET_US (1..most), the max over ranks."""
    local = max(1, min(most, math.ceil(SAMPLE_TARGET_US / max(one_us, 1e-3))))
    return int(_agreed_max(backend, local))


GRAPH_PROBE_ROUND_TRIPS = 4
LEAD_IN_ROUND_TRIPS = 1  # eager: one untimed round trip before each sample aligns the ranks


def _graph_round_trips_per_sample(backend: All2AllBackend, input_sets: Sequence[RankInputs]) -> int:
    """R for graph replay from the DEVICE time of a captured probe, agreed by every rank (max).

    Not from eager wall time: eagerly a small round trip costs many times its replay (host
    launches), which would give R = 1-2 and leave each sample to the ranks' start skew after
    the barrier (paid once per sample): small-token timings then moved between runs
    (BENCHMARKS.md, "Timing soundness: R under graphs")."""
    probe = torch.cuda.CUDAGraph()
    with torch.cuda.graph(probe):
        _round_trips(backend, input_sets, 0, GRAPH_PROBE_ROUND_TRIPS)
    probe.replay()
    dist.barrier(group=backend.group)
    _sync(backend)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        probe.replay()
    end.record()
    _sync(backend)
    one_us = start.elapsed_time(end) * 1e3 / (3 * GRAPH_PROBE_ROUND_TRIPS)
    del probe
    return _agreed_round_trips(backend, one_us, MAX_GRAPH_ROUND_TRIPS)


def _timed_samples(backend: All2AllBackend, iters: int, reps: int, launch, lead_in) -> tuple[list[float], list[float]]:
    """Run `launch(i)` (R round trips) `iters` times between events; per-round-trip µs.

    Each sample starts with `lead_in()`, untimed round trips queued before the start event:
    the ranks leave the barrier tens of µs apart, and the first round trip of a sample waits
    for the last rank; a round trip completes only when every rank's has, so after the lead-in
    the ranks run in step and the timed round trips carry no start skew. Without it the skew,
    spread over R, moved small-token medians between runs: a property of the host, not of the
    backend, and enough to flip the winner between two close backends (BENCHMARKS.md, "Timing:
    an untimed lead-in before each sample")."""
    cuda = backend.device.type == "cuda"
    if cuda:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    host_us: list[float] = []
    for i in range(iters):
        dist.barrier(group=backend.group)
        _sync(backend)
        lead_in(i)
        t0 = time.perf_counter()
        if cuda:
            starts[i].record()
        launch(i)
        if cuda:
            ends[i].record()
        host_us.append((time.perf_counter() - t0) * 1e6 / reps)
    _sync(backend)
    device_us = [s.elapsed_time(e) * 1e3 / reps for s, e in zip(starts, ends)] if cuda else list(host_us)
    return _max_over_ranks(backend, device_us, host_us)


def time_round_trips(
    backend: All2AllBackend, input_sets: Sequence[RankInputs], *, warmup: int, iters: int
) -> tuple[list[float], list[float]]:
    """Eager: return (device_us, host_us) per sample, per round trip, max over ranks."""
    _round_trips(backend, input_sets, 0, warmup)
    reps = _round_trips_per_sample(backend, input_sets)
    return _timed_samples(
        backend,
        iters,
        reps,
        lambda i: _round_trips(backend, input_sets, i * reps, reps),
        lambda i: _eager_lead_in(backend, input_sets, i * reps),
    )


def _eager_lead_in(backend: All2AllBackend, input_sets: Sequence[RankInputs], first: int) -> None:
    """Untimed round trip(s) on the input set before the sample's first (not the one it uses:
    no warm cache), left queued: the start event runs on the GPU right after them, with the
    ranks in step. A host sync here would let each rank's host wake and launch at its own
    time again, which is the skew the lead-in removes (eager NCCL medians at small T carried
    it: BENCHMARKS.md). Known cost: a backend that reads counts on the host waits there for
    the lead-in, so its host_us includes up to one lead-in / R (at R = 1, about a round trip)."""
    _round_trips(backend, input_sets, first - LEAD_IN_ROUND_TRIPS, LEAD_IN_ROUND_TRIPS)


def time_graph_round_trips(
    backend: All2AllBackend, input_sets: Sequence[RankInputs], *, warmup: int, iters: int
) -> tuple[list[float], list[float]]:
    """CUDA graph: R round trips captured once (rotating the input sets), one replay a sample."""
    assert backend.device.type == "cuda" and backend.graph_capturable
    side = torch.cuda.Stream(backend.device)
    side.wait_stream(torch.cuda.current_stream(backend.device))
    with torch.cuda.stream(side):  # warm-up off the capture stream: compiles kernels, primes pools
        _round_trips(backend, input_sets, 0, max(warmup, len(input_sets)))
    torch.cuda.current_stream(backend.device).wait_stream(side)
    reps = _graph_round_trips_per_sample(backend, input_sets)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _round_trips(backend, input_sets, 0, reps)
    for _ in range(max(1, warmup // reps)):
        graph.replay()
    # the lead-in replays the same graph too: R round trips, no second capture
    return _timed_samples(backend, iters, reps, lambda i: graph.replay(), lambda i: graph.replay())


def _max_over_ranks(
    backend: All2AllBackend, device_us: list[float], host_us: list[float]
) -> tuple[list[float], list[float]]:
    both = torch.tensor([device_us, host_us], dtype=torch.float64, device=backend.device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=backend.group)
    return both[0].tolist(), both[1].tolist()


HEAD_START_CYCLES_PER_US = 2000  # `torch.cuda._sleep` cycles a µs: at or above the SM clocks of H100/H200/B200
HEAD_START_MAX_US = 5000.0


def head_start_us(launch_us: Sequence[float]) -> float:
    """The head start of an eager half: twice the host's longest launch of a half (from its
    start stamp to its cut, measured in an untimed sample) + 20 µs, at most HEAD_START_MAX_US."""
    return min(HEAD_START_MAX_US, 2 * max(launch_us, default=0.0) + 20.0)


class _Cuts:
    """One sample's cuts between its halves (module docstring): called before the first dispatch
    and after every half, 2R + 1 calls. Graph (`captured`): an external CUDA event a call, half i
    from event i to event i + 1. Eager: a call stamps the end of the running half on the stream
    (queued behind its work), drains the device, aligns the ranks (`_align`), queues a spin of
    `head_us` on the device and stamps the start of the next half behind it: the host queues the
    half while the device spins, so the half starts with the host ahead of it, as in a round trip,
    and the device is busy up to it (its clocks as in a round trip, not an idle GPU's). Half i runs
    from its own start to its own end (CUDA events on a GPU, the host clock on CPU, no spin);
    `launch_us[i]` is the host's time from its start stamp to its cut (`head_start_us`)."""

    def __init__(self, backend: All2AllBackend, reps: int, *, captured: bool = False, head_us: float = 0.0) -> None:
        self.backend = backend
        self.reps = reps
        self.captured = captured
        self.cuda = backend.device.type == "cuda"
        self.calls = 2 * reps + 1
        stamps = self.calls if captured else 4 * reps  # eager: a start and an end per half
        self.events = (
            [torch.cuda.Event(enable_timing=True, external=captured) for _ in range(stamps)] if self.cuda else []
        )
        self.host = [0.0] * stamps
        self.launch_us = [0.0] * (2 * reps)
        spin = getattr(torch.cuda, "_sleep", None) if self.cuda and not captured else None
        cycles = int(head_us * HEAD_START_CYCLES_PER_US)
        self._head = (lambda: spin(cycles)) if spin is not None and cycles > 0 else None
        self.next = 0
        self._one = torch.zeros(1, device=backend.device) if not captured else None
        self._queued = 0.0

    def _stamp(self, k: int) -> None:
        if self.cuda:
            self.events[k].record()
        else:
            self.host[k] = time.perf_counter()

    def __call__(self) -> None:
        i = self.next
        if self.captured:
            self._stamp(i)
        else:
            if i > 0:  # the end of half i - 1: queued behind its work, then the device drained
                self._stamp(2 * (i - 1) + 1)
                self.launch_us[i - 1] = (time.perf_counter() - self._queued) * 1e6
                _sync(self.backend)
            if i < self.calls - 1:
                _align(self.backend, self._one)
                if self._head is not None:
                    self._head()  # the device busy while the host queues half i
                self._stamp(2 * i)  # the start of half i
                self._queued = time.perf_counter()
        self.next = (i + 1) % self.calls  # a replayed graph records them again

    def _us(self, a: int, b: int) -> float:
        if self.cuda:
            return self.events[a].elapsed_time(self.events[b]) * 1e3
        return (self.host[b] - self.host[a]) * 1e6

    def halves(self) -> tuple[float, float]:
        """(dispatch, combine) µs per round trip of the completed sample."""
        spans = [self._us(i, i + 1) if self.captured else self._us(2 * i, 2 * i + 1) for i in range(2 * self.reps)]
        return sum(spans[0::2]) / self.reps, sum(spans[1::2]) / self.reps


def _align(backend: All2AllBackend, one: torch.Tensor) -> None:
    """Before an eager half: the device drained (nothing of the other half left running or
    queued) and, at W > 1, the ranks met on the device (a 1-element all_reduce queued on the
    stream, so the half's first event runs once every rank arrived, as the round trip's lead-in
    does)."""
    _sync(backend)
    if dist.get_world_size(backend.group) > 1:
        dist.all_reduce(one, group=backend.group)


def _cut_samples(backend: All2AllBackend, iters: int, launch, lead_in) -> tuple[list[float], list[float]]:
    """`_timed_samples` for cut chains: `launch(i)` runs the sample and returns its `_Cuts`,
    read once the sample completed; (dispatch_us, combine_us) per sample, max over ranks."""
    dispatch_us: list[float] = []
    combine_us: list[float] = []
    for i in range(iters):
        dist.barrier(group=backend.group)
        _sync(backend)
        lead_in(i)
        cuts = launch(i)
        _sync(backend)
        d, c = cuts.halves()
        dispatch_us.append(d)
        combine_us.append(c)
    return _max_over_ranks(backend, dispatch_us, combine_us)


#: Why an eager round trip on a GPU is not split for a backend that synchronises with the host.
HOST_READ_UNSPLIT = (
    "not timed apart: eager on a GPU, its dispatch reads the device from the host, and after that"
    " read the device waits on the host's launches, so a half would carry them"
)


def unsplit_reason(backend: All2AllBackend, graph: bool) -> str:
    """Why `time_halves` cannot split this backend's round trip honestly in this mode ("": it can).

    Eager on a GPU, a backend that reads the device from the host inside its dispatch
    (`reads_host`, never a `graph_capturable` one): after the read the device idles while the
    host launches the rest, so the dispatch half is the host's launch time, and a 200 µs spin
    planted in it read +263 to +525 µs, with nothing a timer could subtract
    (BENCHMARKS.md, "Eager halves: what a host read does"). Graph replay has no host in the
    timed span; CPU ranks time the host itself."""
    if graph or backend.device.type != "cuda" or backend.graph_capturable or not backend.reads_host:
        return ""
    return HOST_READ_UNSPLIT


def time_halves(
    backend: All2AllBackend, input_sets: Sequence[RankInputs], *, warmup: int, iters: int, graph: bool = False
) -> tuple[list[float], list[float]]:
    """Dispatch and combine apart, in the round trip's sample scheme (module docstring):
    (dispatch_us, combine_us) per sample, per round trip, each the max over ranks.
    `graph`: under CUDA-graph replay (capturable backends), else eager launches, each half alone."""
    if not graph:
        _round_trips(backend, input_sets, 0, warmup)
        reps = _round_trips_per_sample(backend, input_sets)
        probe = _Cuts(backend, reps)  # untimed: how long the host takes to queue each half
        probe()
        _round_trips(backend, input_sets, 0, reps, probe)
        _sync(backend)
        head = _agreed_max(backend, head_start_us(probe.launch_us) if probe.cuda else 0.0)

        def eager(i: int) -> _Cuts:
            cuts = _Cuts(backend, reps, head_us=head)
            cuts()
            _round_trips(backend, input_sets, i * reps, reps, cuts)
            return cuts

        return _cut_samples(backend, iters, eager, lambda i: None)  # each half starts aligned: no lead-in
    assert backend.device.type == "cuda" and backend.graph_capturable
    reps = _graph_round_trips_per_sample(backend, input_sets)
    cuts = _Cuts(backend, reps, captured=True)
    graph_ = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph_):
        cuts()
        _round_trips(backend, input_sets, 0, reps, cuts)
    for _ in range(max(1, warmup // reps)):
        graph_.replay()
    return _cut_samples(backend, iters, lambda i: (graph_.replay(), cuts)[1], lambda i: graph_.replay())
